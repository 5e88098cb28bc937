"""Continuation equals recomputation: the torch engine against a cold, cache-free run.

The study left open whether continuing from a cached checkpoint matches a
clean recompute token for token (DESIGN.md section 8). `verify_continuation`
serves a workload with shared prefixes under one organization at a budget
tight enough that requests adopt published checkpoints and are preempted and
resumed, then computes every request again alone, cold: one contiguous K/V
buffer, the zero state, the whole prompt in one prefill, then one token at a
time. Each request's greedy tokens must be identical, and the logits of
every token within `REL_TOL` of the cold run's scale (float32).

Poisoning is on: a page read after the organization freed or handed it away
fails the serving run instead of passing by luck.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.records import first_divergence

#: |engine - cold| <= REL_TOL x max |cold logit| (float32; a paged, chunked,
#: resumed run differs from one contiguous prefill by rounding only).
REL_TOL = 1e-4


@dataclass(frozen=True)
class RequestCheck:
    request_id: int
    j_adopt: int
    preemptions: int
    tokens: tuple[int, ...]
    cold_tokens: tuple[int, ...]
    max_rel_logit_diff: float

    @property
    def first_divergence(self) -> int | None:
        return first_divergence(self.tokens, self.cold_tokens)

    @property
    def identical(self) -> bool:
        return self.first_divergence is None and self.max_rel_logit_diff <= REL_TOL

    def describe(self) -> str:
        head = (f"request {self.request_id}: adopted {self.j_adopt} tokens, "
                f"{self.preemptions} preemption(s); ")
        d = self.first_divergence
        if d is None:
            return head + (f"{len(self.tokens)} tokens identical, max |dlogit| "
                           f"{self.max_rel_logit_diff:.2g} of the logit scale")
        return head + (f"DIVERGES at output token {d}: {self.tokens[d:d + 1]} vs cold "
                       f"{self.cold_tokens[d:d + 1]}")


@dataclass(frozen=True)
class ContinuationReport:
    org: str
    checks: tuple[RequestCheck, ...]
    stats: dict            # the engine's counters: adoptions, copies, preemptions, poison

    @property
    def all_identical(self) -> bool:
        return all(c.identical for c in self.checks)


#: Per organization: a served workload (budget label, token budget, output
#: tokens, shared contexts, mean prompt tokens, requests) at which the
#: proportional tiny model (`hbench tiny-model --preset proportional`) adopts
#: checkpoints and preempts at least once (found with the simulator, which
#: schedules identically when every request arrives at once: S0 adopts in 4
#: requests and preempts twice, S1 4 and once, S2 6 and once, D0 3 and once).
#: D0 checkpoints every 1792 tokens, so its prompts are longer. U0 and e0 share
#: that grid: u0 adopts in 3 requests and preempts once at D0's point; e0's
#: capacity moves spare it that preemption, so its 10 requests emit up to 400
#: tokens each (3 adopt, one preemption, 4 capacity moves).
VERIFY_POINTS = {
    "s0": ("b8", 1024, 32, 2, 1200, 10),
    "s1": ("b8", 1024, 32, 2, 1200, 10),
    "s2": ("b8", 1024, 32, 2, 1200, 10),
    "d0": ("b12", 8192, 48, 3, 2600, 8),
    "u0": ("b12", 8192, 48, 3, 2600, 8),
    "e0": ("b12", 8192, 400, 3, 2600, 10),
}


def verify_config(org: str, model_dir: str, budget: str | None = None, device: str = "cpu",
                  seed: int = 0):
    """The serving run `verify_continuation` makes: shared prefixes (q = 1) at
    `VERIFY_POINTS`' working point of ``org`` (arrivals are then moved to time
    0 by `all_at_once`); ``budget`` replaces its budget."""
    from pathlib import Path

    from harness.config import RunConfig

    label, token_budget, out, contexts, mean_input, requests = VERIFY_POINTS[org]
    return RunConfig(engine="torch", org=org, budget=budget or label, model=str(model_dir),
                     config_path=str(Path(model_dir) / "config.json"), device=device, dtype="fp32",
                     poison=True, q=1.0, contexts=contexts, requests=requests, rate=100000.0,
                     mean_input=mean_input, max_model_len=4096, max_output=out, seed=seed,
                     token_budget=token_budget)


def cold_run(model, prompt, n_tokens: int):
    """Greedy tokens and their logits of one request alone: a contiguous K/V
    buffer, the zero state, one whole-prompt prefill, then token by token."""
    import torch

    from adapters.torch.paging import kv_view

    sh = model.shapes
    length = len(prompt) + n_tokens
    pool = torch.zeros(1, sh.n_layers, sh.kv_block_elems(length), dtype=model.dtype,
                       device=model.device)
    kv = kv_view(pool, sh, length)
    ssm, conv = (t.to(model.device, model.dtype) for t in sh.zero_state(1))
    tokens = torch.tensor([int(t) % model.cfg.vocab_size for t in prompt], device=model.device)
    logits = model.prefill_chunk(tokens, 0, kv, [0], ssm[0], conv[0], last_only=True)[0]
    out, all_logits = [], []
    for i in range(n_tokens):
        all_logits.append(logits.float().cpu())
        out.append(int(logits.argmax()))
        if i + 1 == n_tokens:
            break
        pos = torch.tensor([len(prompt) + i], device=model.device)
        logits = model.decode(torch.tensor([out[-1]], device=model.device), pos, kv, [[0]],
                              ssm, conv)[0]
    return out, all_logits


def all_at_once(workload):
    """The workload with every arrival at time 0: the engine then sees every
    request before its first step and receives no other, so its decisions do
    not depend on wall-clock timing (and equal the simulator's)."""
    import dataclasses

    from workloads.workload import Workload

    return Workload(tuple(dataclasses.replace(r, arrival_s=0.0) for r in workload.requests),
                    workload.meta)


def verify_continuation(config, workload=None, kernels: bool | None = None
                        ) -> ContinuationReport:
    """Serve ``config`` (its workload, or ``workload`` if given) with the torch
    engine (``kernels``: its decode state kernels, `TorchEngine`), then compare
    every request with `cold_run` (always the torch path)."""
    import torch

    from adapters.torch.engine import TorchEngine, resolve_device
    from harness.run_setup import validate
    from harness.run_workload import build_run_workload

    setup = validate(config)
    workload = all_at_once(workload if workload is not None else build_run_workload(config))
    engine = TorchEngine(keep_logits=True, kernels=kernels)
    run = engine.run(workload, setup)
    device, dtype = resolve_device(config.device, config.dtype)
    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)      # as the engine does: small ops on a shared CPU
    try:
        return _compare(config, workload, run, engine, device, dtype)
    finally:
        torch.set_num_threads(threads)


def _compare(config, workload, run, engine, device, dtype) -> ContinuationReport:

    from adapters.torch.engine import load_model

    model = load_model(config.model, device, dtype)
    records = {r.request_id: r for r in run.requests}
    checks = []
    for wr in workload.requests:
        rec = records[wr.request_id]
        got = engine.outputs.get(wr.request_id, [])
        cold, cold_logits = cold_run(model, list(wr.prompt_token_ids), wr.output_len)
        mine = engine.logits.get(wr.request_id, [])
        diff = max((float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
                    for a, b in zip(mine, cold_logits, strict=False)), default=float("inf"))
        checks.append(RequestCheck(wr.request_id, rec.j_adopt, rec.preemptions, tuple(got),
                                   tuple(cold), diff))
    return ContinuationReport(config.org, tuple(checks), dict(engine.stats))
