"""``hbench verify``: does prefix reuse change what a real engine generates?

Thin: flags -> `hbench.verify_pressure.verify_pressure` (``--engine vllm
--launch``: stock vLLM and each plugin organization at a binding block
budget, compared token for token, plus each organization's negative control),
`hbench.verify.verify_server` (a running server, or another engine launched:
each prompt as a prefix-cache hit and as a clean recompute) or
`adapters.torch.continuation.verify_continuation` (the in-process torch
engine against cold runs) -> one line per check. Exit 0 when everything is
identical, 1 when anything diverges. A run that proved nothing (the hit
reused nothing, memory did not bind, no preempted request resumed from a
pinned hit, a negative control did not diverge) is an error.
"""

from __future__ import annotations

import click

from adapters.registry import ENGINES
from common.errors import HbenchError
from harness.config import ORG_NAMES
from hbench.flag_types import INT, Int

#: Every registered engine but the simulator, which computes no tokens to check.
REAL_ENGINES = sorted(name for name in ENGINES if name != "sim")


@click.command("verify")
@click.option("--engine", "engine_name", default="vllm", show_default=True,
              type=click.Choice(REAL_ENGINES),
              help="Engine to check: a real server, or the in-process torch engine.")
@click.option("--org", "orgs", type=click.Choice(ORG_NAMES, case_sensitive=False), multiple=True,
              help="torch engine: the organization (default s2). vllm --launch: the plugin "
                   "organizations compared with stock vLLM (repeat; default s1, s2, d0; s0 "
                   "alone: stock only). Another engine's --launch: the one it serves.")
@click.option("--blocks", type=Int(3), default=None,
              help="vllm --launch: vLLM blocks for every server (default: per organization, "
                   "the count at which 3 of the 4 concurrent requests fit at their peak).")
@click.option("--control/--no-control", default=True, show_default=True,
              help="vllm --launch: also serve each organization's negative control (D0 with "
                   "aliased block ids, S1/S2 with aliased states), which must change outputs "
                   "(else the check cannot fail).")
@click.option("--budget", default=None,
              help="torch engine: budget label (default: the organization's verify point, "
                   "scaled to the model: the smallest page count at which the simulator "
                   "adopts a checkpoint and preempts).")
@click.option("--device", default="cpu", show_default=True, help="torch engine: cpu or cuda[:N].")
@click.option("--seed", type=INT, default=0, show_default=True, help="torch engine: workload seed.")
@click.option("--endpoint", default=None, help="A running server, e.g. http://127.0.0.1:8000.")
@click.option("--launch", is_flag=True, help="Start the server (needs --model DIR), stop it after.")
@click.option("--model", default=None, help="Model directory (with --launch) or served model id.")
@click.option("--server-cmd", default=None, help="Server command for --launch ({port} {model}).")
@click.option("--prompts", "n_prompts", default=4, show_default=True, type=Int(1, 64),
              help="Hit-vs-recompute prompts (per server with vllm --launch).")
@click.option("--output-len", default=16, show_default=True, type=Int(1, 4096),
              help="Tokens each hit-vs-recompute request generates.")
@click.option("--prompt-chars", default=2500, show_default=True, type=Int(100),
              help="Characters per text prompt; raise it for models with large cache blocks "
                   "(vllm --launch sends token-id prompts of 1.5 blocks instead).")
@click.pass_context
def verify(ctx, engine_name, orgs, blocks, control, budget, device, seed, endpoint, launch, model,
           server_cmd, n_prompts, output_len, prompt_chars):
    """Greedy outputs served with prefix-cache hits must equal clean recomputes.

    \b
    With --engine torch --model DIR: serves a shared-prefix workload in process
    (adoptions, preemptions, pages poisoned when freed) and compares every
    request with a cold contiguous run of the same prompt, e.g.
      hbench verify --engine torch --org s2 --model ./tiny-prop
    With --engine vllm --launch --model DIR: stock vLLM and the plugin serving
    each organization (s1, s2, d0) take the same concurrent greedy prompts at
    a block budget small for them (preemptions, evictions and a preempted
    request resuming from its pinned hit, read from the servers' counters);
    outputs must equal stock's token for token, each server passes the
    hit-vs-recompute check, and each organization's negative control (D0 with
    aliased block ids, S1/S2 with every state placed on one checkpoint's
    page) must change outputs, e.g.
      hbench verify --engine vllm --launch --model ./tiny-prop
    With --endpoint URL: sends each prompt twice (a prefix-cache hit) and once
    with a unique cache salt (a recompute) to the running server.
    """
    from harness.config import RunConfig
    from hbench.flag_rules import VERIFY_RULES, check_flags, typed_flags

    check_flags(typed_flags(ctx), [RunConfig(engine=engine_name, launch=launch, endpoint=endpoint)],
                VERIFY_RULES)
    if len(orgs) > 1 and not (engine_name == "vllm" and launch):
        raise HbenchError("--org is given once except with --engine vllm --launch")
    if engine_name == "torch":
        verify_torch(orgs[0] if orgs else "s2", model, budget, device, seed)
        return
    if engine_name == "vllm" and launch:
        verify_vllm_pressure(model, endpoint, orgs, blocks, control, n_prompts, output_len,
                             server_cmd)
        return
    org = orgs[0] if orgs else None
    from hbench.verify import refuse_vacuous, verify_server

    checks = verify_server(engine_name, endpoint=endpoint, launch=launch, model=model, org=org,
                           server_cmd=server_cmd, prompts=n_prompts, prompt_chars=prompt_chars,
                           output_len=output_len)
    for c in checks:
        click.echo(c.describe())
    refuse_vacuous(checks)
    divergent = [c for c in checks if not c.identical]
    click.echo(f"{len(checks) - len(divergent)}/{len(checks)} prompts identical with and without "
               "prefix reuse")
    raise SystemExit(1 if divergent else 0)


