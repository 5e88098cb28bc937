"""The scheduler's stretches of quiet decode steps change no result.

Each case runs one small random configuration twice, with stretches off
(`SimEngine(fast=False)`: every step planned by `Scheduler.schedule` and
completed by `Scheduler.complete`) and on (`Scheduler.schedule` hands out
runs of quiet decode steps, `harness.scheduler.stretch`), and requires identical per-request records (token times included),
step rows, counters and summaries. The configurations are drawn from a seeded
generator over organizations, budgets, rates, q, headroom, retention,
SHARE/ISOLATE, caps, token budgets and seeds, small enough to run in seconds.
"""

from __future__ import annotations

import numpy as np
import pytest

from adapters.sim.engine import SimEngine
from common.errors import HbenchError
from harness.config import ORG_NAMES, RunConfig
from harness.run_setup import RunSetup
from harness.run_workload import build_run_workload
from tests.support.sim_pair import assert_identical, random_config, run_both


@pytest.mark.slow
@pytest.mark.parametrize("case", range(24))
def test_stretches_give_identical_results(case):
    config = random_config(np.random.default_rng([2026, case]))
    try:
        slow, fast = run_both(config)
    except HbenchError:     # a budget that cannot serve the workload: refused the same way
        with pytest.raises(HbenchError):
            SimEngine(fast=True).run(build_run_workload(config), RunSetup.resolve(config))
        return
    assert_identical(slow, fast)


@pytest.mark.slow
@pytest.mark.parametrize("org", ORG_NAMES)
def test_stretches_identical_under_pressure(org):
    """Preemptions, retention and a waiting queue at a small budget."""
    config = RunConfig(org=org, budget="b40", rate=20.0, q=0.5, retention=True,
                       requests=40, seed=7)
    slow, fast = run_both(config)
    assert slow.counters["preemptions"] > 0
    assert_identical(slow, fast)


@pytest.mark.slow
@pytest.mark.parametrize("org, publish, evict",
                         [(org, "marconi", "utility") for org in ORG_NAMES]
                         + [("s2", "every-k", "lru"), ("d0", "every-k", "utility")])
def test_stretches_identical_under_checkpoint_policies(org, publish, evict):
    """The checkpoint policies (`harness.orgs.policies`) under pressure."""
    config = RunConfig(org=org, budget="b40", rate=20.0, q=0.5, retention=True, requests=24,
                       seed=7, ckpt_publish=publish, ckpt_evict=evict)
    slow, fast = run_both(config)
    assert_identical(slow, fast)


@pytest.mark.slow
@pytest.mark.parametrize("org", ORG_NAMES)
def test_stretches_keep_invariants(org):
    """The organization's invariants hold after every step a stretch takes."""
    config = RunConfig(org=org, budget="b63", rate=10.0, requests=10, max_output=200,
                       seed=11, debug_invariants=True)
    slow, fast = run_both(config)
    assert_identical(slow, fast)


@pytest.fixture
def schedule_calls(monkeypatch):
    """Counts the single steps the scheduler plans while the engine loop runs
    (``calls["n"]``; not the stretches it hands out, nor the pre-run check's
    rehearsal, `check_fits`)."""
    from harness.engine.loop import EngineLoop
    from harness.scheduler import Scheduler
    from harness.scheduler.stretch import Stretch

    calls = {"n": 0}
    looping = []
    schedule, run = Scheduler.schedule, EngineLoop.run

    def counting(self):
        plan = schedule(self)
        calls["n"] += 1 if looping and not isinstance(plan, Stretch) else 0
        return plan

    def loop_run(self):
        looping.append(True)
        try:
            return run(self)
        finally:
            looping.pop()

    monkeypatch.setattr(Scheduler, "schedule", counting)
    monkeypatch.setattr(EngineLoop, "run", loop_run)
    return calls


def test_stretches_skip_steps(schedule_calls):
    """Stretches really take over steps: with them on, the scheduler plans
    fewer steps than the run has."""
    calls = schedule_calls
    config = RunConfig(org="s2", requests=20, max_output=300, seed=3)
    workload, setup = build_run_workload(config), RunSetup.resolve(config)
    run = SimEngine(fast=False).run(workload, setup)
    slow_calls, calls["n"] = calls["n"], 0
    fast_run = SimEngine(fast=True).run(workload, setup)
    assert slow_calls == len(run.steps) == len(fast_run.steps)
    assert calls["n"] < len(run.steps) / 2


