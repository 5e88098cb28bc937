"""The scheduler's policy on tiny organizations, driven step by step."""

from __future__ import annotations

import numpy as np
import pytest

from harness.model_configs import preset
from harness.orgs import build_organization, layout_for
from harness.orgs.keys import key_at
from harness.records import CANCELLED, FINISHED
from harness.scheduler import Scheduler, SchedulerPolicy
from harness.scheduler.batch import DONE, BatchItem, StepBatch

GEOM = preset("falcon-h1-7b")


def make(org="s2", pages=(60,), **policy):
    org = build_organization(layout_for(org, GEOM), pages)
    return org, Scheduler(org, SchedulerPolicy(**policy))


def prompt(n, base=0):
    return list(range(base, base + n))


def drive(sched, now=0.0, max_steps=10_000, on_step=None):
    steps = 0
    while sched.has_work and steps < max_steps:
        batch = sched.schedule()
        now += 0.01
        sched.complete(batch, now)
        sched.org.check_invariants()
        if on_step:
            on_step(steps, batch)
        steps += 1
    return steps


def test_prefill_chunks_end_on_the_checkpoint_grid():
    org, sched = make("s1", (200,), token_budget=1300)
    sched.add(0, 0.0, prompt(3000), 2, None)
    plan = sched.schedule()
    (item,) = plan.items
    assert (item.start, item.end) == (0, 1024)          # 1300 rounded down to the 512 grid
    sched.complete(plan, 0.01)
    assert sched.requests[0].computed == 1024
    ends = []
    while sched.has_work:
        plan = sched.schedule()
        ends += [i.end for i in plan.items if i.prefill]
        sched.complete(plan, 1.0)
    assert ends == [2048, 3000]                           # the last chunk ends at the prompt


def test_d0_grid_is_1792():
    org, sched = make("d0", (4000, 40), token_budget=4000)
    sched.add(0, 0.0, prompt(5000), 1, None)
    plan = sched.schedule()
    assert plan.items[0].end == 3584


def test_cap_limits_running_requests():
    org, sched = make("s2", (300,), cap=2)
    for i in range(4):
        sched.add(i, 0.0, prompt(600, 10_000 * i), 3, None)
    sched.schedule()
    assert len(sched.running) == 2 and len(sched.waiting) == 2


def test_headroom_blocks_admission_but_not_growth():
    # 40 pages; f = 0.5 keeps 20 free after each admission
    org, sched = make("s1", (40,), headroom=0.5)
    sched.add(0, 0.0, prompt(1500), 1, None)   # 3 blocks + live + 2 spares -> 15 pages
    sched.add(1, 0.0, prompt(1500, 9_000), 1, None)
    plan = sched.schedule()
    assert [i.req.rid for i in plan.items] == [0]
    assert org.available_pages()[0] >= 20
    assert len(sched.waiting) == 1


def test_preemption_takes_the_most_recent_request_which_resumes_later():
    # S1, 22 pages, 1,024-token steps: both 500-token prompts fit in one step
    # (1 block + live = 5 pages each), but decoding to 3,600 tokens needs 8 blocks +
    # live = 12 pages each. The resumed request's first chunk is 512 tokens (the
    # step's budget minus the other's decode token, on the grid): 1 block + live +
    # spare = 9 pages, which fit beside the survivor's 12.
    org, sched = make("s1", (22,), token_budget=1024)
    sched.add(0, 0.0, prompt(500), 3100, None)
    sched.add(1, 0.0, prompt(500, 50_000), 3100, None)
    batch = sched.schedule()
    assert len(batch.items) == 2
    sched.complete(batch, 0.01)
    preempted = []
    for _ in range(4000):
        batch = sched.schedule()
        preempted += batch.preempted
        if preempted:
            break
        sched.complete(batch, 0.02)
    assert preempted == [1]                       # admitted last, preempted first
    assert sched.requests[0].state == "running"
    assert sched.waiting[0].rid == 1              # resumes first (FCFS head)
    assert sched.requests[1].record.preemptions == 1
    drive(sched)
    assert all(r.record.status == FINISHED for r in sched.requests.values())
    assert all(r.record.output_tokens == 3100 for r in sched.requests.values())
    assert sched.requests[1].record.recomputed_tokens > 0
    assert not org.pinned_checkpoints() and org.holds_no_references()