def verify_vllm_pressure(model: str | None, endpoint: str | None, orgs: tuple[str, ...],
                         blocks: int | None, control: bool, n_prompts: int, output_len: int,
                         server_cmd: str | None) -> None:
    """`hbench.verify_pressure` behind the CLI: one line per server as it
    finishes, then the comparisons; exit 1 on any divergence, an error when
    the run proved nothing."""
    from hbench.verify_pressure import verify_pressure

    if not model:
        raise HbenchError("--launch needs --model DIR")
    if endpoint:
        raise HbenchError("give exactly one of --endpoint URL or --launch --model DIR")
    orgs = tuple(o for o in orgs if o != "s0") if orgs else ("s1", "s2", "d0")
    report = verify_pressure(model, orgs, blocks, control, n_hit_prompts=n_prompts,
                             hit_output_len=output_len, server_cmd=server_cmd,
                             on_run=lambda r: click.echo(f"served {r.describe()}; log "
                                                         f"{r.log_path}"))
    for line in report.lines():
        click.echo(line)
    if report.divergent():
        click.echo("FAIL: outputs differ from stock vLLM or between hit and recompute")
        raise SystemExit(1)
    if why := report.shortfalls():
        for line in why[1:]:
            click.echo(f"proved nothing: {line}")
        raise HbenchError(f"the check proved nothing: {why[0]}")
    click.echo(f"every organization ({', '.join(orgs) or 'stock only'}) matched stock vLLM "
               "under preemption, and every negative control diverged" if control else
               "every organization matched stock vLLM under preemption (no negative control)")
    raise SystemExit(0)


def verify_torch(org: str, model: str | None, budget: str | None, device: str, seed: int) -> None:
    """`adapters.torch.continuation` behind the CLI: exit 0 when every request
    is identical to its cold run, 1 when any diverges."""
    from adapters.torch.continuation import verify_continuation
    from hbench.verify import torch_verify_config

    if not model:
        raise HbenchError("--engine torch needs --model DIR (hbench tiny-model writes one)")
    config = torch_verify_config(org, model, budget, device, seed)
    click.echo(f"{org} at budget {config.budget} (token budget {config.token_budget})")
    report = verify_continuation(config)
    for c in report.checks:
        click.echo(c.describe())
    st = report.stats
    click.echo(f"{org}: {st['adopted_requests']} requests adopted a checkpoint "
               f"({st['adopt_copies']} adopt copies, {st['publish_copies']} publish copies), "
               f"{st['preemptions']} preemptions, {st['poisoned_pages']} pages poisoned")
    if "region_relocations" in st:
        grown, back = st["region_pages_grown"], st["region_pages_given_back"]
        click.echo(f"{org}: region: " + ", ".join(
            f"{pool} pool grew {grown[pool]} pages and gave back {back[pool]}" for pool in grown)
            + f", {st['region_relocations']} pages relocated, "
            f"{st.get('capacity_moves', 0)} capacity moves")
    if not st["adopted_requests"]:
        raise HbenchError("no request adopted a cached checkpoint, so continuation was not "
                          "tested; use longer shared prompts or a larger budget")
    bad = [c for c in report.checks if not c.identical]
    click.echo(f"{len(report.checks) - len(bad)}/{len(report.checks)} requests identical to "
               "a cold run")
    raise SystemExit(1 if bad else 0)
