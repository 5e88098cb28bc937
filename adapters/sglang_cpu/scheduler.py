"""hbench's scheduler with SGLang's admission and retraction rules, over
SGLang's own pools and radix cache (`adapters.sglang_cpu.requests`).

Runs inside the SGLang venv, driven by hbench's engine loop
(`harness.engine.loop.EngineLoop`) exactly like `harness.scheduler.Scheduler`
(``add``, ``schedule``, ``complete``, ``has_work``, ``check_drained``,
``requests``, ``preemptions``) and returning the same values
(`harness.scheduler.batch`). SGLang's scheduler itself
(``managers/scheduler.py``) cannot be driven without its model workers, so
its rules are restated here, each with where SGLang has it:

* a step is a prefill batch when a waiting request can be admitted, else a
  decode batch of every running request (``get_next_batch_to_run``: new
  prefill batches before decoding; mixed chunks are off by default);
* admission is FCFS (``--schedule-policy fcfs``) while fewer than ``cap``
  run and the batch's new tokens stay within the token budget
  (``chunked_prefill_size``); a request is admitted only if its unmatched
  input plus ``new_token_ratio`` x its output fits in SGLang's
  ``rem_total_tokens`` (free KV + the tree's evictable KV, less the same
  reservation for every running request; ``schedule_policy.PrefillAdder``)
  and a Mamba slot is free or evictable; under unified memory the new
  request's state also reserves its bytes in KV tokens
  (``mamba_slot_full_token_cost``, ``PrefillAdder._mamba_gap_budget_for_req``);
* ``new_token_ratio`` starts at 0.7 and decays linearly to 0.7 x 0.14 over
  600 decode steps, and goes back to 0.7 after a retraction
  (``SGLANG_INIT_NEW_TOKEN_RATIO``, ``..._MIN_NEW_TOKEN_RATIO_FACTOR``,
  ``..._NEW_TOKEN_RATIO_DECAY_STEPS`` in ``environ.py``);
* when a decode step cannot get a KV token per request even after eviction,
  the most recently admitted request is retracted (its KV and Mamba slot
  freed without insertion) and waits at the head of the queue
  (``ScheduleBatch.retract_decode``; SGLang sorts by output length, hbench
  takes the newest);
* a prompt longer than the token budget is prefilled in one step (SGLang would
  chunk it and cache each chunk; not restated).

A finished request inserts its whole sequence with its Mamba slot into the
tree; reuse (``reused_tokens``, ``j_adopt``) is what SGLang's match returned.
"""

from __future__ import annotations

from collections import deque

from adapters.sglang_cpu.requests import RequestMemory
from harness.records import FAILED, FINISHED
from harness.scheduler.batch import (
    DONE,
    RUNNING,
    WAIT_BUDGET,
    WAIT_CAP,
    WAIT_MEMORY,
    WAITING,
    BatchItem,
    SchedRequest,
    StepBatch,
    generated_token,
    token_array,
)

INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600