def test_retention_holds_demanded_checkpoints_only_while_the_producer_runs():
    org, sched = make("s2", (200,), retention=True, retention_threshold=2)
    shared = prompt(1600)
    sched.add(0, 0.0, shared + [7, 7, 7], 50, None)
    sched.add(1, 0.0, shared + [8, 8], 5, None)        # demand for the shared grid keys = 2
    sched.add(2, 0.0, prompt(1600, 90_000), 5, None)   # private: demand 1
    plan = sched.schedule()
    sched.complete(plan, 0.01)
    shared_keys = {key_at(sched.requests[0].keys, j) for j in (512, 1024, 1536)}
    # the shared prefix is retained once per checkpoint; the private one not at all
    assert org.retained_checkpoints() == dict.fromkeys(shared_keys, 1)
    drive(sched)
    assert not org.retained_checkpoints()
    assert org.holds_no_references()


def test_isolate_salts_defeat_reuse_share_reuses():
    for salt_fn, expect_reuse in ((lambda i: None, True), (lambda i: f"iso-{i}", False)):
        org, sched = make("s2", (200,))
        sched.add(0, 0.0, prompt(2000), 2, salt_fn(0))
        drive(sched)
        sched.add(1, 1.0, prompt(2000) + [5], 2, salt_fn(1))
        drive(sched, now=1.0)
        assert (sched.requests[1].record.reused_tokens > 0) == expect_reuse


@pytest.mark.parametrize("org_name, pages", [("s0", (30,)), ("s1", (70,)), ("s2", (70,)),
                                             ("d0", (1500, 12))])
def test_random_cancellation_leaks_nothing(org_name, pages):
    rng = np.random.default_rng(5)
    org, sched = make(org_name, pages, cap=8, token_budget=2048)
    n = 30
    for i in range(n):
        base = 0 if rng.random() < 0.5 else 100_000 * (i + 1)
        sched.add(i, 0.0, prompt(int(rng.integers(300, 2500)), base), int(rng.integers(1, 60)),
                  None)

    def maybe_cancel(step, batch):
        live = [r for r in sched.requests.values() if r.state != DONE]
        if live and rng.random() < 0.08:
            sched.cancel(int(rng.choice([r.rid for r in live])))

    drive(sched, on_step=maybe_cancel)
    statuses = {r.record.status for r in sched.requests.values()}
    assert CANCELLED in statuses and statuses <= {FINISHED, CANCELLED}
    assert org.holds_no_references()
    assert not org.pinned_checkpoints() and not org.retained_checkpoints()
    org.check_invariants()


def test_a_preemption_only_round_is_replanned_within_the_same_schedule_call():
    # S1, 10 pages. r0 (600-token prompt) takes 2 blocks + live + 1 spare = 10 pages;
    # after its prefill the 512 checkpoint is cached and decoding grows its blocks
    # into those pages until it holds 6 blocks + live = 10 referenced pages at 3,072
    # tokens. Its next token needs a 7th block: it preempts itself, so the round
    # computes nothing. The same schedule() call plans again: r0, now the head of
    # the queue with 3,073 tokens to recompute in one budget-sized chunk (7 blocks
    # + live + 6 spares, and no checkpoint left to adopt), cannot be admitted with
    # nothing running and fails; r1 (100 tokens: 1 block + live = 5 pages), which
    # never fitted beside r0, is admitted.
    org, sched = make("s1", (10,))
    sched.add(0, 0.0, prompt(600), 10_000, None)
    batch = sched.schedule()
    sched.complete(batch, 0.01)
    sched.add(1, 0.01, prompt(100, 70_000), 1, None)
    for step in range(5000):
        batch = sched.schedule()
        if batch.preempted:
            break
        assert [i.req.rid for i in batch.items] == [0]
        sched.complete(batch, 0.02 + step)
    assert batch.preempted == [0] and batch.failed == [0]
    assert [(i.req.rid, i.start, i.end) for i in batch.items] == [(1, 0, 100)]
    assert sched.requests[0].generated == 3072 - 600 + 1
    assert sched.requests[0].record.status == "failed"
    org.check_invariants()


def test_schedule_asserts_the_token_budget_and_the_cap(monkeypatch):
    org, sched = make("s2", (200,), token_budget=1000, cap=1)
    r = sched.add(0, 0.0, prompt(600), 2, None)
    oversize = StepBatch(items=[BatchItem(r, 0, 1001, True, org.grid)])
    monkeypatch.setattr(sched, "_schedule_round", lambda: oversize)
    with pytest.raises(AssertionError, match="1001 tokens exceeds the token budget 1000"):
        sched.schedule()
    within_budget = StepBatch(items=[BatchItem(r, 0, 512, True, org.grid)])
    monkeypatch.setattr(sched, "_schedule_round", lambda: within_budget)
    sched.running = [r, r]
    with pytest.raises(AssertionError, match="2 running requests exceed the cap 1"):
        sched.schedule()


