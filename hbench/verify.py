"""Does prefix reuse change what a served engine generates?

For each prompt `verify_endpoint` sends, greedily and with ``logprobs=1``:

    1. the prompt once, to put its prefix in the cache (warm-up),
    2. the prompt again: served with a prefix-cache hit,
    3. the prompt with a fresh unique ``cache_salt``: reuse defeated, a clean recompute,

and compares 2 with 3 token by token (`PromptCheck`: the first divergence
and the largest log-probability difference). `verify_server` does that on a
running server or on one it launches and stops; `refuse_vacuous` refuses a
comparison that proved nothing (the hit reused nothing, or the recompute
reused something). ``hbench verify`` prints the checks.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from common.errors import HbenchError
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


def complete(endpoint, model: str, prompt: str | list[int], output_len: int, salt: str | None,
             timeouts=None):
    """One greedy completion of exactly ``output_len`` tokens with ``logprobs=1``
    and its token ids; (outcome, prompt tokens the server reused). HbenchError
    when it failed."""
    from adapters.client.http import DEFAULT_TIMEOUTS
    from adapters.client.stream import completion_body, stream_completion

    timeouts = timeouts or DEFAULT_TIMEOUTS

    body = completion_body(model, prompt, output_len, salt,
                           {"logprobs": 1, "return_token_ids": True})
    out = stream_completion(endpoint, body, time.perf_counter(), timeouts)
    if not out.success:
        raise HbenchError(f"verify request failed: {out.error}")
    cached = int((out.usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return out, cached


def verify_endpoint(endpoint, model: str, prompts: list[str] | list[list[int]],
                    output_len: int = 16, timeouts=None) -> list[PromptCheck]:
    """Hit-vs-recompute comparison of every prompt, text or token ids
    (sequential, one request at a time)."""
    from adapters.client.http import DEFAULT_TIMEOUTS

    timeouts = timeouts or DEFAULT_TIMEOUTS
    checks = []
    for i, prompt in enumerate(prompts):
        complete(endpoint, model, prompt, output_len, None, timeouts)
        hit, hit_cached = complete(endpoint, model, prompt, output_len, None, timeouts)
        miss, miss_cached = complete(endpoint, model, prompt, output_len,
                                      f"hbench-verify-{uuid.uuid4().hex}", timeouts)
        if len(hit.token_ids) != output_len or len(miss.token_ids) != output_len:
            raise HbenchError(f"the server returned {len(hit.token_ids)} and "
                              f"{len(miss.token_ids)} token ids for {output_len} tokens; it must "
                              "support return_token_ids for a token-level comparison")
        checks.append(PromptCheck(
            i, hit_cached, miss_cached, tuple(hit.token_ids), tuple(miss.token_ids),
            tuple(hit.logprobs), tuple(miss.logprobs)))
    return checks


def verify_server(engine_name: str, *, endpoint: str | None = None, launch: bool = False,
                  model: str | None = None, org: str | None = None,
                  server_cmd: str | None = None, prompts: int = 4, prompt_chars: int = 2500,
                  output_len: int = 16) -> list[PromptCheck]:
    """`verify_endpoint` over ``prompts`` `default_prompts` on the server at
    ``endpoint``, or (``launch``) on one ``engine_name`` starts serving
    ``model`` with organization ``org`` (default: the engine's first) and stops
    afterwards. ``model`` names the served model at an endpoint (default: the
    only one served). HbenchError for a bad mix of these, before any work."""
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
    texts = default_prompts(prompts, prompt_chars)
    if endpoint:
        ep = Endpoint.parse(endpoint)
        return verify_endpoint(ep, pick_model(served_models(ep), model, ep), texts, output_len)
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
        return verify_endpoint(ep, pick_model(served_models(ep), model, ep), texts, output_len)


def refuse_vacuous(checks: list[PromptCheck]) -> None:
    """HbenchError when the checks verified nothing: no cache-hit request reused
    a prompt token, or a salted request did (no clean recompute)."""
    if any(c.hit_cached_tokens == 0 for c in checks):
        raise HbenchError("the cache-hit requests reused no prompt tokens, so nothing was "
                          "verified; is prefix caching on and are the prompts longer than a block?")
    if any(c.miss_cached_tokens for c in checks):
        raise HbenchError("requests with a unique cache_salt still reused prompt tokens, so "
                          "there was no clean recompute to compare with; does the server "
                          "support cache_salt?")


# ------------------------------------------------------------- torch engine

#: Largest page count tried for a model's torch verify point.
MAX_VERIFY_PAGES = 400


def exercises_continuation(config) -> bool:
    """Whether serving ``config`` (every request at time 0) adopts a cached
    checkpoint and preempts at least once, with every request finished: asked
    of the simulator, which schedules as the torch engine does when all
    requests arrive at once (same organizations, same layout, same scheduler)."""
    import dataclasses

    from adapters.sim.engine import SimEngine
    from adapters.torch.continuation import all_at_once
    from harness.metrics import summarize
    from harness.run_setup import validate
    from harness.run_workload import build_run_workload

    sim = dataclasses.replace(config, engine="sim", poison=False)
    try:
        setup = validate(sim)
        run = SimEngine().run(all_at_once(build_run_workload(sim)), setup)
    except HbenchError:
        return False                 # the budget cannot hold one request's first chunk
    s = summarize(run, config=sim)
    return s["finished"] == s["requests"] and s["preemptions"] > 0 and s["reused_tokens"] > 0


def torch_verify_config(org: str, model_dir: str, budget: str | None = None,
                        device: str = "cpu", seed: int = 0):
    """The run ``hbench verify --engine torch`` serves (`verify_config`), at a
    budget that tests continuation on *this* model: ``budget`` when given;
    else the organization's documented verify point (set for the proportional
    tiny model) when it adopts and preempts here; else the smallest page
    count ``Np`` of the organization's own page that does, so the point scales
    with the model's geometry (a model whose checkpoint is tiny beside an
    attention block needs other page counts than one whose checkpoint is
    three blocks). HbenchError when no page count up to `MAX_VERIFY_PAGES` does."""
    import dataclasses

    from adapters.torch.continuation import verify_config

    config = verify_config(org, model_dir, budget, device, seed)
    if budget is not None or exercises_continuation(config):
        return config
    for pages in range(2, MAX_VERIFY_PAGES + 1):
        candidate = dataclasses.replace(config, budget=f"{pages}p")
        if exercises_continuation(candidate):
            return candidate
    raise HbenchError(f"no budget up to {MAX_VERIFY_PAGES}p makes {org} adopt a checkpoint and "
                      f"preempt on {model_dir}'s geometry at the verify workload; give --budget")
