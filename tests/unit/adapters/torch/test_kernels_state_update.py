"""The state kernels against the torch reference, on every organization's layout.

Each case lays ``b`` requests' states over a small pool the way one
organization does (S0 and D0: one page with the conv state inline; S1: three
SSM member pages and a conv page; S2: three member pages and a slot of a
16-slot slab), on pages drawn in a random order. The reference gathers each
state with the engine's own extent copies (`Pools.gather`, independent of the
kernels' page tables), runs the torch step and scatters it back; the kernel
runs on the pool in place. Both pools must then agree everywhere, untouched
pages included, and so must the outputs.

The kernels run on CPU tensors through Triton's interpreter.
"""

from __future__ import annotations

import os
import zlib

import pytest

os.environ["TRITON_INTERPRET"] = "1"      # before triton is first imported
torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from adapters.torch.kernels.conv_update import (  # noqa: E402
    conv_update_dense,
    conv_update_paged,
    conv_update_reference,
)
from adapters.torch.kernels.ssm_update import (  # noqa: E402
    ssm_update_dense,
    ssm_update_paged,
    ssm_update_reference,
)
from adapters.torch.kernels.tables import NO_STATE, PAGES, SLOT, build_tables  # noqa: E402
from adapters.torch.paging import StateShapes  # noqa: E402
from adapters.torch.pools import Pools  # noqa: E402
from harness.orgs.values import (  # noqa: E402
    Capacity,
    ConvInline,
    ConvPages,
    ConvSlot,
    PoolInfo,
    StatePlacement,
)
from tests.support.floats import U_BFLOAT16, within  # noqa: E402
from tests.support.mamba import conv_step_tolerance, ssm_step_tolerances  # noqa: E402

UNIT = 2                     # geometry bytes per element (bf16), as the engine's pools
H, P, N, G = 4, 8, 16, 2     # SSM: 512 elements per layer
CONV_C, CONV_W = 12, 3       # conv: 36 elements per layer
SHAPES = StateShapes(n_layers=2, kv_heads=1, head_dim=2, ssm_heads=H, ssm_head_dim=P,
                     d_state=N, conv_dim=CONV_C, conv_width=CONV_W)
SSM_BYTES, CONV_BYTES = SHAPES.ssm_elems * UNIT, SHAPES.conv_elems * UNIT
SLOT_BYTES = 40 * UNIT       # 40-element slots: 36 used, as S2's 32 KiB slot holds 21 KiB
LAYER = 1                    # the second layer: offsets must include the layer stride


def _placements(org: str, b: int, page_elems: int, rng: torch.Generator):
    """``b`` placements of ``org``'s kind on randomly permuted pages of one
    pool, and the pool's page count. S2 puts two requests in one slab (its
    first and last slots) and one in another slab."""
    page_bytes = page_elems * UNIT
    members = -(-SSM_BYTES // page_bytes)
    per = {"s0": 1, "d0": 1, "s1": members + 1, "s2": members}[org]
    pages = 2 + per * b + 2
    order = torch.randperm(pages, generator=rng).tolist()
    out = []
    if org == "s2":
        slabs, order = order[:2], order[2:]
    for r in range(b):
        mine = order[r * per:(r + 1) * per]
        if org in ("s0", "d0"):
            out.append(StatePlacement(0, ((mine[0], SSM_BYTES),), ConvInline(mine[0], SSM_BYTES)))
            continue
        ssm = tuple((page, min(page_bytes, SSM_BYTES - i * page_bytes))
                    for i, page in enumerate(mine[:members]))
        if org == "s1":
            conv = ConvPages((mine[members],), CONV_BYTES)
        else:
            last = page_bytes // SLOT_BYTES - 1
            slab, slot = ((slabs[0], 0), (slabs[0], last), (slabs[1], 3))[r % 3]
            conv = ConvSlot(slab, slot, SLOT_BYTES)
        out.append(StatePlacement(0, ssm, conv))
    return out, pages


def _pools(pages: int, page_elems: int, dtype, rng) -> Pools:
    cap = Capacity((PoolInfo("state", pages, page_elems * UNIT),), attn_block_tokens=1,
                   grid_tokens=16)
    pools = Pools(cap, SHAPES, UNIT, dtype, "cpu")
    pools.tensors[0].copy_(torch.randn(pools.tensors[0].shape, generator=rng))
    return pools


def _inputs(b: int, dtype, rng):
    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=rng) * scale).to(dtype)
    return dict(x=r(b, H, P), dt=r(b, H), A=-torch.rand(H, generator=rng).to(dtype) - 0.1,
                B=r(b, G, N, scale=0.5), C=r(b, G, N, scale=0.5), D=r(H), dt_bias=r(H))