def test_first_chunk_is_sized_by_the_remaining_token_budget():
    # 1,300-token steps: r0 decodes (1 token), so r1's first chunk gets 1,299
    # tokens, cut to the 512 grid: [0, 1024)
    org, sched = make("s1", (200,), token_budget=1300)
    sched.add(0, 0.0, prompt(100), 50, None)
    sched.complete(sched.schedule(), 0.01)
    sched.add(1, 0.01, prompt(3000, 40_000), 1, None)
    batch = sched.schedule()
    assert [(i.req.rid, i.start, i.end) for i in batch.items] == [(0, 100, 101), (1, 0, 1024)]


def test_a_first_chunk_that_does_not_fit_with_headroom_stops_admission():
    # S1, 40 pages, f = 0.5: 20 must stay free after an admission. r0 (100 tokens,
    # 1 block + live = 5 pages) runs. r1's first chunk is its whole 2,600-token
    # prompt (the budget allows it): 6 blocks + live + 5 spares = 6 + 4 + 20 = 30
    # pages, leaving 5 < 20, so admission stops for this step, and r2 behind it
    # waits too. A [0, 512) chunk (1 + 4 + 4 = 9 pages, leaving 26) would pass the
    # check, but a first chunk is not shortened to squeeze it in.
    org, sched = make("s1", (40,), headroom=0.5)
    sched.add(0, 0.0, prompt(100), 200, None)
    sched.complete(sched.schedule(), 0.01)
    sched.add(1, 0.01, prompt(2600, 30_000), 1, None)
    sched.add(2, 0.01, prompt(100, 60_000), 1, None)
    for step in range(3):
        batch = sched.schedule()
        assert [i.req.rid for i in batch.items] == [0]
        assert [r.rid for r in sched.waiting] == [1, 2]
        sched.complete(batch, 0.02 + step)
    assert org.available_pages()[0] == 40 - 5


def test_running_prefill_chunks_shrink_to_the_grid_before_anyone_is_preempted():
    # S1, 34 pages, 2,200-token steps, every published checkpoint retained (so its
    # pages cannot be reclaimed). Step 1: r0 (3,000 tokens) gets [0, 2048) = 4
    # blocks + live + 4 spares = 24 pages; r1 (100 tokens) gets the remaining
    # budget, 1 block + live = 5 pages. After it r0 holds 4 blocks + live (8
    # pages) and its 4 retained checkpoints (16), r1 5: 5 pages stay empty.
    # Step 2: r0's rest [2048, 3000) needs 2 blocks + 1 spare = 6 pages > 5; the
    # chunk is shortened to [2048, 2560) (1 block + 1 spare = 5 pages) and r1 keeps
    # running, not preempted.
    org, sched = make("s1", (34,), token_budget=2200, retention=True, retention_threshold=1)
    sched.add(0, 0.0, prompt(3000), 1, None)
    sched.add(1, 0.0, prompt(100, 80_000), 400, None)
    batch = sched.schedule()
    assert [(i.req.rid, i.start, i.end) for i in batch.items] == [(0, 0, 2048), (1, 0, 100)]
    sched.complete(batch, 0.01)
    assert org.available_pages()[0] == 5
    batch = sched.schedule()
    assert batch.preempted == []
    assert [(i.req.rid, i.start, i.end) for i in batch.items] == [(0, 2048, 2560), (1, 100, 101)]


def test_a_preempted_adopter_pins_the_checkpoint_it_adopted():
    # D0: 200 attention blocks of 16 tokens, 6 checkpoint pages, grid 1,792.
    # r0 (2,000 tokens) publishes the checkpoint at 1,792 and finishes. r2 (private,
    # 100 tokens) and then r1 (r0's 2,000 tokens + 100 new) are admitted together;
    # r1 adopts J = 1,792 (112 cached blocks + the checkpoint) and computes
    # [1792, 2100), publishing nothing, which consumes the adopted checkpoint into
    # its live state (the checkpoint is cached again, in its own pool). Both then
    # decode (r1 to 2,900 tokens, which fit alone) until the attention pool runs
    # out and r1, admitted last, is preempted. It must pin the deepest valid
    # checkpoint on its path: the one at 1,792 that it adopted (it published none).
    org, sched = make("d0", (200, 6))
    shared = prompt(2000)
    sched.add(0, 0.0, shared, 1, None)
    drive(sched)
    sched.add(2, 1.0, prompt(100, 500_000), 3000, None)
    sched.add(1, 1.0, shared + prompt(100, 900_000), 800, None)
    batch = sched.schedule()
    assert [(i.req.rid, i.start, i.end) for i in batch.items] == [(2, 0, 100), (1, 1792, 2100)]
    sched.complete(batch, 1.01)
    for step in range(3000):
        batch = sched.schedule()
        if batch.preempted:
            break
        sched.complete(batch, 1.02 + step)
    assert batch.preempted == [1]
    assert org.pinned_checkpoints() == {1: 1792}
    assert sched.requests[1].record.j_adopt == 1792
    drive(sched, now=100.0)
    assert all(r.record.status == FINISHED for r in sched.requests.values())
    assert not org.pinned_checkpoints() and org.holds_no_references()


