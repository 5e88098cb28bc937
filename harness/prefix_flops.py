"""FLOPs of computing a prefix: what reusing a cached prefix of J tokens saves.

Marconi's eviction utility weighs a checkpoint by the FLOPs its reuse saves
per byte of state. Those FLOPs follow from the model geometry alone, by the
same formulas the simulator's cost model prices a step with
(`adapters.sim.cost` imports `ssm_flops_per_token` and `idle_expert_params`
from here, so the two cannot drift apart):

    prefix_flops(J) = 2 x active body parameters x J          linear layers
                    + 4 x heads x head_dim x attention layers
                        x J (J + 1) / 2                       causal attention pairs
                    + SSM prefill FLOPs per token x SSM layers x J

The LM head is left out: a reused prefix still ends in a computed token.
"""

from __future__ import annotations

#: Mamba-2 SSD chunk length when no cost constants say otherwise
#: (transformers' FalconH1Config default ``mamba_chunk_size``).
SSD_CHUNK_SIZE = 256


def ssm_flops_per_token(g, chunk_size: int) -> tuple[float, float]:
    """(prefill, decode) FLOPs of the SSM scan + conv for one token in one layer.

    Mamba-2 prefill uses the SSD chunked algorithm (chunk length Q, state N,
    head dim P, H heads, G groups); per token, counting a multiply-add as 2:
    C B^T within the chunk 2GQN, its masked product with X 2HQP, the chunk
    state B^T X 2HNP and the output from carried states C h 2HNP. Decode is the
    recurrence h = a h + x B^T, y = C h: about 5 FLOPs per state element (HPN).
    Mamba-1 scans recurrently in both phases: about 7 FLOPs per state element
    (d_inner x N): exp(dt A) 2, a h + (dt B) x 3, C h accumulate 2.
    The causal conv adds 2 x channels x d_conv to both.
    """
    n = g.ssm_d_state
    if g.ssm_kind == "mamba1":
        conv = 2 * g.ssm_d_inner * g.ssm_d_conv
        scan = 7 * g.ssm_d_inner * n + conv
        return float(scan), float(scan)
    h, p, q, grp = g.ssm_n_heads, g.ssm_head_dim, chunk_size, g.ssm_n_groups
    conv = 2 * (g.ssm_d_inner + 2 * grp * n) * g.ssm_d_conv
    prefill = 2 * (grp * q * n + h * q * p + 2 * h * n * p) + conv
    decode = 5 * h * p * n + conv
    return float(prefill), float(decode)


def _expert_params(g) -> int:
    mats = 3 if getattr(g, "mlp_gated", True) else 2
    width = getattr(g, "moe_intermediate_size", 0) or g.intermediate_size
    return mats * g.hidden_size * width


def idle_expert_params(g) -> int:
    """Routed-expert parameters a token does not multiply by.

    The routed count per token is ``extra["num_experts_per_tok"]`` when a
    builder recorded it, else all experts (an upper bound on compute).
    """
    if not g.n_moe_layers or g.n_experts <= 1:
        return 0
    routed = g.extra.get("num_experts_per_tok", g.n_experts)
    return g.n_moe_layers * (g.n_experts - routed) * _expert_params(g)


def active_body_params(g) -> int:
    """Parameters one token multiplies by, outside the embedding and LM head."""
    b = g.param_breakdown()
    return sum(b.values()) - b["embeddings"] - b["lm_head"] - idle_expert_params(g)


def prefix_flops(g, tokens: int, chunk_size: int = SSD_CHUNK_SIZE) -> float:
    """FLOPs of prefilling the first ``tokens`` tokens of a prompt (see module docstring)."""
    if tokens <= 0:
        return 0.0
    linear = 2.0 * active_body_params(g) * tokens
    attn = 4.0 * g.num_attention_heads * g.head_dim * g.n_attn_layers * tokens * (tokens + 1) / 2
    scan = ssm_flops_per_token(g, chunk_size)[0] * g.n_ssm_layers * tokens if g.n_ssm_layers else 0.0
    return linear + attn + scan