def _reference(pools: Pools, placements, fn, make_args):
    """Gather each present state (`Pools.gather`), run ``fn`` on the batch, scatter.
    Returns ``fn``'s output and the batch's SSM and conv states before the step."""
    present = [k for k, p in enumerate(placements) if p is not None]
    states = [pools.gather(placements[k]) for k in present]
    ssm = torch.stack([s[LAYER] for s, _ in states])
    conv = torch.stack([c[LAYER] for _, c in states])
    before = ssm.clone(), conv.clone()
    out = fn(ssm, conv, present, make_args)
    for k, (s, c) in zip(present, states, strict=True):
        s[LAYER], c[LAYER] = ssm[present.index(k)], conv[present.index(k)]
        pools.scatter(placements[k], s, c)
    return out, before


LAYOUTS = [("s0", 600), ("d0", 548), ("s1", 256), ("s1", 200), ("s2", 256), ("s2", 200)]
# page_elems: 256 keeps a program's tile in one page (one table read); 200 makes
# pages end mid-head (a table read per element); S0 600 leaves a tail unused,
# D0 548 is one checkpoint exactly.


@pytest.mark.parametrize("org,page_elems", LAYOUTS)
def test_ssm_update_on_every_layout_matches_the_reference(org, page_elems):
    rng = torch.Generator().manual_seed(zlib.crc32(f"ssm {org} {page_elems}".encode()))
    placements, pages = _placements(org, 3, page_elems, rng)
    kern = _pools(pages, page_elems, torch.float32, rng)
    ref = Pools(kern.capacity, SHAPES, UNIT, torch.float32, "cpu")
    ref.tensors[0].copy_(kern.tensors[0])
    before = kern.tensors[0].clone()
    args = _inputs(3, torch.float32, rng)
    pool, tables = kern.tables(placements)
    y = ssm_update_paged(pool[:, LAYER], tables, **args, dt_limit=(0.0, 4.0))
    want, (ssm, _) = _reference(ref, placements, lambda s, c, pr, a: ssm_update_reference(
        s, **a, dt_limit=(0.0, 4.0)), args)
    y_tol, state_tol = ssm_step_tolerances(ssm, **args, dt_limit=(0.0, 4.0))
    within(y, want, y_tol, "y")
    # the pools: untouched elements equal, updated states within the largest state bound
    within(kern.tensors[0], ref.tensors[0], float(state_tol.max()), "pool")
    assert not torch.equal(kern.tensors[0], before)       # the states were updated


@pytest.mark.parametrize("org,page_elems", LAYOUTS)
def test_conv_update_on_every_layout_matches_the_reference(org, page_elems):
    rng = torch.Generator().manual_seed(zlib.crc32(f"conv {org} {page_elems}".encode()))
    placements, pages = _placements(org, 3, page_elems, rng)
    kern = _pools(pages, page_elems, torch.float32, rng)
    ref = Pools(kern.capacity, SHAPES, UNIT, torch.float32, "cpu")
    ref.tensors[0].copy_(kern.tensors[0])
    before = kern.tensors[0].clone()
    x = torch.randn(3, CONV_C, generator=rng)
    weight = torch.randn(CONV_C, 1, CONV_W + 1, generator=rng)
    bias = torch.randn(CONV_C, generator=rng)
    pool, tables = kern.tables(placements)
    assert tables.conv_mode == (SLOT if org == "s2" else PAGES)
    out = conv_update_paged(pool[:, LAYER], tables, x, weight, bias)
    want, (_, conv) = _reference(ref, placements, lambda s, c, pr, a: conv_update_reference(
        c, x, weight, bias), None)
    within(out, want, conv_step_tolerance(conv, x, weight, bias), "conv output")
    # the new conv state is the old one shifted by one input: copies, bit-identical
    assert torch.equal(kern.tensors[0], ref.tensors[0])
    assert not torch.equal(kern.tensors[0], before)