def test_generated_token_vectorized_is_the_scalar_rule():
    """A stretch catches a request up with `generated_token` over an index
    array: the same ids as one index at a time."""
    from harness.scheduler.batch import generated_token

    for rid in (0, 7, 4_000, 10**6):
        got = generated_token(rid, np.arange(1, 3000, dtype=np.int64))
        assert got.dtype == np.int64
        assert got.tolist() == [generated_token(rid, i) for i in range(1, 3000)]


@pytest.mark.slow
@pytest.mark.parametrize("org", ["s2", "d0"])
def test_stretches_identical_for_sessions(org):
    """Multi-turn sessions: a turn that finishes inside a stretch makes the next
    turn arrive a think time later, as after a planned step."""
    config = RunConfig(org=org, workload_kind="multiturn", requests=12, max_turns=3,
                       think_time_s=0.5, rate=4.0, max_output=120, seed=5)
    slow, fast = run_both(config)
    assert any(r.turn >= 1 for r in slow.requests)
    assert_identical(slow, fast)


def test_admissions_and_finishes_inside_stretches(schedule_calls):
    """Neither a finish nor an admission ends a stretch: without preemptions
    or chunked prefills the scheduler plans only the steps that start from an
    idle engine, not two per admission and one per finish."""
    planned = schedule_calls
    config = RunConfig(org="s1", requests=16, rate=4.0, max_output=300, seed=3)
    run = SimEngine(fast=True).run(build_run_workload(config), RunSetup.resolve(config))
    assert all(r.finish_s is not None for r in run.requests)
    assert run.counters["preemptions"] == 0
    assert planned["n"] < len(run.requests) / 4


@pytest.mark.slow
@pytest.mark.parametrize("org", ORG_NAMES)
def test_chunked_prefills_admitted_inside_stretches(org):
    """A prompt longer than the token budget left after the decodes is
    admitted inside a stretch with a first chunk; the next chunk hands the step
    back to the scheduler. Identical results, invariants after every step."""
    config = RunConfig(org=org, budget="b63", rate=6.0, requests=24, token_budget=2048,
                       mean_input=3332, max_output=300, seed=13, debug_invariants=True)
    slow, fast = run_both(config)
    assert any(int(r["prefill_tokens"]) and int(r["decode_requests"]) for r in slow.steps)
    assert_identical(slow, fast)


