"""``hbench verify``: does prefix reuse change what a real engine generates?

Thin: flags -> `hbench.verify.verify_server` (a served engine: each prompt as
a prefix-cache hit and as a clean recompute, compared token by token) or
`adapters.torch.continuation.verify_continuation` (the in-process torch
engine against cold runs) -> one line per check. Exit 0 when everything is
identical, 1 when anything diverges. A run where the hit did not reuse
anything proves nothing and is an error.
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
@click.option("--org", type=click.Choice(ORG_NAMES), default=None,
              help="Organization to serve with: torch engine (default s2), or the server "
                   "--launch starts (default: the engine's first, s0 on vLLM).")
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
@click.option("--prompts", "n_prompts", default=4, show_default=True, type=Int(1, 64))
@click.option("--output-len", default=16, show_default=True, type=Int(1, 4096))
@click.option("--prompt-chars", default=2500, show_default=True, type=Int(100),
              help="Characters per prompt; raise it for models with large cache blocks.")
def verify(engine_name, org, budget, device, seed, endpoint, launch, model, server_cmd,
           n_prompts, output_len, prompt_chars):
    """Greedy outputs served with prefix-cache hits must equal clean recomputes.

    \b
    With --engine torch --model DIR: serves a shared-prefix workload in process
    (adoptions, preemptions, pages poisoned when freed) and compares every
    request with a cold contiguous run of the same prompt, e.g.
      hbench verify --engine torch --org s2 --model ./tiny-prop
    With --engine vllm: sends each prompt twice (a prefix-cache hit) and once
    with a unique cache salt (a recompute) to a running or launched server.
    """
    if engine_name == "torch":
        verify_torch(org or "s2", model, budget, device, seed)
        return
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
    if not st["adopted_requests"]:
        raise HbenchError("no request adopted a cached checkpoint, so continuation was not "
                          "tested; use longer shared prompts or a larger budget")
    bad = [c for c in report.checks if not c.identical]
    click.echo(f"{len(report.checks) - len(bad)}/{len(report.checks)} requests identical to "
               "a cold run")
    raise SystemExit(1 if bad else 0)
