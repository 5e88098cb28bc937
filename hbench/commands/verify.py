"""``hbench verify``: does prefix reuse change what a real engine generates?

The study left open whether continuing from a cached state matches a clean
recompute token for token. For each prompt this command sends, greedily and
with ``logprobs=1``:

    1. the prompt once, to put its prefix in the cache (warm-up),
    2. the prompt again: served with a prefix-cache hit,
    3. the prompt with a fresh unique ``cache_salt``: reuse defeated, a clean recompute,

and compares 2 with 3 token by token, reporting the first divergence and the
largest log-probability difference. Exit 0 when every prompt is identical,
1 when any diverges. A run where the hit did not reuse anything proves
nothing and is an error.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import click

from harness.config import ORG_NAMES
from harness.errors import HbenchError
from harness.records import first_divergence


@dataclass(frozen=True)
class PromptCheck:
    prompt_index: int
    hit_cached_tokens: int
    miss_cached_tokens: int
    hit_tokens: tuple[int, ...]
    miss_tokens: tuple[int, ...]
    hit_logprobs: tuple[float, ...]
    miss_logprobs: tuple[float, ...]

    @property
    def first_divergence(self) -> int | None:
        return first_divergence(self.hit_tokens, self.miss_tokens)

    @property
    def identical(self) -> bool:
        return self.first_divergence is None

    @property
    def max_logprob_diff(self) -> float:
        """Largest |logprob(hit) - logprob(miss)| over the positions both generated alike."""
        end = self.first_divergence
        end = len(self.hit_logprobs) if end is None else end
        diffs = [abs(a - b) for a, b in
                 zip(self.hit_logprobs[:end], self.miss_logprobs[:end], strict=False)]
        return max(diffs, default=0.0)

    def describe(self) -> str:
        head = (f"prompt {self.prompt_index}: hit reused {self.hit_cached_tokens} tokens, "
                f"recompute reused {self.miss_cached_tokens}; ")
        d = self.first_divergence
        if d is None:
            return head + (f"{len(self.hit_tokens)} tokens identical, "
                           f"max |dlogprob| {self.max_logprob_diff:.3g}")
        lp = ""
        if d < len(self.hit_logprobs) and d < len(self.miss_logprobs):
            lp = f", logprob {self.hit_logprobs[d]:.4f} vs {self.miss_logprobs[d]:.4f}"
        return head + (f"DIVERGES at output token {d}: {self.hit_tokens[d:d + 1]} vs "
                       f"{self.miss_tokens[d:d + 1]}{lp}")


def default_prompts(n: int = 4, chars: int = 2500) -> list[str]:
    """Prompts long enough for several cache blocks, from the packaged ShareGPT sample
    (texts shorter than ``chars`` are continued with the next ones)."""
    from adapters.tiny_model import sharegpt_texts

    texts = sorted(sharegpt_texts(60), key=len, reverse=True)
    out = []
    for i in range(n):
        text, j = texts[i], i + 1
        while len(text) < chars:
            text += "\n" + texts[(i + j) % len(texts)]
            j += 1
        out.append(text[:chars])
    return out


def _complete(endpoint, model: str, prompt: str, output_len: int, salt: str | None, timeouts):
    from adapters.client.stream import completion_body, stream_completion

    body = completion_body(model, prompt, output_len, salt,
                           {"logprobs": 1, "return_token_ids": True})
    out = stream_completion(endpoint, body, time.perf_counter(), timeouts)
    if not out.success:
        raise HbenchError(f"verify request failed: {out.error}")
    cached = int((out.usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return out, cached


def verify_endpoint(endpoint, model: str, prompts: list[str], output_len: int = 16,
                    timeouts=None) -> list[PromptCheck]:
    """Hit-vs-recompute comparison of every prompt (sequential, one request at a time)."""
    from adapters.client.http import DEFAULT_TIMEOUTS

    timeouts = timeouts or DEFAULT_TIMEOUTS
    checks = []
    for i, prompt in enumerate(prompts):
        _complete(endpoint, model, prompt, output_len, None, timeouts)
        hit, hit_cached = _complete(endpoint, model, prompt, output_len, None, timeouts)
        miss, miss_cached = _complete(endpoint, model, prompt, output_len,
                                      f"hbench-verify-{uuid.uuid4().hex}", timeouts)
        if len(hit.token_ids) != output_len or len(miss.token_ids) != output_len:
            raise HbenchError(f"the server returned {len(hit.token_ids)} and "
                              f"{len(miss.token_ids)} token ids for {output_len} tokens; it must "
                              "support return_token_ids for a token-level comparison")
        checks.append(PromptCheck(
            i, hit_cached, miss_cached, tuple(hit.token_ids), tuple(miss.token_ids),
            tuple(hit.logprobs), tuple(miss.logprobs)))
    return checks


@click.command("verify")
@click.option("--engine", "engine_name", default="vllm", show_default=True,
              type=click.Choice(["vllm", "sglang", "torch"]),
              help="Engine to check: a real server, or the in-process torch engine.")
@click.option("--org", type=click.Choice(ORG_NAMES), default=None,
              help="Organization to serve with: torch engine (default s2), or the server "
                   "--launch starts (default: the engine's first, s0 on vLLM).")
@click.option("--budget", default=None,
              help="torch engine: budget label (default: the organization's verify point).")
@click.option("--device", default="cpu", show_default=True, help="torch engine: cpu or cuda[:N].")
@click.option("--seed", type=int, default=0, show_default=True, help="torch engine: workload seed.")
@click.option("--endpoint", default=None, help="A running server, e.g. http://127.0.0.1:8000.")
@click.option("--launch", is_flag=True, help="Start the server (needs --model DIR), stop it after.")
@click.option("--model", default=None, help="Model directory (with --launch) or served model id.")
@click.option("--server-cmd", default=None, help="Server command for --launch ({port} {model}).")
@click.option("--prompts", "n_prompts", default=4, show_default=True, type=click.IntRange(1, 64))
@click.option("--output-len", default=16, show_default=True, type=click.IntRange(1, 4096))
@click.option("--prompt-chars", default=2500, show_default=True, type=click.IntRange(100),
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
    from adapters.client.http import Endpoint, served_models
    from adapters.registry import make_engine
    from adapters.served_engine import pick_model
    from adapters.server_process import ServerProcess, free_port
    from harness.config import RunConfig

    if launch == bool(endpoint):
        raise HbenchError("give exactly one of --endpoint URL or --launch --model DIR")
    if launch and not model:
        raise HbenchError("--launch needs --model DIR")
    if org and not launch:
        raise HbenchError("--org needs --launch: the organization is set when the server starts")
    prompts = default_prompts(n_prompts, prompt_chars)
    if endpoint:
        ep = Endpoint.parse(endpoint)
        checks = verify_endpoint(ep, pick_model(served_models(ep), model, ep), prompts, output_len)
    else:
        engine = make_engine(engine_name)
        config = RunConfig(org=org or engine.supported_orgs[0], engine=engine_name,
                           model=model, launch=True, cap=8, max_model_len=4096,
                           server_cmd=server_cmd)
        engine.check_config(config)
        port = free_port()
        ep = Endpoint("127.0.0.1", port)
        with ServerProcess(engine.launch_argv(config, port), ep,
                           f"/tmp/hbench-verify-{port}.log", env=engine.launch_env(config),
                           ready_timeout_s=900):
            checks = verify_endpoint(ep, pick_model(served_models(ep), model, ep), prompts,
                                     output_len)
    for c in checks:
        click.echo(c.describe())
    if any(c.hit_cached_tokens == 0 for c in checks):
        raise HbenchError("the cache-hit requests reused no prompt tokens, so nothing was "
                          "verified; is prefix caching on and are the prompts longer than a block?")
    if any(c.miss_cached_tokens for c in checks):
        raise HbenchError("requests with a unique cache_salt still reused prompt tokens, so "
                          "there was no clean recompute to compare with; does the server "
                          "support cache_salt?")
    divergent = [c for c in checks if not c.identical]
    click.echo(f"{len(checks) - len(divergent)}/{len(checks)} prompts identical with and without "
               "prefix reuse")
    raise SystemExit(1 if divergent else 0)


def verify_torch(org: str, model: str | None, budget: str | None, device: str, seed: int) -> None:
    """`adapters.torch.continuation` behind the CLI: exit 0 when every request
    is identical to its cold run, 1 when any diverges."""
    from adapters.torch.continuation import verify_config, verify_continuation

    if not model:
        raise HbenchError("--engine torch needs --model DIR (hbench tiny-model writes one)")
    report = verify_continuation(verify_config(org, model, budget, device, seed))
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