@pytest.mark.parametrize("rates", ["roofline", "sum", "separate"])
def test_decode_values_are_step_of_the_decode_shape(rates):
    """`CostModel.decode_values` (every quiet step of a stretch) and
    `StepShape.of_step` of a stretch's admission step (the decodes as a count
    and a context sum, then the admitted chunks) give the same numbers as
    pricing the scheduler's batch."""
    from adapters.sim.cost import CostModel, Rates, StepCost
    from adapters.sim.hardware import get_hardware
    from harness.engine.shape import StepShape
    from harness.model_configs import preset
    from harness.scheduler.batch import BatchItem, SchedRequest, StepBatch

    hw = get_hardware("h200")
    if rates == "sum":
        hw = Rates(mem_bytes_s=2e9, state_bytes_s=5e8, gemm_flops_s=3e10, attn_flops_s=3e10,
                   scan_flops_s=7e9, step_overhead_s=1e-3, request_overhead_s=2e-5,
                   combine="sum")
    elif rates == "separate":
        hw = Rates(mem_bytes_s=2e9, state_bytes_s=5e8, gemm_flops_s=3e10, attn_flops_s=1e10,
                   scan_flops_s=7e9, step_overhead_s=1e-3, request_overhead_s=2e-5)
    model = CostModel(preset("falcon-h1-7b"), hw)
    rng = np.random.default_rng(7)
    for _ in range(300):
        contexts = tuple(int(c) for c in rng.integers(1, 40_000, int(rng.integers(1, 64))))
        shape = StepShape.from_requests(decode_contexts=contexts)
        want = model.step(shape)
        got = model.decode_values(len(contexts), sum(contexts))
        assert StepCost(*got[:9]) == want
        assert model.decode_step(len(contexts), sum(contexts)) == want
        chunks = []
        for rid in range(int(rng.integers(1, 4))):
            start = int(rng.integers(0, 4)) * 512
            n = int(rng.integers(1, 3000))
            r = SchedRequest(rid, 0.0, None, [], None, start + n, 10, None,
                             prefill_until=start + n - int(rng.integers(0, 2)) * (n // 2))
            chunks.append(BatchItem(r, start, start + n, True, 512, adopted=bool(start)))
        mixed = StepShape.from_requests(
            tuple((it.end - it.start, it.start) for it in chunks), contexts,
            sum(min(it.end, it.req.prefill_until) // 512 - it.start // 512 for it in chunks),
            sum(it.adopted for it in chunks))
        decodes = [BatchItem(None, c, c + 1, False, 512) for c in contexts]
        assert StepShape.of_batch(StepBatch(items=[*decodes, *chunks])) == mixed
        assert StepShape.of_step(chunks, len(contexts), sum(contexts)) == mixed
        assert model.step(StepShape.of_step(chunks, len(contexts), sum(contexts))) == model.step(mixed)


@pytest.mark.slow
@pytest.mark.parametrize("org", ORG_NAMES)
def test_stretches_identical_when_decodes_publish_in_place(org):
    """In vLLM's blocks (``paging="vllm"``) a decode step that reaches a
    checkpoint edge publishes its live state in place, and the next step
    needs a new live state: a stretch takes the decode steps' blocks in
    one go only when no request needs one."""
    config = RunConfig(org=org, paging="vllm", budget="b40", rate=20.0, q=1.0, requests=19,
                       cap=4, headroom=0.19, mean_input=600, max_output=2000,
                       warmup_requests=1, seed=958)
    slow, fast = run_both(config)
    assert_identical(slow, fast)


@pytest.mark.slow
@pytest.mark.parametrize("config", [
    # D0 at a small budget: preempts inside stretches, and hands a step whose
    # first running request needs a block that does not fit to the scheduler
    RunConfig(org="d0", budget="b40", rate=20.0, requests=30, max_output=1024, seed=2),
    # a preempted request that itself needed a block in that step
    RunConfig(org="s1", budget="b40", rate=20.0, q=1.0, requests=30, mean_input=1500,
              max_output=1024, cap=16, seed=2, debug_invariants=True),
], ids=["d0", "s1"])
def test_preemptions_inside_stretches(config, monkeypatch):
    """A block that does not fit preempts inside the stretch by the
    scheduler's own `Scheduler.make_room` (the victim brought up to date
    first), or, where the first running request might be the victim, ends
    the stretch (``"no room"``) for `Scheduler.schedule`: the same rows (the
    preempting step's and the fresh one after it), records and counters as
    the scheduler's steps."""
    from harness.scheduler.stretch import NO_ROOM, PREEMPT, Stretch

    kinds = {PREEMPT: 0, NO_ROOM: 0}
    plan = Stretch.plan

    def counting_plan(self, arrived):
        kind = plan(self, arrived)
        if kind in kinds:
            kinds[kind] += 1
        return kind

    monkeypatch.setattr(Stretch, "plan", counting_plan)
    slow, fast = run_both(config)
    assert kinds[PREEMPT] > 0
    assert kinds[NO_ROOM] > 0 or config.org != "d0"
    assert_identical(slow, fast)


@pytest.mark.parametrize("org, pages", [("d0", (400, 40)), ("s2", (60,))])
def test_advance_over_several_tokens_is_their_single_completions(org, pages):
    """`Scheduler.advance` brings a decoding request up by many tokens at once
    (a stretch's one commit): the same tokens, prefix keys, token times,
    positions and finish as that many single completions (`complete`)."""
    from harness.model_configs import preset
    from harness.orgs import build_organization, layout_for
    from harness.scheduler import Scheduler, SchedulerPolicy
    from harness.scheduler.batch import RUNNING

    def started():
        o = build_organization(layout_for(org, preset("falcon-h1-7b")), pages)
        sched = Scheduler(o, SchedulerPolicy())
        r = sched.add(0, 0.0, list(range(100)), 90, None)
        sched.complete(sched.schedule(), 0.5)        # prefill: the first token
        return sched, r

    one, a = started()
    for k in range(1, 90):                          # 89 single decode steps, one by one
        batch = one.schedule()
        assert [(i.start, i.end, i.prefill) for i in batch.items] == [(99 + k, 100 + k, False)]
        one.complete(batch, 0.5 + k)
    many, b = started()
    times = np.arange(1.5, 40.0)                     # 39 tokens in one go, then 50
    assert many.org.allocate_all([(0, 100 + 39 + 50, 100)])
    assert not many.advance(b, 139, times) and b.state == RUNNING
    assert many.advance(b, 189, np.arange(40.5, 90.0))
    many.end_step()
    assert a.record.status == b.record.status == "finished"
    assert a.generated == b.generated == 90 and a.computed == b.computed == 189
    assert list(a.tokens) == list(b.tokens) and a.keys == b.keys and len(a.keys) == 189 // 16
    assert list(a.token_times) == list(b.token_times)
    assert a.record.finish_s == b.record.finish_s == 89.5
    one.org.check_invariants()
    many.org.check_invariants()
    assert one.org.usage().pages == many.org.usage().pages