def test_headroom_is_kept_only_while_another_request_runs():
    # S1, 40 pages, f = 0.5 (20 pages must stay free). r0 (3,000 tokens: 6
    # blocks + live + 5 spares = 30 pages) arrives to an idle engine: vLLM's
    # watermark applies only when a request is already scheduled, so it starts
    # (30 pages fit, 30 + 20 would not). r1 behind it (100 tokens, 5 pages) must
    # keep the 20 while r0 runs: 10 left < 5 + 20, so it waits.
    org, sched = make("s1", (40,), headroom=0.5)
    sched.add(0, 0.0, prompt(3000), 2, None)
    sched.add(1, 0.0, prompt(100, 50_000), 1, None)
    batch = sched.schedule()
    assert [(i.req.rid, i.start, i.end) for i in batch.items] == [(0, 0, 3000)]
    assert batch.failed == [] and [r.rid for r in sched.waiting] == [1]
    assert batch.wait_reason == "memory"
    drive(sched)
    assert all(r.record.status == FINISHED for r in sched.requests.values())


def test_headroom_while_idle_keeps_the_old_rule_and_fails_what_never_fits():
    # the same arrival with the headroom kept on an idle engine: r0 can never
    # be admitted (30 + 20 > 40) and nothing runs to free pages, so it fails
    org, sched = make("s1", (40,), headroom=0.5, headroom_while_idle=True)
    sched.add(0, 0.0, prompt(3000), 2, None)
    batch = sched.schedule()
    assert batch.failed == [0] and batch.items == []


@pytest.mark.parametrize("whole, admitted", [(False, [0, 1]), (True, [0])])
def test_admission_by_the_whole_input_or_by_the_first_chunk(whole, admitted):
    # S0, 21 pages (one 512-token block or one checkpoint each), 1,100-token
    # steps. r0 (100 tokens, 200 to generate: 1 block + live = 2 pages) runs.
    # r1 (5,000 tokens) gets a first chunk of [0, 1024) (1,099 tokens of budget,
    # cut to the grid), whose pages fit in the 19 left; its whole input needs
    # 20 pages (10 blocks, the live state and the checkpoints it publishes on
    # the way). By the first chunk (the study) it starts; by the whole input
    # (vLLM's scheduler_reserve_full_isl) it waits.
    org, sched = make("s0", (21,), token_budget=1100, admit_whole_input=whole)
    sched.add(0, 0.0, prompt(100), 200, None)
    sched.complete(sched.schedule(), 0.01)
    sched.add(1, 0.01, prompt(5000, 70_000), 1, None)
    r1 = sched.requests[1]
    hit = org.lookup(r1.keys, len(r1.tokens) - 1)
    whole_need = org.pages_needed(1, 5000, 5000, r1.keys, hit)
    assert org.can_allocate(org.pages_needed(1, 1024, 5000, r1.keys, hit))
    assert whole_need.pages == (20,) and not org.can_allocate(whole_need)
    batch = sched.schedule()
    assert sorted({i.req.rid for i in batch.items}) == admitted
    if whole:
        assert batch.wait_reason == "memory" and sched.refusal(1099) == "memory"
    else:
        assert (batch.items[-1].start, batch.items[-1].end) == (0, 1024)


def test_the_run_config_chooses_the_admission_rule():
    from common.errors import HbenchError
    from harness.config import RunConfig

    assert not SchedulerPolicy.from_config(RunConfig()).admit_whole_input
    assert SchedulerPolicy.from_config(RunConfig(admission="whole-input")).admit_whole_input
    with pytest.raises(HbenchError, match="unknown --admission 'some'"):
        RunConfig(admission="some")


def _vllm_s0(pages=60, **policy):
    org = build_organization(layout_for("s0", GEOM, "vllm-gpu"), (pages,))
    return org, Scheduler(org, SchedulerPolicy(**policy))


