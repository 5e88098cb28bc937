"""``hbench advise``: for a model, GPU, memory for state and traffic, which
organization and settings to use, and why.

Thin: flags -> `hbench.advise.Search` (planned, checked, optionally only
printed with ``--dry-run``) -> `hbench.advise.advise` (capacity grids per
arm, time-bounded) -> the answer's sentences (`analysis.advise.sentences`)
-> ``advise.json``, ``advise.md`` and ``report.html`` in ``--out``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import click

from common.errors import HbenchError
from hbench.commands.capacity import DEFAULT_REQUESTS, _list, _rates
from hbench.commands.grid_flags import grid_fields, grid_options
from hbench.flag_types import FLOAT, INT, PATH

DEFAULT_RATES = "0.5,1,1.5,2,3,4,6,8"


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(dict.fromkeys(int(x) for x in _list(text, what)))
    except ValueError:
        raise HbenchError(f"--{what} takes whole numbers, got {text!r}") from None
    if min(values) < 1:
        raise HbenchError(f"--{what} must all be >= 1, got {text!r}")
    return values


def _floats(text: str, what: str, inside, words: str) -> tuple[float, ...]:
    """A comma list of finite numbers for ``--what``, each ``inside(v)``
    (``words`` says the range), duplicates dropped."""
    from common.numbers import parse_float

    values = tuple(dict.fromkeys(parse_float(x, f"--{what}", finite=True)
                                 for x in _list(text, what)))
    if not all(inside(v) for v in values):
        raise HbenchError(f"--{what} must all be in {words}, got {text!r}")
    return values


@click.command("advise", context_settings={"max_content_width": 100})
@click.option("--model", default="falcon-h1-7b", show_default=True,
              help="A preset (hbench geometry --help lists them).")
@click.option("--config", "config_path", type=click.Path(), default=None,
              help="A hybrid model's config.json instead of a preset (model_type falcon_h1, "
                   "bamba, granitemoehybrid, jamba or nemotron_h).")
@click.option("--gpu", default="a100-pcie-40gb", show_default=True,
              help="The GPU whose cost model prices every step: a preset (hbench hardware) or "
                   "a profile from hbench calibrate.")
@click.option("--budget", default="b83", show_default=True,
              help="Memory for state (attention KV and recurrent state), the same bytes for every "
                   "organization: a size such as 55GiB, or the study's bN / Np labels.")
@click.option("--workload-kind", type=click.Choice(["sharegpt", "multiturn"]), default="sharegpt",
              show_default=True, help="Traffic: ShareGPT prompts with shared contexts (the "
                                      "study's), or multi-turn chat sessions.")
@click.option("--slo", default="ttft_p99<=2s", show_default=True,
              help="Run-level limits, comma list of METRIC_pQ<=VALUE(s|ms), metric ttft/tpot/itl/e2e.")
@click.option("--rates", default=DEFAULT_RATES, show_default=True,
              help="Arrival rates to search, req/s (sessions/s for multiturn).")
@click.option("--orgs", default=None,
              help="Organizations to search [default: every one the model has state for].")
@click.option("--caps", default="63", show_default=True,
              help="Running caps to search (vLLM max-num-seqs, SGLang max-running-requests).")
@click.option("--d0-attn-fractions", default="0.5", show_default=True,
              help="D0/E0: shares of the bytes for attention to search.")
@click.option("--headrooms", default=None,
              help="Admission headrooms f to search, e.g. 0,0.19 (a fraction of the pages kept "
                   "free at admission) [default: every run's own, 0].")
@click.option("--ckpt-policies", default=None,
              help="Checkpoint policies to search, PUBLISH[/EVICT] comma list, e.g. "
                   "every,marconi,every/utility [default: every/lru, the study's].")
@click.option("--at-rate", type=FLOAT, default=None,
              help="Your traffic's rate: run every arm at this one rate and compare what they "
                   "serve there (throughput when a queue grows, else the SLO's latency), as the "
                   "study compares organizations at a working point; no capacity search.")
@click.option("--seeds", default="1-3", show_default=True, help="Paired seeds, e.g. 1-3.")
@click.option("--requests", type=INT, default=DEFAULT_REQUESTS, show_default=True,
              help="Requests (sessions for multiturn) per run.")
@click.option("--set", "extra", multiple=True, metavar="KEY=VALUE",
              help="Any other RunConfig field for every run (repeatable), e.g. --set headroom=0.1.")
@grid_options
@click.option("--time-budget", default=None,
              help="Stop starting new arms after this long (90s, 20m, 1.5h) and answer with what "
                   "ran; finished cells are kept and a repeated call reuses them.")
@click.option("--dry-run", is_flag=True,
              help="Print the planned arms and cells and an estimate of the time (one cell is "
                   "run in a scratch directory to time it); run nothing else.")
@click.option("--alpha", type=FLOAT, default=0.05, show_default=True,
              help="Significance level of the margin and the intervals' level (1 - alpha).")
@click.option("--out", type=PATH, default=Path("results/advise"), show_default=True,
              help="Sweep directory (cells are reused) and where advise.json, advise.md and "
                   "report.html go.")
@click.option("--jobs", "-j", type=INT, default=1, show_default=True, help="Parallel worker processes.")
@click.option("--json", "as_json", is_flag=True, help="Print advise.json instead of sentences.")
@click.pass_context
def advise(ctx, model, config_path, gpu, budget, workload_kind, slo, rates, orgs, caps,
           d0_attn_fractions, headrooms, ckpt_policies, at_rate, seeds, requests, extra,
           time_budget, dry_run, alpha, out, jobs, as_json, **grid):
    """Which organization and settings to use for a model, GPU, memory and traffic.

    \b
    Example:
      hbench advise --model falcon-h1-7b --gpu h100-sxm --budget 55GiB \\
                    --workload-kind multiturn --slo 'ttft_p99<=2s'

    Every organization (and each --caps / --d0-attn-fractions setting) is an
    arm; each arm's capacity is the largest rate whose runs hold the SLO at
    that rate and every lower one, per seed, as in hbench capacity. The
    answer names the arm with the most capacity, its margin over the best
    arm of another organization (seed-paired, with its interval and test),
    what limits it (the SLO term that fails first and, for TTFT, whether
    requests waited for the running cap, for memory, for the step's token
    budget, or for compute), and the vLLM and SGLang settings that realize
    it or come closest. When the cap limits, the two leading organizations
    (all, when they are level) are also tried at twice the cap; when nothing
    fails at the top rate, the rate grid is widened once.

    With --at-rate the arms run at that rate only and the answer compares
    them there by the seed-paired ratio: on throughput when some run's queue
    grew (the rate each sustains), otherwise on the SLO's latency.
    """
    from analysis.capacity import parse_slo
    from harness.grid import parse_values
    from hbench.advise import (
        Search,
        check,
        parse_ckpt_policy,
        parse_duration,
        pending_cells,
        seconds_per_cell,
    )
    from hbench.flag_once import set_fields
    from hbench.flag_rules import check_flags, typed_flags
    from hbench.paths import check_writable_dir

    if not 0 < alpha < 1:
        raise HbenchError(f"--alpha must be in (0, 1), got {alpha}")
    if at_rate is not None and not (math.isfinite(at_rate) and at_rate > 0):
        raise HbenchError(f"--at-rate must be > 0 req/s, got {at_rate}")
    limits = parse_slo(slo)
    budget_seconds = parse_duration(time_budget)
    base = {"model": model, "gpu": gpu, "budget": budget, "workload_kind": workload_kind,
            "requests": requests, **grid_fields(grid)}
    if config_path is not None:
        from common.input_files import check_input_file

        check_input_file(Path(config_path), "--config")
        base["config_path"] = str(config_path)
    given = {k: v for k, v in typed_flags(ctx).items() if k != "extra"}
    for name, value in set_fields(extra, given).items():
        base[name] = value
    for flag, fields in (("--headrooms", ("headroom",)),
                         ("--ckpt-policies", ("ckpt_publish", "ckpt_evict"))):
        named = [f for f in fields if f in base]
        if named and (headrooms if flag == "--headrooms" else ckpt_policies):
            raise HbenchError(f"{flag} searches {' and '.join(fields)}; drop --set "
                              f"{named[0]}=... (or drop {flag})")
    org_list = tuple(_list(orgs, "orgs")) if orgs else _default_orgs(base)
    search = Search(org_list, _ints(caps, "caps"), _floats(d0_attn_fractions, "d0-attn-fractions", lambda v: 0 < v < 1, "(0, 1)"),
                    tuple(_rates(rates)), tuple(int(s) for s in parse_values("seed", seeds)),
                    limits, base, alpha,
                    headrooms=_floats(headrooms, "headrooms", lambda v: 0 <= v < 1, "[0, 1)")
                    if headrooms else (None,),
                    ckpts=tuple(dict.fromkeys(parse_ckpt_policy(x)
                                              for x in _list(ckpt_policies, "ckpt-policies")))
                    if ckpt_policies else (None,),
                    at_rate=at_rate)
    check(search)
    check_flags({k: v for k, v in given.items() if k in ("model", "gpu", "budget", *grid)},
                [search.configs(arm)[0] for arm in search.arms()])
    check_writable_dir(out)
    arms = search.arms()
    todo, done = pending_cells(search, out, arms)
    if dry_run:
        per = seconds_per_cell(search) if todo else 0.0
        click.echo(f"{len(arms)} arms x {len(search.grid_rates)} rates x {len(search.seeds)} seeds = "
                   f"{todo + done} cells under {out} ({done} already there)")
        for arm in arms:
            click.echo(f"  {arm.label}")
        follow = "" if at_rate is not None else \
            " (a run at twice the cap may follow when the cap limits)"
        click.echo(f"one cell took {per:.1f} s here: about {_minutes(todo * per / max(jobs, 1))} "
                   f"for the {todo} to run with --jobs {jobs}{follow}")
        return
    from hbench.advise import advise as run_advise
    from hbench.progress import progress_bar

    with progress_bar() as update:
        result = run_advise(search, out, jobs=jobs, time_budget_s=budget_seconds,
                            on_arm=lambda i, total, arm: update(f"arm {arm.label}", i, total))
    doc = write_advice(result, out, slo)
    if as_json:
        click.echo(json.dumps(doc, indent=1, default=float))
        return
    for line in doc["answer"]:
        click.echo(line)
    click.echo("")
    click.echo("What to deploy:")
    for line in doc["deploy"]:
        click.echo(f"  {line}")
    click.echo("Check it on your server:")
    for line in doc["checks"]:
        click.echo(f"  {line}")
    click.echo(f"wrote {out}/advise.json, {out}/advise.md and {out}/report.html")


def _base_config(base: dict):
    """Every run's fields as a `RunConfig`, ``--set``'s text typed and checked
    as a capacity grid types it (`harness.grid.expand`)."""
    from harness.grid import expand

    return expand([{}], base)[0]


def _default_orgs(base: dict) -> tuple[str, ...]:
    from harness.budget import applicable_orgs
    from harness.model_configs import geometry_for_run

    return applicable_orgs(geometry_for_run(_base_config(base)))


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def write_advice(result, out: Path, slo: str) -> dict:
    """advise.json, advise.md and report.html from an `hbench.advise.Advice`."""
    from analysis.advise_report import advice_html, advice_markdown
    from common.atomic import atomic_write_text

    search = result.search
    doc = {
        "asked": {k: v for k, v in search.base.items()} | {
            "slo": slo, "rates": list(search.grid_rates), "seeds": list(search.seeds),
            "orgs": list(search.orgs), "caps": list(search.caps),
            "d0_attn_fractions": list(search.fractions),
            "headrooms": [h for h in search.headrooms if h is not None],
            "ckpt_policies": [c for c in search.ckpts if c is not None],
            "at_rate": search.at_rate, "rate_unit": _unit(search.base)},
        "answer": _answer(result, slo),
        "best": _clean(result.decision.best),
        "runner_up": _clean(result.decision.runner_up),
        "margin": _margin(result.decision),
        "limit": {"kind": result.limit.kind, "words": result.limit.words,
                  "failed_terms": list(result.limit.failed_terms),
                  "votes": dict(result.limit.votes), "ttft_parts_s": dict(result.limit.parts_s),
                  "rate": result.limit.rate},
        "arms": [_clean(r) for r in result.table.to_dict("records")],
        "arms_run": [a.label for a in result.arms_run],
        "arms_planned": [a.label for a in result.arms_planned],
        "stopped": result.stopped,
        "probe": result.probe,
        "smaller_budget": _smaller(result.smaller),
        "deploy": [d.line() for d in result.deploy],
        "checks": result.checks,
        "cells": [_clean(r) for r in result.cells.drop(columns=["run_dir"]).to_dict("records")],
    }
    if result.stopped:
        doc["answer"].append(f"The search stopped early: {result.stopped}; run the same command "
                             "again to finish it (finished cells are reused).")
    atomic_write_text(out / "advise.json", json.dumps(doc, indent=1, default=float) + "\n")
    atomic_write_text(out / "advise.md", advice_markdown(doc))
    atomic_write_text(out / "report.html", advice_html(doc, result.table))
    return doc


def _answer(result, slo: str) -> list[str]:
    from analysis.advise import point_sentences, sentences

    search = result.search
    common = {"slo": slo, "alpha": search.alpha, "setting": _setting(search.base),
              "unit": _unit(search.base), "peak": _peak(result), "grid": _grid_words(result)}
    if search.at_rate is not None:
        return point_sentences(result.decision, result.limit, rate=search.at_rate, **common)
    from analysis.advise import smaller_words
    from hbench.advise import level_at_best_cap

    out = sentences(result.decision, result.limit, top_rate=max(search.rates),
                    first=result.first, level=level_at_best_cap(result.table, result.decision),
                    **common)
    if result.smaller is not None:
        out.insert(-1 if common["grid"] else len(out),
                   smaller_words(result.smaller, search.alpha, common["unit"]))
    return out


def _margin(d) -> dict:
    """The best arm against the runner-up: a capacity difference in req/s, or
    at one rate the ratio of the compared metric in percent."""
    if hasattr(d, "effect_pct"):
        return {"metric": d.metric, "effect_pct": d.effect_pct, "ci_low_pct": d.ci_low_pct,
                "ci_high_pct": d.ci_high_pct, "p": d.p, "significant": d.significant,
                "seeds": d.n}
    return {"diff_req_s": d.diff, "ci_low": d.ci_low, "ci_high": d.ci_high, "p": d.p,
            "significant": d.significant}


def _smaller(smaller: dict | None) -> dict | None:
    """The level organizations on less memory, for advise.json."""
    if smaller is None or "refused" in smaller:
        return smaller
    return {"budget": smaller["budget"], "share": smaller["share"], "level": smaller["level"],
            "arms": [_clean(r) for r in smaller["table"].to_dict("records")]}


def _clean(row):
    if row is None:
        return None
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}


def _unit(base: dict) -> str:
    return "sessions/s" if base.get("workload_kind") == "multiturn" else "req/s"


def _setting(base: dict) -> str:
    model = Path(base["config_path"]).name if base.get("config_path") else base["model"]
    return (f"For {model} on {base['gpu']} with {base['budget']} for state and "
            f"{base['workload_kind']} traffic")


def _peak(result) -> tuple[float, float] | None:
    """(peak state bytes, bytes given) of the best arm's runs at each seed's
    capacity (at its one rate, with --at-rate)."""
    from analysis.advise import runs_at_capacity, state_peak_bytes
    from harness.results import read_run

    best = result.decision.best["arm"]
    cells = result.cells
    dirs = (list(cells[cells["arm"] == best]["run_dir"]) if result.search.at_rate is not None
            else runs_at_capacity(cells, best))
    runs = [read_run(Path(d)) for d in dirs]
    if not runs:
        return None
    return (max(state_peak_bytes(r.summary, r.manifest.get("weights_bytes", 0)) for r in runs),
            max(float(r.manifest["budget"]["allocated_whole_model_bytes"]) for r in runs))


def _grid_words(result) -> str:
    """Which pages and grids the runs used, and where they came from."""
    from harness.run_grid import grid_record, grid_words
    from hbench.advise import best_config

    best = result.decision.best["org"]
    setup = result.search.setup(best_config(result.search, result.arms_run, result.decision))
    words = grid_words(grid_record(setup.grid, setup.layout, setup.config.grid_from))
    return (f"Pages: {best.upper()} ran with {words}; every arm's grid: "
            f"{setup.grid.describe(with_origin=False)}. A real engine picks its own "
            "(--grid-from vllm or sglang runs an engine's shape).")
