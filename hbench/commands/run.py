"""``hbench run``: one serving run of one organization at one budget.

Thin: flags -> `RunConfig` (validated once) -> `hbench.runner.execute` ->
summary table. The run directory it prints holds everything needed to trace
and rerun the result (see README "What each number means").
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import click

from adapters.registry import ENGINES
from common.errors import HbenchError, HbenchFailure
from common.metric_labels import SUMMARY_ROWS
from harness.config import ADMISSIONS, COMPUTE_DTYPES, GRID_FIELDS, ORG_NAMES, RunConfig
from harness.layout import PAGINGS
from harness.orgs.evict_policy import EVICT_POLICIES
from harness.orgs.publish_policy import PUBLISH_POLICIES
from hbench.commands.grid_flags import grid_fields, grid_options
from hbench.commands.workload import multiturn_options
from hbench.flag_rules import check_flags, typed_flags
from hbench.flag_types import FLOAT, INT, FloatOr
from hbench.paths import check_writable_dir
from workloads.sharegpt.arrivals import ARRIVALS

if TYPE_CHECKING:
    from rich.console import Console

    from harness.run_setup import RunSetup

D = RunConfig()


def _fmt(v, scale) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    x = v * scale
    return f"{x:,.0f}" if abs(x) >= 1000 or float(x).is_integer() else f"{x:,.2f}"


def print_summary(console: Console, run_dir, summary: dict, manifest: dict) -> None:
    from rich.table import Table

    from harness.results import org_expression
    from harness.run_grid import grid_words
    from harness.validity import describe_validity, failed_details, valid_as

    cfg = manifest["config"]
    grid = grid_words(manifest.get("grid"))
    t = Table(title=f"{cfg['org'].upper()} @ {manifest['budget']['label']}  "
                    f"({cfg['engine']}, {cfg['rate']} req/s, q={cfg['q']}, seed {cfg['seed']}"
                    + (f"; grid: {grid}" if grid else "") + ")")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_column("unit")
    for key, label, scale, unit in SUMMARY_ROWS:
        if key not in summary:
            continue
        t.add_row(label, _fmt(summary.get(key), scale), unit)
    t.add_row("validity", describe_validity(summary, detail=False), "")
    console.print(t)
    expression = org_expression(manifest)
    if expression and cfg["org"] != "s0":
        console.print(f"{cfg['org'].upper()} on {cfg['engine']} is {expression}.",
                      highlight=False, soft_wrap=True)
    for line in failed_details(summary):
        console.print(f"  {line}", highlight=False)
    if valid_as(summary):
        console.print(valid_as(summary), highlight=False, soft_wrap=True)
    step = next_step(summary, cfg)
    if step:
        console.print(step, highlight=False, soft_wrap=True)
    console.print(f"results: {run_dir}")


#: Checks a lower arrival rate can fix: the queue kept growing, or the
#: delivered load or its process was not the one asked for.
_LOAD_CHECKS = ("overload", "arrival_rate", "arrival_process")


def next_step(summary: dict, cfg: dict) -> str:
    """One line for a run that is not valid: why, and the command to run
    next ("" for a valid run). A load the arm cannot carry points at
    ``hbench capacity`` over rates up to this one, with every other setting
    of the run (`hbench.suggest.capacity_command`), or says which setting
    such a search could not keep."""
    v = summary.get("validity") or {}
    reasons = list(v.get("reasons", []))
    if v.get("valid", True) or not reasons:
        return ""
    why = _why_not_valid(reasons, cfg)
    if not any(r in _LOAD_CHECKS for r in reasons):
        return f"{why}: its numbers do not describe the configuration; fix the checks above and rerun"
    from hbench.suggest import capacity_command

    rate = float(cfg["rate"])
    step = capacity_command(cfg, [rate * k / 4 for k in range(1, 5)])
    if step.command is None:
        return (f"{why}; hbench capacity cannot search rates with this run's "
                f"{'; '.join(step.uncarried)}")
    return f"{why}; find the rates it sustains in a steady state with: {step.command}"


def _why_not_valid(reasons: list[str], cfg: dict) -> str:
    """The words of `next_step` before its command: which checks failed and,
    for a load check, what that says about the arm."""
    why = f"not valid ({', '.join(reasons)})"
    if not any(r in _LOAD_CHECKS for r in reasons):
        return why
    if reasons == ["overload"]:   # only latency is spoiled (harness.validity, validity per metric)
        return (f"latency not valid (overload): {cfg['rate']} req/s is more than {cfg['org'].upper()} "
                f"at {cfg['budget']} sustains in a steady state, so its throughput is the sustained "
                "service rate and its latency percentiles measure the run's length")
    what = (f"{cfg['rate']} req/s is more than {cfg['org'].upper()} at {cfg['budget']} sustains in a "
            "steady state" if "overload" in reasons else "the load it got is not the load it asked for")
    return f"{why}: {what}"


@click.command(context_settings={"max_content_width": 100})
@click.option("--org", type=click.Choice(ORG_NAMES, case_sensitive=False), default=D.org, show_default=True,
              help="Memory organization: s0 coarse shared pages, s1 paged checkpoints, "
                   "s2 conv-slot packing, d0 native dual pools."
                   " On --engine vllm, s1/s2 are the study's allocator policy at vLLM's page "
                   "size (docs/engines.md).")
@click.option("--budget", default=D.budget, show_default=True,
              help="State memory: bN = N checkpoint-sized pages per layer (b63, b83, b108), "
                   "Np = N of the organization's pages (254p), or a whole-model size (12GiB).")
@click.option("--engine", type=click.Choice(sorted(ENGINES)), default=D.engine, show_default=True,
              help="sim: the embedded simulator (no GPU); vllm/sglang: a real server; "
                   "torch: in-process PyTorch engine over real page pools.")
@click.option("--model", default=D.model, show_default=True,
              help="Model preset (see hbench geometry); torch engine: a model directory.")
@click.option("--config", "config_path", type=click.Path(), default=None,
              help="A Hugging Face config.json instead of the preset (model_type falcon_h1, "
                   "bamba, granitemoehybrid, jamba or nemotron_h; llama, mistral, qwen2, qwen3 "
                   "for the ledger only; an hbench_grid key declares its grid).")
@click.option("--gpu", default=D.gpu, show_default=True,
              help="Simulated hardware: a preset (see hbench hardware) or a measured "
                   "cost profile file from hbench calibrate (profile.json).")
@click.option("--ssm-dtype", "ssm_state_dtype", default=D.ssm_state_dtype, show_default=True,
              help="SSM state dtype (bf16 or fp32).")
@click.option("--d0-attn-fraction", type=FLOAT, default=D.d0_attn_fraction, show_default=True,
              help="D0: share of the budget given to the attention pool (fixed at start).")
@click.option("--paging", type=click.Choice(PAGINGS), default=None,
              help="How pages are laid out: the study's page sizes (sim, torch), vLLM's "
                   "blocks as its CPU build resolves them (vllm; on sim: the blocks and rules "
                   "of a vLLM run at this budget, to compare with it) or as a CUDA vLLM does "
                   "(vllm-gpu: vLLM's scheduler in process). Default: the engine's own.")
@grid_options
@click.option("--rate", type=FLOAT, default=D.rate, show_default=True, help="Arrivals per second.")
@click.option("--arrival", type=click.Choice(list(ARRIVALS)), default=D.arrival, show_default=True)
@click.option("--burstiness", type=FLOAT, default=D.burstiness, show_default=True,
              help="Gamma arrivals: squared coefficient of variation of the gaps.")
@click.option("--q", type=FLOAT, default=D.q, show_default=True,
              help="Shared-prefix fraction (0 = no-share control, same lengths).")
@click.option("--requests", type=INT, default=D.requests, show_default=True)
@click.option("--duration", "duration_s", type=FLOAT, default=None,
              help="Generate arrivals for this many seconds instead of --requests.")
@click.option("--contexts", type=INT, default=D.contexts, show_default=True,
              help="Number of shared contexts.")
@multiturn_options
@click.option("--mean-input", type=INT, default=D.mean_input, show_default=True,
              help="Target mean prompt length in tokens (the study's working point: 3332).")
@click.option("--max-model-len", type=INT, default=D.max_model_len, show_default=True)
@click.option("--max-output", type=INT, default=D.max_output, show_default=True)
@click.option("--cap", type=INT, default=D.cap, show_default=True,
              help="Maximum running requests.")
@click.option("--token-budget", type=INT, default=D.token_budget, show_default=True,
              help="Tokens per engine step (prefill chunks plus decodes).")
@click.option("--headroom", type=FLOAT, default=D.headroom, show_default=True,
              help="Admission headroom f: floor(f x pages) must stay free after admitting "
                   "(while another request runs, as vLLM's watermark).")
@click.option("--admission", type=click.Choice(ADMISSIONS), default=D.admission,
              show_default=True,
              help="What must fit for a waiting request to start: its first chunk (the study) "
                   "or its whole input (vLLM's scheduler_reserve_full_isl).")
@click.option("--retention/--no-retention", default=D.retention, show_default=True,
              help="Retain a running producer's demanded checkpoints.")
@click.option("--retention-threshold", type=INT, default=D.retention_threshold, show_default=True,
              help="Distinct requests that must want a prefix before it is retained.")
@click.option("--isolate", is_flag=True, help="ISOLATE: a unique cache salt per request.")
@click.option("--ckpt-publish", type=click.Choice(tuple(PUBLISH_POLICIES)), default=D.ckpt_publish,
              show_default=True,
              help="Where checkpoints are published: every grid boundary (the study), every "
                   "k-th (--ckpt-every-k), or marconi: a prefix's branch point among the "
                   "requests seen so far and each request's last boundary.")
@click.option("--ckpt-every-k", type=INT, default=D.ckpt_every_k, show_default=True,
              help="With --ckpt-publish every-k: publish at every k-th grid boundary.")
@click.option("--ckpt-evict", type=click.Choice(tuple(EVICT_POLICIES)), default=D.ckpt_evict,
              show_default=True,
              help="Which cached checkpoint is evicted: lru (the study) or utility (Marconi: "
                   "alpha x normalized FLOPs saved per byte + normalized recency, lowest first).")
@click.option("--utility-alpha", type=FloatOr("auto", lo=0.0), default=D.utility_alpha,
              show_default=True,
              help="With --ckpt-evict utility: the weight alpha of FLOPs saved against recency, "
                   "or auto: tuned online as Marconi does (recency only until 5 x the "
                   "requests seen before the first eviction, then the alpha in 0..2 whose "
                   "replay of those requests saved the most FLOPs).")
@click.option("--seed", type=INT, default=D.seed, show_default=True)
@click.option("--workload", "workload_path", type=click.Path(), default=None,
              help="Serve a saved workload (hbench workload build) instead of building one; "
                   "the workload flags above (and --seed) are then refused.")
@click.option("--warmup", "warmup_requests", type=INT, default=0, show_default=True,
              help="Warm-up requests served first and excluded from every metric.")
@click.option("--endpoint", default=None, help="Real engines: URL of a running server.")
@click.option("--launch", is_flag=True, help="Real engines: start the server and stop it after.")
@click.option("--server-cmd", default=None, help="Real engines: the command that starts the server.")
@click.option("--device", default=D.device, show_default=True,
              help="torch engine: cpu (float32) or cuda[:N] (bfloat16).")
@click.option("--dtype", type=click.Choice(COMPUTE_DTYPES), default=D.dtype,
              show_default=True, help="torch engine: compute dtype (auto: cpu fp32, cuda bf16).")
@click.option("--poison", is_flag=True,
              help="torch engine: fill every freed or invalidated page with NaN, so a read "
                   "of storage the organization handed away fails the run.")
@click.option("--debug-invariants", is_flag=True,
              help="Check every organization invariant after every step (slow).")
@click.option("--allow-oversubscribe", is_flag=True,
              help="Simulate even if weights plus state exceed the simulated GPU's memory.")
@click.option("--out", default="results", show_default=True, type=click.Path(),
              help="Results root; the run goes into OUT/<run-id>/.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.pass_context
def run(ctx, out, as_json, allow_oversubscribe, **flags):
    """Serve one ShareGPT-derived workload under one memory organization.

    \b
    Example (the study's working point, simulated A100, Falcon-H1-7B):
      hbench run --org s2 --budget b83 --rate 3 --requests 240 --seed 1

    Writes OUT/<run-id>/ with manifest.json (config, seed, workload hash, git
    commit, versions, resolved pages), requests.parquet, steps.parquet and
    summary.json, then prints the summary. Bad input is refused before any
    work (see hbench.runner.validate_run).
    """
    # Imported here, not at the top, so that `hbench --help` and `hbench run
    # --help` load none of what a run needs (pandas, through the results).
    from harness.results import clean_stale, read_run
    from hbench.runner import execute, validate_run

    # The simulator takes its geometry from one of them; a real engine serves
    # --model and takes the geometry from --config.
    if (flags["engine"] == "sim" and flags["config_path"]
            and ctx.get_parameter_source("model") is click.core.ParameterSource.COMMANDLINE):
        raise HbenchError("give --model or --config, not both")
    if flags["engine"] == "torch":
        flags["config_path"] = _torch_model_config(flags["model"], flags["config_path"])
    flags = {k: v for k, v in flags.items() if k not in GRID_FIELDS} | grid_fields(flags)
    config = RunConfig(**flags)
    check_flags(typed_flags(ctx), [config])
    check_writable_dir(out)
    setup = validate_run(config, allow_oversubscribe=allow_oversubscribe)
    clean_stale(out)
    if as_json:   # a script reads stdout: no spinner or progress bar (nor their imports)
        run_dir = execute(config, out, allow_oversubscribe=allow_oversubscribe, setup=setup)
    else:
        run_dir = _execute_with_progress(setup, out, allow_oversubscribe)
    data = read_run(run_dir)
    summary = data["summary"]
    if as_json:
        click.echo(json.dumps({"run_dir": str(run_dir), **summary}, indent=2))
    else:
        from rich.console import Console

        print_summary(Console(), run_dir, summary, data["manifest"])
    if summary["failed"]:
        req = data["requests"]
        first = req.loc[req["status"] == "failed", "error"].iloc[0]
        raise HbenchFailure(f"{summary['failed']} of {summary['requests']} requests failed "
                          f"(results kept in {run_dir}); first error: {first[:200]}")


def _execute_with_progress(setup: RunSetup, out, allow_oversubscribe: bool) -> Path:
    """`hbench.runner.execute` of the validated ``setup`` with a spinner while
    the workload is built and a progress bar, titled with the run and its
    grid, while it is served (on stderr, gone when done)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from harness.run_grid import grid_record, grid_words
    from harness.run_workload import build_run_workload
    from hbench.runner import execute

    config = setup.config
    console = Console(stderr=True)
    with console.status("building workload"):
        workload = build_run_workload(config)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        # the run's title while it runs; a refusal stays the only line printed
        words = grid_words(grid_record(setup.grid, setup.layout, config.grid_from))
        task = bar.add_task(f"{config.engine}:{config.org}@{config.budget}, grid: {words}",
                            total=workload.total_requests)
        return execute(config, out, workload=workload, allow_oversubscribe=allow_oversubscribe,
                       progress=lambda n: bar.update(task, completed=n), setup=setup)


def _torch_model_config(model: str, config_path: str | None) -> str:
    """The torch engine serves the model directory ``--model``; its geometry
    comes from that directory's config.json unless ``--config`` names one."""
    path = Path(model)
    if not (path / "config.json").is_file():
        raise HbenchError(f"--engine torch needs --model DIR, a model directory with config.json "
                          f"and model.safetensors (hbench tiny-model writes one); got {model!r}")
    return config_path or str(path / "config.json")
