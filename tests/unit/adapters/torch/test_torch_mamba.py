"""The Mamba-2 pieces: SSD scan == token-by-token recurrence, conv state carried across calls."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from adapters.torch.config import FalconH1Config  # noqa: E402
from adapters.torch.mamba import (  # noqa: E402
    causal_conv,
    mixer,
    mup_vector,
    sequential_scan,
    ssd_scan,
    ssm_step,
)
from tests.support.floats import gamma, sum_tolerance, within  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def scan_inputs(b=2, T=37, H=4, P=3, G=2, N=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, T, H, P, generator=g)
    dt = torch.nn.functional.softplus(torch.randn(b, T, H, generator=g))
    A = -torch.rand(H, generator=g) * 2 - 0.1
    B, C = torch.randn(b, T, G, N, generator=g), torch.randn(b, T, G, N, generator=g)
    state = torch.randn(b, H, P, N, generator=g)
    return x, dt, A, B, C, state


@pytest.mark.parametrize("chunk", [1, 4, 16, 37, 64])
def test_ssd_scan_equals_the_sequential_recurrence(chunk):
    x, dt, A, B, C, state = scan_inputs()
    y_seq, s_seq = sequential_scan(x, dt, A, B, C, state)
    y_ssd, s_ssd = ssd_scan(x, dt, A, B, C, state, chunk)
    # Each output is a sum of terms (C.B x or C.state, decayed): the recurrence on
    # absolute values gives the sum of their magnitudes. A term passes through at
    # most T decay products and an N-term dot (T + N roundings); its decay is exp of
    # a cumulative sum of dt A (T roundings), whose absolute error, up to
    # gamma(T) * sum |dt A|, is the decay's relative error.
    T, N = x.shape[1], B.shape[-1]
    y_abs, s_abs = sequential_scan(x.abs(), dt, A, B.abs(), C.abs(), state.abs())
    exponent = gamma(T) * float((dt * A.abs()).sum(dim=1).max())
    within(y_ssd, y_seq, sum_tolerance(y_abs, T + N) + y_abs * exponent, "y")
    within(s_ssd, s_seq, sum_tolerance(s_abs, T + N) + s_abs * exponent, "state")


def test_one_step_is_the_recurrence_written_out():
    x, dt, A, B, C, state = scan_inputs(b=1, T=1, H=2, P=1, G=1, N=2)
    y, new = ssm_step(x[:, 0], dt[:, 0], A, B[:, 0], C[:, 0], state)
    for h in range(2):
        d = dt[0, 0, h]
        want_state = torch.exp(d * A[h]) * state[0, h, 0] + d * x[0, 0, h, 0] * B[0, 0, 0]
        # the same formula, written out: exp, a product and a sum (3 roundings)
        # for the state, then an N = 2 term dot over it (2 more) for y
        terms = (torch.exp(d * A[h]) * state[0, h, 0]).abs() + (d * x[0, 0, h, 0] * B[0, 0, 0]).abs()
        within(new[0, h, 0], want_state, sum_tolerance(terms, 4), "state")
        within(y[0, h, 0], (want_state * C[0, 0, 0]).sum(),
               sum_tolerance((terms * C[0, 0, 0].abs()).sum(), 4 + 2), "y")


def test_conv_state_carried_across_calls_equals_one_call():
    g = torch.Generator().manual_seed(3)
    channels, K = 6, 4
    xbc = torch.randn(1, 20, channels, generator=g)
    w, bias = torch.randn(channels, 1, K, generator=g), torch.randn(channels, generator=g)
    zero = torch.zeros(1, channels, K - 1)
    whole, final = causal_conv(xbc, zero, w, bias)
    pieces, state = [], zero
    for lo, hi in [(0, 1), (1, 3), (3, 11), (11, 12), (12, 20)]:  # pieces shorter than K - 1 too
        out, state = causal_conv(xbc[:, lo:hi], state, w, bias)
        pieces.append(out)
    # each output is a K-tap sum plus the bias (K + 1 roundings), the same taps either way
    taps = torch.cat([zero.transpose(1, 2), xbc], dim=1).abs().unfold(1, K, 1)  # [1, T, C, K]
    abs_terms = (taps * w[:, 0].abs()).sum(-1) + bias.abs()
    within(torch.cat(pieces, dim=1), whole, sum_tolerance(abs_terms, K + 1), "conv output")
    # the carried state is a copy of the last K - 1 inputs: no arithmetic, bit-identical
    assert torch.equal(state, final) and torch.equal(final, xbc[:, -3:].transpose(1, 2))


def small_cfg(**kw) -> FalconH1Config:
    base = dict(vocab_size=16, hidden_size=12, intermediate_size=8, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, head_dim=6, mamba_d_ssm=8,
                mamba_n_heads=4, mamba_d_head=2, mamba_d_state=3, mamba_n_groups=2,
                mamba_chunk_size=8, ssm_multipliers=(0.5, 1.5, 0.8, 1.2, 0.9))
    return FalconH1Config(**(base | kw))


def mixer_weights(cfg, seed=0):
    g = torch.Generator().manual_seed(seed)
    proj = sum(cfg.in_proj_split)
    return {"in_proj.weight": torch.randn(proj, cfg.hidden_size, generator=g) * 0.3,
            "conv1d.weight": torch.randn(cfg.conv_dim, 1, cfg.mamba_d_conv, generator=g) * 0.5,
            "conv1d.bias": torch.randn(cfg.conv_dim, generator=g) * 0.1,
            "dt_bias": torch.randn(cfg.mamba_n_heads, generator=g) * 0.1,
            "A_log": torch.rand(cfg.mamba_n_heads, generator=g),
            "D": torch.rand(cfg.mamba_n_heads, generator=g) + 0.5,
            "norm.weight": torch.rand(cfg.mamba_d_ssm, generator=g) + 0.5,
            "out_proj.weight": torch.randn(cfg.hidden_size, cfg.mamba_d_ssm, generator=g) * 0.3}


@pytest.mark.parametrize("rms_norm", [False, True])
def test_mixer_in_pieces_and_steps_equals_one_call(rms_norm):
    """Prefill chunks (SSD) then single steps, each from the state the last left, match one call."""
    cfg = small_cfg(mamba_rms_norm=rms_norm)
    w, mup = mixer_weights(cfg), mup_vector(cfg)
    h = torch.randn(1, 30, cfg.hidden_size, generator=torch.Generator().manual_seed(9))
    zero = lambda: (torch.zeros(1, 4, 2, 3), torch.zeros(1, cfg.conv_dim, 3))  # noqa: E731
    ssm, conv = zero()
    whole = mixer(h, w, cfg, mup, ssm, conv)
    s2, c2 = zero()
    parts = [mixer(h[:, lo:hi], w, cfg, mup, s2, c2) for lo, hi in [(0, 13), (13, 14), (14, 25)]]
    parts += [mixer(h[:, t:t + 1], w, cfg, mup, s2, c2) for t in range(25, 30)]
    # The conv state is in_proj's xBC rows before the conv: a hidden-size dot, then
    # the multipliers (hidden + 2 roundings), whose row count (13, 1 or 30 rows at
    # once) picks the BLAS kernel and so the summation order.
    W = w["in_proj.weight"][cfg.mamba_d_ssm:cfg.mamba_d_ssm + cfg.conv_dim]
    m = mup[cfg.mamba_d_ssm:cfg.mamba_d_ssm + cfg.conv_dim]
    rows = (h[0, -3:].abs() * cfg.ssm_in_multiplier) @ W.abs().T * m.abs()     # [3, conv_dim]
    within(c2, conv, sum_tolerance(rows.T[None], cfg.hidden_size + 2), "conv state")
    # Outputs and the SSM state pass through in_proj, the conv, the scan (chunked in
    # one, stepwise in the other: 2T + N roundings, as above), the gated norm and
    # out_proj; each rounding acts on values of the output's order with these
    # weights, so the bound is that many roundings of the largest value.
    n = cfg.hidden_size + 2 + cfg.mamba_d_conv + 1 + 2 * h.shape[1] + cfg.mamba_d_state \
        + 2 * cfg.mamba_d_ssm
    within(torch.cat(parts, dim=1), whole, sum_tolerance(float(whole.abs().max()), n), "output")
    within(s2, ssm, sum_tolerance(float(ssm.abs().max()), n), "ssm state")


def test_mup_vector_scales_each_in_proj_segment():
    cfg = small_cfg()
    # z 8, x 8, B 2 x 3, C 2 x 3, dt 4 heads
    want = torch.tensor([0.5] * 8 + [1.5] * 8 + [0.8] * 6 + [1.2] * 6 + [0.9] * 4)
    assert torch.equal(mup_vector(cfg), want)
