"""U0's and e0's pools in the torch engine: one buffer of the region's bytes,
the two pools at its two ends (`adapters.torch.region`), and the same
bytes for every organization at a budget."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from adapters.torch.config import FalconH1Config  # noqa: E402
from adapters.torch.paging import StateShapes  # noqa: E402
from adapters.torch.pools import Pools  # noqa: E402
from adapters.torch.region import RegionSlots, region_views  # noqa: E402
from harness.config import ORG_NAMES, RunConfig  # noqa: E402
from harness.orgs import build_organization  # noqa: E402
from harness.orgs.values import PoolInfo, RegionCapacity  # noqa: E402
from harness.run_setup import validate  # noqa: E402

A, C, LAYERS = 6, 10, 2      # page elements (unit 1) and layers of the hand-made region
REGION = RegionCapacity(40, (PoolInfo("attention", 40 // A, A), PoolInfo("checkpoint", 40 // C, C)))


class FakeRegionOrg:
    """The two views `RegionSlots` reads: page ids outside each pool, page states."""

    def __init__(self, inside: tuple[set, set]):
        self.inside = inside
        self.full: set = set()            # (pool, page) of pages holding content

    def outside_pages(self, pool):
        return frozenset(range(REGION.pools[pool].pages)) - self.inside[pool]

    def page_state(self, ref):
        return "referenced" if (ref.pool, ref.page) in self.full else "empty"

    def page_slots(self, pool):
        return None                       # the engine places the pages (as for e0)


class PlacingOrg(FakeRegionOrg):
    """An organization that places its pages itself (u0): ``slots[pool]`` lists
    the page ids by slot from the pool's end."""

    def __init__(self, slots: tuple[list, list]):
        super().__init__((set(slots[0]), set(slots[1])))
        self.slots = slots

    def page_slots(self, pool):
        return tuple(self.slots[pool])

    def page_lifecycle(self, pool):
        """No page handed out anew here: generations stay 0."""
        n = REGION.pools[pool].pages
        return (0,) * n, frozenset(p for p in range(n) if (pool, p) not in self.full)


def region(org):
    storage = torch.zeros(REGION.region_bytes * LAYERS)
    views = region_views(storage, REGION, LAYERS, 1)
    return storage, views, RegionSlots(org, views, REGION)


def fill(views, slots, org, pool, page, value):
    views[pool][slots.row(pool, page)] = value
    org.full.add((pool, page))


def spans(views, slots, org):
    """Element ranges of the storage each page in a pool occupies."""
    out = []
    for k in (0, 1):
        base = views[0].data_ptr()
        size = views[k].element_size()
        for page in org.inside[k]:
            row = views[k][slots.row(k, page)]
            start = (row.data_ptr() - base) // size
            out.append((start, start + row.numel()))
    return sorted(out)


def test_the_two_ends_are_views_of_one_buffer():
    storage, views, _ = region(FakeRegionOrg((set(), set())))
    assert views[0].shape == (6, LAYERS, A) and views[1].shape == (4, LAYERS, C)
    assert views[0].data_ptr() == storage.data_ptr()
    # checkpoint slot 0 is the last page of the buffer
    last = views[1][views[1].shape[0] - 1]
    assert last.data_ptr() + last.numel() * 4 == storage.data_ptr() + storage.numel() * 4


def test_a_side_growing_and_shrinking_at_its_end_keeps_every_page_in_place():
    """Pages given back and grown at a side's end: slot = id and no copy."""
    org = FakeRegionOrg(({0, 1, 2}, {0}))
    _, views, slots = region(org)
    assert [slots.row(0, p) for p in (0, 1, 2)] == [0, 1, 2] and slots.row(1, 0) == 3
    org.inside[0].discard(2)
    org.inside[1].add(1)                   # 2 x 6 + 2 x 10 <= 40
    slots.sync()
    assert slots.row(0, 2) is None and slots.row(1, 1) == 2 and slots.relocations == 0
    assert slots.counters() == {"region_pages_grown": {"attention": 0, "checkpoint": 1},
                                "region_pages_given_back": {"attention": 1, "checkpoint": 0},
                                "region_relocations": 0}


