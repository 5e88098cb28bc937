"""Online-softmax attention over K/V blocks equals the exact softmax over the whole context."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from adapters.torch.attention import paged_attention, paged_decode_attention  # noqa: E402
from adapters.torch.paging import block_table_tensor  # noqa: E402
from tests.support.attention import attention_tolerance, exact_attention  # noqa: E402
from tests.support.floats import within  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def paged(k, v, block, rng):
    """K/V laid into a page tensor in shuffled pages; returns (kv_layer, block_table)."""
    n_blocks = math.ceil(k.shape[0] / block)
    pages = n_blocks + 3
    table = torch.randperm(pages, generator=rng)[:n_blocks].tolist()
    kv = torch.full((pages, 2, block, k.shape[1], k.shape[2]), float("nan"))
    for j, page in enumerate(table):
        part = slice(j * block, min((j + 1) * block, k.shape[0]))
        n = part.stop - part.start
        kv[page, 0, :n], kv[page, 1, :n] = k[part], v[part]
    return kv, table


@pytest.mark.parametrize("step_tokens", [1, 48], ids=["block-per-step", "pages-per-step"])
@pytest.mark.parametrize("block", [1, 5, 16, 64, 512])
@pytest.mark.parametrize("queries", ["prefill", "chunk", "decode"])
def test_online_softmax_over_blocks_equals_exact_softmax(block, queries, step_tokens):
    rng = torch.Generator().manual_seed(block * 7 + len(queries))
    ctx, heads, kv_heads, d = 150, 6, 2, 16
    # large logits so the running maximum really moves between blocks
    q = torch.randn(ctx, heads, d, generator=rng) * 3
    k = torch.randn(ctx, kv_heads, d, generator=rng) * 3
    v = torch.randn(ctx, kv_heads, d, generator=rng)
    lo = {"prefill": 0, "chunk": 97, "decode": ctx - 1}[queries]
    q_pos = torch.arange(lo, ctx)
    kv, table = paged(k, v, block, rng)  # unused page slots are NaN: reading one would show
    got = paged_attention(q[lo:], q_pos, kv, table, ctx, d ** -0.5, step_tokens=step_tokens)
    want = exact_attention(q[lo:], k, v, q_pos, d ** -0.5)
    within(got, want, attention_tolerance(q[lo:], k, v, q_pos, d ** -0.5))


def test_a_query_never_sees_a_later_key():
    """Changing keys and values after a query's position leaves its output unchanged."""
    rng = torch.Generator().manual_seed(1)
    q = torch.randn(40, 2, 8, generator=rng)
    k, v = torch.randn(40, 1, 8, generator=rng), torch.randn(40, 1, 8, generator=rng)
    kv, table = paged(k, v, 16, rng)
    before = paged_attention(q, torch.arange(40), kv, table, 40, 0.3)
    kv[table[2], :, 4:] += 5.0                    # positions 36..39 change
    after = paged_attention(q, torch.arange(40), kv, table, 40, 0.3)
    # the same arithmetic on the same values: bit-identical; a changed value: changed output
    assert torch.equal(before[:36], after[:36])
    assert not torch.equal(before[36:], after[36:])


def test_a_block_table_too_short_for_the_context_is_refused():
    kv = torch.zeros(2, 2, 16, 1, 8)
    with pytest.raises(ValueError, match="needs more than the 2 blocks"):
        paged_attention(torch.zeros(1, 1, 8), torch.tensor([32]), kv, [0, 1], 33, 1.0)


@pytest.mark.parametrize("step_tokens", [1, 48], ids=["block-per-step", "pages-per-step"])
@pytest.mark.parametrize("block", [1, 16, 64])
def test_batched_decode_attention_equals_exact_softmax_per_request(block, step_tokens):
    """Requests of different lengths in one shared pool, tables padded; stale slots do not leak."""
    rng = torch.Generator().manual_seed(block)
    heads, kv_heads, d, lengths = 4, 2, 8, [1, 17, 130, 64]
    pages = sum(math.ceil(n / block) for n in lengths) + 2
    kv = torch.randn(pages, 2, block, kv_heads, d, generator=rng) * 50   # stale, finite
    order = torch.randperm(pages, generator=rng).tolist()
    tables, ks, vs = [], [], []
    for n in lengths:
        table = [order.pop() for _ in range(math.ceil(n / block))]
        k = torch.randn(n, kv_heads, d, generator=rng) * 3
        v = torch.randn(n, kv_heads, d, generator=rng)
        for j, page in enumerate(table):
            part = slice(j * block, min((j + 1) * block, n))
            kv[page, 0, :part.stop - part.start] = k[part]
            kv[page, 1, :part.stop - part.start] = v[part]
        tables.append(table)
        ks.append(k)
        vs.append(v)
    q = torch.randn(len(lengths), heads, d, generator=rng) * 3
    pos = torch.tensor(lengths) - 1
    got = paged_decode_attention(q, pos, kv, block_table_tensor(tables), d ** -0.5,
                                 step_tokens=step_tokens)
    for r in range(len(lengths)):
        want = exact_attention(q[r:r + 1], ks[r], vs[r], pos[r:r + 1], d ** -0.5)
        within(got[r:r + 1], want,
               attention_tolerance(q[r:r + 1], ks[r], vs[r], pos[r:r + 1], d ** -0.5), f"request {r}")
