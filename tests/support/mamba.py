"""Float32 rounding bounds for one Mamba-2 decode step, for comparing the state
kernels (Triton) with the torch reference (`tests.support.floats` says why a
bound and not a number).

Each bound is ``2 gamma(n)`` times the sum of the magnitudes of the terms,
and the magnitudes come from the reference itself run on absolute values:
the decay and dt are positive, so the reference's state and output on
``|state|, |x|, |B|, |C|, |D|`` are exactly the sums of ``|terms|``.
"""

from __future__ import annotations

import math

import torch

from adapters.torch.kernels.conv_update import conv_update_reference
from adapters.torch.kernels.ssm_update import ssm_update_reference
from tests.support.floats import sum_tolerance


def ssm_step_tolerances(state, x, dt, A, B, C, D, dt_bias, dt_limit=(0.0, math.inf)):
    """``(y_tol [b, H, P], state_tol [b, H, P, N])`` for one SSM step from ``state``.

    The new state ``exp(dt A) s + dt B x``: dt is softplus of a sum, clamped
    (3 roundings, so ``3u`` relative), ``dt A`` one more, so exp's argument is
    off by ``4u |dt A|`` and exp adds 2: the decay is within ``(4 |dt A| + 2) u``;
    ``dt B x`` takes 2 products on dt's 3, the products and the sum 2 more:
    ``n = 8 + ceil(4 max |dt A|)``. ``y = C . s' + D x`` adds an N-term dot and
    the skip (N + 2).
    """
    abs_state = state.float().abs().clone()
    y_abs = ssm_update_reference(abs_state, x.abs(), dt, A, B.abs(), C.abs(), D.abs(), dt_bias,
                                 dt_limit=dt_limit).float()
    d = torch.nn.functional.softplus(dt.float() + dt_bias.float()).clamp(*dt_limit)
    n_state = 8 + math.ceil(4 * float((d * A.float().abs()).max()))
    return (sum_tolerance(y_abs, n_state + B.shape[-1] + 2),
            sum_tolerance(abs_state, n_state))


def conv_step_tolerance(state, x, weight, bias):
    """``out_tol [b, C]`` for one conv step: a (W + 1)-tap sum plus the bias
    (W + 2 roundings), then SiLU, whose slope is below 1.1 and which rounds 3
    times more (exp, add, divide) on the output's magnitude."""
    abs_state = state.float().abs().clone()
    w_abs = weight.abs()
    b_abs = None if bias is None else bias.abs()
    # SiLU of the absolute pre-activation bounds the output's magnitude;
    # the pre-activation's own magnitude is what the conv's roundings act on
    pre = torch.cat([abs_state, x.float().abs()[:, :, None]], dim=-1)      # [b, C, W + 1]
    terms = (pre * w_abs[:, 0].float()).sum(-1) + (0 if b_abs is None else b_abs.float())
    out_abs = conv_update_reference(abs_state, x.abs(), w_abs, b_abs).float().abs()
    return 1.1 * sum_tolerance(terms, weight.shape[-1] + 1) + sum_tolerance(out_abs, 3)