def test_s2_conv_rows_are_slots_x_slab_plus_slot():
    placements, pages = _placements("s2", 3, 256, torch.Generator().manual_seed(1))
    tables = build_tables(placements, 256 * UNIT, UNIT, SHAPES.ssm_elems, SHAPES.conv_elems)
    slots = 256 // 40
    assert tables.slots == slots and tables.slot_elems == 40
    assert tables.conv[:, 0].tolist() == [slots * p.conv.slab + p.conv.slot for p in placements]
    assert tables.ssm.tolist() == [[page for page, _ in p.ssm] for p in placements]


@pytest.mark.parametrize("org", ["s0", "s1", "s2"])
def test_the_sentinel_reads_a_zero_state_and_writes_nothing(org):
    """A batch row with `NO_STATE` computes from the zero state and leaves every
    page alone, slab 0 / slot 0 included; the rows around it are unaffected."""
    rng = torch.Generator().manual_seed(7)
    page_elems = 600 if org == "s0" else 256
    placements, pages = _placements(org, 3, page_elems, rng)
    if org == "s2":   # the first request owns slab 0 / slot 0 of a slab whose page id is 0
        slab = placements[0].conv.slab
        swap = {slab: 0, 0: slab}
        placements = [StatePlacement(0, tuple((swap.get(pg, pg), n) for pg, n in p.ssm),
                                     ConvSlot(swap.get(p.conv.slab, p.conv.slab), p.conv.slot,
                                              p.conv.slot_bytes))
                      for p in placements]
        assert placements[0].conv.slab == 0 and placements[0].conv.slot == 0
    batch = [placements[0], None, placements[2]]
    kern = _pools(pages, page_elems, torch.float32, rng)
    ref = Pools(kern.capacity, SHAPES, UNIT, torch.float32, "cpu")
    ref.tensors[0].copy_(kern.tensors[0])
    pool, tables = kern.tables(batch)
    assert (tables.ssm[1] == NO_STATE).all() and (tables.conv[1] == NO_STATE).all()
    a = _inputs(3, torch.float32, rng)
    y = ssm_update_paged(pool[:, LAYER], tables, **a)
    x = torch.randn(3, CONV_C, generator=rng)
    weight = torch.randn(CONV_C, 1, CONV_W + 1, generator=rng)
    out = conv_update_paged(pool[:, LAYER], tables, x, weight, None)

    zero_ssm, zero_conv = torch.zeros(1, H, P, N), torch.zeros(1, CONV_C, CONV_W)
    row1 = {k: v[1:2] if v.shape[0] == 3 and v.dim() > 1 else v for k, v in a.items()}
    y1 = ssm_update_reference(zero_ssm.clone(), **row1)
    within(y[1:2], y1, ssm_step_tolerances(zero_ssm, **row1)[0], "sentinel row y")
    within(out[1:2], conv_update_reference(zero_conv.clone(), x[1:2], weight, None),
           conv_step_tolerance(zero_conv, x[1:2], weight, None), "sentinel row conv")
    # the other rows and every page: as if the sentinel row were not in the batch
    present = [0, 2]

    def both(s, c, pr, _):
        sub = {k: v[present] if v.shape[0] == 3 and v.dim() > 1 else v for k, v in a.items()}
        return ssm_update_reference(s, **sub), conv_update_reference(c, x[present], weight, None)

    (want_y, want_out), (ssm, conv) = _reference(ref, batch, both, None)
    sub = {k: v[present] if v.shape[0] == 3 and v.dim() > 1 else v for k, v in a.items()}
    y_tol, state_tol = ssm_step_tolerances(ssm, **sub)
    within(y[present], want_y, y_tol, "y")
    within(out[present], want_out, conv_step_tolerance(conv, x[present], weight, None), "conv")
    within(kern.tensors[0], ref.tensors[0], float(state_tol.max()), "pool")