class SglangScheduler:
    """Continuous batching by SGLang's rules (module docstring) over ``memory``
    (`adapters.sglang_cpu.requests.Memory`). ``grid`` is the interval the
    step shape counts state copies on (SGLang caches a request's state once,
    at the end of its prefill: the token budget)."""

    def __init__(self, memory, *, cap: int, token_budget: int):
        self.memory, self.cap, self.token_budget = memory, cap, token_budget
        self.grid = token_budget
        self.requests: dict[int, SchedRequest] = {}
        self.waiting: deque[SchedRequest] = deque()
        self.running: list[SchedRequest] = []
        self.held: dict[int, RequestMemory] = {}
        self.preemptions = 0
        self.ratio = INIT_NEW_TOKEN_RATIO
        self._seq = 0

    # ---- the engine loop's surface ------------------------------------------------
    def add(self, rid, arrival_s, token_ids, output_len, salt, prefix_group=-1, warmup=False,
            keys=None) -> SchedRequest:
        r = SchedRequest.arriving(rid, arrival_s, token_array(token_ids), output_len, salt, [],
                                  prefix_group, warmup)
        self.requests[rid] = r
        self.waiting.append(r)
        return r

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def check_drained(self) -> None:
        open_reqs = [r.rid for r in self.requests.values() if r.state != DONE]
        if open_reqs:
            raise AssertionError(f"requests neither finished nor failed: {open_reqs[:10]}")
        if self.held:
            raise AssertionError(f"SGLang memory still held by {sorted(self.held)[:10]}")

    def schedule(self) -> StepBatch:
        batch = StepBatch()
        self._admit(batch)
        if batch.items:
            return batch
        self._decode(batch)
        return batch

    def complete(self, batch: StepBatch, now: float) -> list[SchedRequest]:
        finished = []
        for item in batch.items:
            r = item.req
            if r.state != RUNNING:
                continue
            r.computed = item.end
            r.generated += 1
            r.token_times.append(now)
            if r.record.first_token_s is None:
                r.record.first_token_s = now
            if r.generated >= r.output_len:
                self._finish(r, now)
                finished.append(r)
            else:
                r.tokens.append(generated_token(r.rid, r.generated))
        return finished


    # ---- SGLang's rules -----------------------------------------------------------
    def _reserved(self) -> float:
        """Tokens SGLang's PrefillAdder reserves for the running requests' outputs."""
        return sum((r.output_len - r.generated) * self.ratio for r in self.running)

    def _admit(self, batch: StepBatch) -> None:
        memory = self.memory
        tokens_left = self.token_budget
        while self.waiting:
            r = self.waiting[0]
            if len(self.running) >= self.cap:
                batch.wait_reason = WAIT_CAP
                return
            match = memory.match(r.tokens)
            new = len(r.tokens) - int(match.device_prefix_len)
            if batch.items and new > tokens_left:
                batch.wait_reason = WAIT_BUDGET
                return
            rem_total = memory.available_plus_evictable() - self._reserved()
            fits = (new + (r.output_len - r.generated) * self.ratio + memory.slot_token_cost
                    <= rem_total and memory.mamba_slots_free_or_evictable() >= 1)
            held = RequestMemory(memory)
            if not fits or not held.admit(r.tokens, match, new):
                if not self.running and not batch.items:
                    self._fail(r, batch)       # can never fit: nothing will free memory
                    continue
                batch.wait_reason = WAIT_MEMORY
                return
            self.waiting.popleft()
            self.held[r.rid] = held
            self._on_admit(r, held.matched)
            batch.items.append(BatchItem(r, held.matched, len(r.tokens), True, self.grid))
            batch.admitted.append(r.rid)
            tokens_left -= new

    def _on_admit(self, r: SchedRequest, matched: int) -> None:
        r.state = RUNNING
        r.admitted_seq = self._seq
        self._seq += 1
        self.running.append(r)
        rec = r.record
        if r.first_admission:
            r.first_admission = False
            rec.j_adopt = rec.reused_tokens = matched
            rec.initial_input_tokens = r.prompt_len - matched
        else:
            rec.recomputed_tokens += len(r.tokens) - matched

    def _decode(self, batch: StepBatch) -> None:
        if not self.running:
            return
        while self.running and not self.memory.make_room(len(self.running), 0):
            self._retract(max(self.running, key=lambda q: q.admitted_seq), batch)
        for r in list(self.running):
            if r.state != RUNNING:
                continue
            while not self.held[r.rid].grow(1):    # a region's sides can still refuse
                victim = max(self.running, key=lambda q: q.admitted_seq)
                self._retract(victim, batch)
                if victim is r:
                    break
            if r.state != RUNNING:
                continue
            batch.items.append(BatchItem(r, len(r.tokens) - 1, len(r.tokens), False, self.grid))
        floor = INIT_NEW_TOKEN_RATIO * MIN_NEW_TOKEN_RATIO_FACTOR
        self.ratio = max(floor, self.ratio - (INIT_NEW_TOKEN_RATIO - floor)
                         / NEW_TOKEN_RATIO_DECAY_STEPS)

    def _retract(self, r: SchedRequest, batch: StepBatch) -> None:
        self.held.pop(r.rid).retract()
        self.running.remove(r)
        r.state = WAITING
        r.computed = 0
        r.prefill_until = len(r.tokens)
        r.record.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(r)
        batch.preempted.append(r.rid)
        self.ratio = INIT_NEW_TOKEN_RATIO

    def _finish(self, r: SchedRequest, now: float) -> None:
        self.held.pop(r.rid).finish(r.tokens)
        self.running.remove(r)
        r.record.finish_s = now
        self._close(r, FINISHED)

    def _fail(self, r: SchedRequest, batch: StepBatch) -> None:
        self.waiting.popleft()
        self._close(r, FAILED, "does not fit in SGLang's pools")
        batch.failed.append(r.rid)

    def _close(self, r: SchedRequest, status: str, error: str = "") -> None:
        r.close(status, error)