def test_a_hit_on_a_state_cached_in_the_same_step_waits_a_step():
    """In a CUDA vLLM's 1,568-token blocks: r0's one chunk (its 3,300-token
    prompt) exports the state at the edge 3,136, the last before the prompt's
    end, into an extra block vLLM registers when it allocates it; r1, sharing
    those 3,136 tokens and admitted behind it in the same step, would hit a
    state not computed yet, so it waits a step and then adopts it."""
    shared = prompt(3200)
    org, sched = _vllm_s0()
    sched.add(0, 0.0, shared + prompt(100, 50_000), 5, None)
    sched.add(1, 0.0, shared + prompt(100, 60_000), 5, None)
    batch = sched.schedule()
    assert [(i.req.rid, i.start, i.end) for i in batch.items] == [(0, 0, 3300)]
    assert [r.rid for r in sched.waiting] == [1] and batch.wait_reason == "memory"
    sched.complete(batch, 0.01)
    batch = sched.schedule()
    assert [(i.req.rid, i.start) for i in batch.items if i.req.rid == 1] == [(1, 3136)]


def test_two_hits_on_one_cached_state_in_one_step_are_admitted_a_step_apart():
    """r1 adopts the state at its replay edge 3,136 and its chunk ends its
    prefill in that edge's block, so vLLM registers the adopted state again
    (``MambaManager._cache_partial_tail_block``) and r2, hitting that state
    in the same step, waits a step, with pages to spare."""
    shared = prompt(3200)
    org, sched = _vllm_s0()
    sched.add(0, 0.0, shared + prompt(100, 50_000), 1, None)
    drive(sched)
    sched.add(1, 1.0, shared + prompt(100, 60_000), 5, None)
    sched.add(2, 1.0, shared + prompt(100, 70_000), 5, None)
    batch = sched.schedule()
    assert [(i.req.rid, i.start) for i in batch.items] == [(1, 3136)]
    assert [r.rid for r in sched.waiting] == [2] and batch.wait_reason == "memory"
    sched.complete(batch, 1.01)
    batch = sched.schedule()
    assert (2, 3136) in [(i.req.rid, i.start) for i in batch.items]


def test_a_hit_on_the_state_registered_again_when_a_prefill_ends_waits_a_step():
    """r0's 3,300-token prompt in 3,200-token steps: its first chunk ends at
    the replay edge 3,136 (the budget's last edge), which caches the state
    there; its second chunk, [3,136, 3,300), ends the prefill and vLLM
    registers that state again (``MambaManager._cache_partial_tail_block``),
    so r1, sharing those 3,136 tokens and hitting the state in that step,
    waits a step although the state was cached a step earlier."""
    shared = prompt(3200)
    org, sched = _vllm_s0(token_budget=3200)
    sched.add(0, 0.0, shared + prompt(100, 50_000), 5, None)
    batch = sched.schedule()
    assert [(i.req.rid, i.start, i.end) for i in batch.items] == [(0, 0, 3136)]
    sched.complete(batch, 0.01)
    sched.add(1, 0.01, shared + prompt(100, 60_000), 5, None)
    r1 = sched.requests[1]
    assert org.lookup(r1.keys, len(r1.tokens) - 1).j_adopt == 3136
    batch = sched.schedule()
    assert [(i.req.rid, i.start, i.end) for i in batch.items] == [(0, 3136, 3300)]
    assert [r.rid for r in sched.waiting] == [1] and batch.wait_reason == "memory"
    sched.complete(batch, 0.02)
    batch = sched.schedule()
    assert [(i.req.rid, i.start) for i in batch.items] == [(0, 3300), (1, 3136)]


def test_a_state_adopted_short_of_the_replay_edge_is_not_registered_again():
    """r1 adopts the state at 3,136 and its chunk goes on to its prompt's end
    (4,800 tokens, replay edge 4,704): vLLM counts the hit's blocks as cached
    when it adds them (``add_local_computed_blocks``), so it registers no
    state at 3,136 in that step, and r2, hitting the same state, is admitted
    in the same step."""
    shared = prompt(3200)
    org, sched = _vllm_s0()
    sched.add(0, 0.0, shared + prompt(100, 50_000), 1, None)
    drive(sched)
    sched.add(1, 1.0, shared + prompt(1600, 60_000), 5, None)
    sched.add(2, 1.0, shared + prompt(100, 70_000), 5, None)
    batch = sched.schedule()
    assert [(i.req.rid, i.start, i.end) for i in batch.items] == [(1, 3136, 4800),
                                                                   (2, 3136, 3300)]