def test_an_all_sentinel_batch_leaves_the_pool_bitwise_unchanged():
    rng = torch.Generator().manual_seed(3)
    placements, pages = _placements("s2", 3, 256, rng)
    kern = _pools(pages, 256, torch.float32, rng)
    before = kern.tensors[0].clone()
    tables = build_tables([placements[0], None], 256 * UNIT, UNIT, SHAPES.ssm_elems,
                          SHAPES.conv_elems)
    none = type(tables)(tables.ssm[1:], tables.conv[1:], tables.conv_mode, tables.page_elems,
                        tables.conv_base, tables.slot_elems, tables.slots)
    a = _inputs(1, torch.float32, rng)
    ssm_update_paged(kern.tensors[0][:, LAYER], none, **a)
    conv_update_paged(kern.tensors[0][:, LAYER], none, torch.randn(1, CONV_C, generator=rng),
                      torch.randn(CONV_C, 1, CONV_W + 1, generator=rng), None)
    assert torch.equal(kern.tensors[0], before)


def test_dense_kernels_match_the_reference():
    rng = torch.Generator().manual_seed(5)
    a = _inputs(4, torch.float32, rng)
    state = torch.randn(4, H, P, N, generator=rng)
    want_state = state.clone()
    y_tol, state_tol = ssm_step_tolerances(state, **a, dt_limit=(0.01, 2.0))
    y = ssm_update_dense(state, **a, dt_limit=(0.01, 2.0))
    want = ssm_update_reference(want_state, **a, dt_limit=(0.01, 2.0))
    within(y, want, y_tol, "y")
    within(state, want_state, state_tol, "state")
    conv = torch.randn(4, CONV_C, CONV_W, generator=rng)
    want_conv = conv.clone()
    x = torch.randn(4, CONV_C, generator=rng)
    weight, bias = torch.randn(CONV_C, 1, CONV_W + 1, generator=rng), torch.randn(CONV_C)
    out_tol = conv_step_tolerance(conv, x, weight, bias)
    out = conv_update_dense(conv, x, weight, bias)
    within(out, conv_update_reference(want_conv, x, weight, bias), out_tol, "conv output")
    assert torch.equal(conv, want_conv)          # shifted copies: bit-identical


def test_bf16_pages_match_the_float32_reference_rounded_once():
    """In bf16 (the GPU's pool dtype) the kernel computes in float32 and rounds
    the state once on store, as the reference does."""
    rng = torch.Generator().manual_seed(11)
    placements, pages = _placements("s1", 2, 256, rng)
    kern = _pools(pages, 256, torch.bfloat16, rng)
    ref = Pools(kern.capacity, SHAPES, UNIT, torch.bfloat16, "cpu")
    ref.tensors[0].copy_(kern.tensors[0])
    a = _inputs(2, torch.bfloat16, rng)
    pool, tables = kern.tables(placements)
    y = ssm_update_paged(pool[:, LAYER], tables, **a)
    want, (ssm, _) = _reference(ref, placements,
                                lambda s, c, pr, _: ssm_update_reference(s, **a), None)
    # Both compute in float32 from the same bf16 inputs and round once to bf16:
    # the float32 results differ within their bound, and each rounding to bf16
    # moves a value v by at most u_bf16 |v| <= u_bf16 / (1 - u_bf16) |rounded v|:
    # two values on either side of a rounding boundary end one bf16 ulp apart.
    y_tol, state_tol = ssm_step_tolerances(ssm, **a)
    once = 2 * U_BFLOAT16 / (1 - U_BFLOAT16)
    within(y.float(), want.float(), y_tol + once * want.float().abs(), "y")
    pool = ref.tensors[0].float()
    within(kern.tensors[0].float(), pool, float(state_tol.max()) + once * pool.abs(), "pool")


@pytest.mark.parametrize("bad,match", [
    ("mixed", "same state layout"),
    ("slot", "outside a slab"),
    ("small-slot", "cannot hold"),
])
def test_tables_refuse_what_the_address_rule_cannot_express(bad, match):
    placements, _ = _placements("s2", 2, 256, torch.Generator().manual_seed(2))
    p = placements[0]
    if bad == "mixed":
        batch = [p, StatePlacement(0, p.ssm, ConvPages((9,), CONV_BYTES))]
    elif bad == "slot":
        batch = [StatePlacement(0, p.ssm, ConvSlot(p.conv.slab, 6, SLOT_BYTES))]
    else:
        batch = [StatePlacement(0, p.ssm, ConvSlot(p.conv.slab, 0, CONV_BYTES - UNIT))]
    with pytest.raises(ValueError, match=match):
        build_tables(batch, 256 * UNIT, UNIT, SHAPES.ssm_elems, SHAPES.conv_elems)
