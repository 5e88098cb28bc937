"""Page tensors: K/V block views write through to the pool; checkpoints over several pages."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from adapters.torch.paging import (  # noqa: E402
    Extent,
    StatePlacement,
    StateShapes,
    contiguous_placement,
    gather_state,
    kv_view,
    lay_over_pages,
    page_pool,
    scatter_state,
    write_kv,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


SHAPES = StateShapes(n_layers=2, kv_heads=2, head_dim=4, ssm_heads=3, ssm_head_dim=4,
                     d_state=8, conv_dim=10, conv_width=3)


def test_sizes_are_derived_from_the_shapes():
    assert SHAPES.kv_token_elems == 16 and SHAPES.kv_block_elems(8) == 128
    assert SHAPES.ssm_elems == 96 and SHAPES.conv_elems == 30 and SHAPES.checkpoint_elems == 126


def test_kv_view_writes_through_to_the_pool_and_spans_block_boundaries():
    pool = page_pool(5, 2, 200)       # pages larger than a block (as S0's): the tail stays unused
    kv = kv_view(pool, SHAPES, 8)
    assert kv.shape == (5, 2, 2, 8, 2, 4)
    k = torch.arange(10 * 8, dtype=torch.float32).reshape(10, 2, 4) + 1
    write_kv(kv, 1, [3, 0, 4], 5, k, -k)      # positions 5..14: block 0 (page 3), block 1 (page 0)
    assert torch.equal(kv[3, 1, 0, 5:], k[:3]) and torch.equal(kv[0, 1, 0, :7], k[3:])
    assert torch.equal(kv[0, 1, 1, :7], -k[3:])
    assert torch.equal(pool[3, 1, 5 * 8:8 * 8], k[:3].flatten())    # K of page 3, layer 1
    assert pool[:, 0].abs().sum() == 0 and pool[4].abs().sum() == 0 and pool[:, :, 128:].abs().sum() == 0
    with pytest.raises(ValueError, match="blocks of 8 tokens"):
        write_kv(kv, 0, [3, 0], 14, k[:3], k[:3])


def test_lay_over_pages_fills_member_pages_in_order():
    assert lay_over_pages([7, 2, 5], 96, 40) == (Extent(7, 0, 40), Extent(2, 0, 40), Extent(5, 0, 16))
    assert lay_over_pages([4], 30, 120, offset=90) == (Extent(4, 90, 30),)
    with pytest.raises(ValueError, match="fill 3 pages"):
        lay_over_pages([7, 2], 96, 40)
    with pytest.raises(ValueError, match="outside a page"):
        lay_over_pages([1], 4, 40, offset=40)


@pytest.mark.parametrize("layout", ["unit", "members", "slot"])
def test_a_checkpoint_scattered_over_pages_gathers_back_unchanged(layout):
    pool = page_pool(8, 2, 40)
    if layout == "unit":          # one contiguous unit (D0 / S0)
        pool = page_pool(3, 2, 130)
        placement = contiguous_placement(1, SHAPES, offset=2)
    elif layout == "members":     # S1: three SSM member pages and a conv page
        placement = StatePlacement(lay_over_pages([6, 1, 3], 96, 40), lay_over_pages([0], 30, 40))
    else:                         # S2: conv state in slot 1 of a slab page of 10-element slots
        pool = page_pool(8, 2, 40)
        placement = StatePlacement(lay_over_pages([6, 1, 3], 96, 40),
                                   lay_over_pages([4, 5], 30, 40, offset=20))
    g = torch.Generator().manual_seed(0)
    ssm, conv = torch.randn(*SHAPES.ssm_shape, generator=g), torch.randn(*SHAPES.conv_shape, generator=g)
    scatter_state(pool, placement, ssm, conv)
    got_ssm, got_conv = gather_state(pool, placement, SHAPES)
    assert torch.equal(got_ssm, ssm) and torch.equal(got_conv, conv)
    written = sum(e.length for e in placement.ssm + placement.conv) * SHAPES.n_layers
    assert int((pool != 0).sum()) == written          # nothing outside the extents was touched
    got_ssm += 1                                      # gathering copies: the pool is unchanged
    assert torch.equal(gather_state(pool, placement, SHAPES)[0], ssm)