def test_a_page_leaving_the_middle_is_filled_from_the_end_with_its_content():
    """E0's moves: attention gives up pages 0 and 2 (of 0..3) and the checkpoint
    pool grows by one. Page 3 (content) moves into slot 0 (one copy); page 1
    keeps its slot; the new checkpoint page lies where nothing is in use."""
    org = FakeRegionOrg(({0, 1, 2, 3}, {0}))
    _, views, slots = region(org)
    for page in (1, 3):
        fill(views, slots, org, 0, page, float(10 + page))
    fill(views, slots, org, 1, 0, 99.0)
    org.inside[0].difference_update({0, 2})
    org.inside[1].add(1)
    slots.sync()
    assert slots.relocations == 1
    assert slots.row(0, 3) == 0 and slots.row(0, 1) == 1
    assert (views[0][slots.row(0, 3)] == 13.0).all() and (views[0][slots.row(0, 1)] == 11.0).all()
    assert (views[1][slots.row(1, 0)] == 99.0).all()
    ranges = spans(views, slots, org)
    assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:], strict=False)), ranges


def test_pages_placed_by_the_organization_are_copied_to_their_new_slots():
    """U0 compacts its attention side: of pages 0-3 (slots 0-3), pages 0 and 1
    become holes and are given back; page 3 (content) moves into slot 0 and
    page 2 (content) into slot 1, both copied; nothing else moves."""
    org = PlacingOrg(([0, 1, 2, 3], [0]))
    _, views, slots = region(org)
    for page in (2, 3):
        fill(views, slots, org, 0, page, float(10 + page))
    fill(views, slots, org, 1, 0, 99.0)
    org.slots[0][:] = [3, 2]
    org.inside[0].difference_update({0, 1})
    slots.sync()
    assert slots.relocations == 2
    assert slots.row(0, 3) == 0 and slots.row(0, 2) == 1 and slots.row(0, 0) is None
    assert (views[0][0] == 13.0).all() and (views[0][1] == 12.0).all()
    assert (views[1][slots.row(1, 0)] == 99.0).all()
    assert slots.counters()["region_pages_given_back"] == {"attention": 2, "checkpoint": 0}


def test_an_empty_page_is_moved_without_a_copy():
    org = FakeRegionOrg(({0, 1, 2}, set()))
    _, _, slots = region(org)
    org.inside[0].discard(0)
    slots.sync()
    assert slots.row(0, 2) == 0 and slots.relocations == 0


def test_overlapping_ends_are_refused():
    org = FakeRegionOrg(({0, 1}, {0}))
    _, _, slots = region(org)
    org.inside[1].update({1, 2})          # 2 x 6 + 3 x 10 > 40
    with pytest.raises(AssertionError, match="overlap"):
        slots.sync()


def setup_for(model_dir, org, budget="b12"):
    return validate(RunConfig(engine="torch", org=org, budget=budget, model=str(model_dir),
                              config_path=str(model_dir / "config.json")))


@pytest.mark.parametrize("budget", ["b8", "b12", "b40"])
def test_every_organization_allocates_the_budgets_bytes_within_one_page(model_dir, budget):
    """The pools' physical bytes, float32 (twice the bf16 bytes accounted), are
    the budget's bytes less under one page of the organization's largest page;
    u0 and e0 allocate their region once, not a pool per kind."""
    shapes = StateShapes.of(FalconH1Config.from_dir(model_dir))
    for name in ORG_NAMES:
        setup = setup_for(model_dir, name, budget)
        org = build_organization(setup.layout, tuple(p.pages for p in setup.budget.pools))
        pools = Pools(org.capacity(), shapes, 2, torch.float32, "cpu", region=org.region(), org=org)
        target = 2 * setup.budget.target_bytes * shapes.n_layers
        page = 2 * max(p.page_bytes for p in org.capacity().pools) * shapes.n_layers
        assert target - page < pools.physical_bytes <= target, (name, pools.physical_bytes, target)
        accounted = sum(p.pages * p.page_bytes for p in setup.budget.pools)
        assert pools.physical_bytes == 2 * accounted * shapes.n_layers, name


@pytest.mark.slow
def test_u0_s_compaction_moves_real_pages_and_continuation_still_matches(model_dir):
    """U0 at b6, 8 requests of ~2,000 tokens over 3 contexts: a side is
    compacted, the engine copies every page the organization moved (as many
    relocations as moved pages), and every continuation from an adopted
    checkpoint equals a clean recomputation token for token."""
    import dataclasses

    from adapters.torch.continuation import verify_config, verify_continuation

    config = dataclasses.replace(verify_config("u0", str(model_dir), budget="b6"), requests=8,
                                 max_output=3, mean_input=2000, contexts=3)
    rep = verify_continuation(config, kernels=False)
    assert rep.all_identical, [c.describe() for c in rep.checks]
    assert rep.stats["adopted_requests"] > 0 and rep.stats["compactions"] > 0
    assert rep.stats["region_relocations"] == rep.stats["compaction_moved_pages"] > 0
