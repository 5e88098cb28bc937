"""Falcon-H1 hyper-parameters read from a model directory's config.json.

Every muP multiplier Falcon-H1 defines is a field here, with where the
forward pass applies it (as transformers' ``FalconH1`` modelling code does):

    embedding_multiplier      embeddings x m, before the first layer
    attention_in_multiplier   the attention branch's input (normed hidden) x m
    key_multiplier            keys x m (before RoPE; RoPE is linear)
    attention_out_multiplier  attention branch output (after o_proj) x m
    ssm_in_multiplier         the Mamba branch's input (normed hidden) x m
    ssm_multipliers[0..4]     in_proj output segments z, x, B, C, dt x m_i
    ssm_out_multiplier        Mamba branch output (after out_proj) x m
    mlp_multipliers[0, 1]     gate_proj output x m0 (inside SiLU), down_proj output x m1
    lm_head_multiplier        logits x m

``mamba_rms_norm`` selects a gated RMSNorm (weights ``mamba.norm.weight``,
per ``mamba_n_groups`` group, gate before or after the norm by
``mamba_norm_before_gate``) instead of a plain SiLU gate. ``time_step_limit``
clamps dt after the softplus.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from common.errors import HbenchError


@dataclass(frozen=True)
class FalconH1Config:
    """Dimensions, flags and multipliers of one Falcon-H1 checkpoint."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    mamba_d_ssm: int
    mamba_n_heads: int
    mamba_d_head: int
    mamba_d_state: int
    mamba_n_groups: int = 1
    mamba_d_conv: int = 4
    mamba_chunk_size: int = 256
    mamba_conv_bias: bool = True
    mamba_proj_bias: bool = False
    mamba_rms_norm: bool = False
    mamba_norm_before_gate: bool = True
    projectors_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    time_step_limit: tuple[float, float] = (0.0, math.inf)
    tie_word_embeddings: bool = False
    embedding_multiplier: float = 1.0
    attention_in_multiplier: float = 1.0
    key_multiplier: float = 1.0
    attention_out_multiplier: float = 1.0
    ssm_in_multiplier: float = 1.0
    ssm_out_multiplier: float = 1.0
    ssm_multipliers: tuple[float, float, float, float, float] = (1.0, 1.0, 1.0, 1.0, 1.0)
    mlp_multipliers: tuple[float, float] = (1.0, 1.0)
    lm_head_multiplier: float = 1.0

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise HbenchError(f"num_attention_heads {self.num_attention_heads} is not a multiple "
                              f"of num_key_value_heads {self.num_key_value_heads}")
        if self.mamba_n_heads * self.mamba_d_head != self.mamba_d_ssm:
            raise HbenchError(f"mamba_n_heads x mamba_d_head = {self.mamba_n_heads} x "
                              f"{self.mamba_d_head} != mamba_d_ssm {self.mamba_d_ssm}")
        if self.mamba_n_heads % self.mamba_n_groups:
            raise HbenchError(f"mamba_n_heads {self.mamba_n_heads} is not a multiple of "
                              f"mamba_n_groups {self.mamba_n_groups}")
        if self.head_dim % 2:
            raise HbenchError(f"head_dim {self.head_dim} must be even for rotary embeddings")
        if len(self.ssm_multipliers) != 5 or len(self.mlp_multipliers) != 2:
            raise HbenchError("ssm_multipliers needs 5 values (z, x, B, C, dt) and "
                              "mlp_multipliers 2 (gate, down)")

    # ---- derived sizes ---------------------------------------------------
    @property
    def kv_groups(self) -> int:
        """Query heads per K/V head (grouped-query attention)."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv: x, B and C."""
        return self.mamba_d_ssm + 2 * self.mamba_n_groups * self.mamba_d_state

    @property
    def conv_width(self) -> int:
        """Inputs a conv state keeps: the last d_conv - 1."""
        return self.mamba_d_conv - 1

    @property
    def in_proj_split(self) -> tuple[int, int, int, int, int]:
        """Widths of in_proj's output segments z, x, B, C, dt."""
        gn = self.mamba_n_groups * self.mamba_d_state
        return (self.mamba_d_ssm, self.mamba_d_ssm, gn, gn, self.mamba_n_heads)

    @classmethod
    def from_dict(cls, cfg: dict) -> FalconH1Config:
        """Build from a parsed config.json; a missing or unsupported field is an HbenchError."""
        if cfg.get("model_type") != "falcon_h1":
            raise HbenchError(f"model_type {cfg.get('model_type')!r} is not falcon_h1")
        if cfg.get("hidden_act", "silu") != "silu":
            raise HbenchError(f"hidden_act {cfg['hidden_act']!r} is not supported (silu only)")
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise HbenchError(f"rope type {rope.get('rope_type', rope.get('type'))!r} "
                              "is not supported (default RoPE only)")
        try:
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            m_heads = int(cfg["mamba_n_heads"])
            d_ssm = cfg.get("mamba_d_ssm") or int(cfg.get("mamba_expand", 2)) * hidden
            d_head = cfg.get("mamba_d_head", "auto")
            d_head = d_ssm // m_heads if d_head in (None, "auto") else int(d_head)
            limit = cfg.get("time_step_limit") or (0.0, math.inf)
            return cls(
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_hidden_layers=int(cfg["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                mamba_d_ssm=int(d_ssm),
                mamba_n_heads=m_heads,
                mamba_d_head=d_head,
                mamba_d_state=int(cfg["mamba_d_state"]),
                mamba_n_groups=int(cfg.get("mamba_n_groups", 1)),
                mamba_d_conv=int(cfg.get("mamba_d_conv", 4)),
                mamba_chunk_size=int(cfg.get("mamba_chunk_size", 256)),
                mamba_conv_bias=bool(cfg.get("mamba_conv_bias", True)),
                mamba_proj_bias=bool(cfg.get("mamba_proj_bias", False)),
                mamba_rms_norm=bool(cfg.get("mamba_rms_norm", False)),
                mamba_norm_before_gate=bool(cfg.get("mamba_norm_before_gate", True)),
                projectors_bias=bool(cfg.get("projectors_bias", False)),
                attention_bias=bool(cfg.get("attention_bias", False)),
                mlp_bias=bool(cfg.get("mlp_bias", False)),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
                rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
                time_step_limit=(float(limit[0]), float(limit[1])),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                embedding_multiplier=float(cfg.get("embedding_multiplier", 1.0)),
                attention_in_multiplier=float(cfg.get("attention_in_multiplier", 1.0)),
                key_multiplier=float(cfg.get("key_multiplier", 1.0)),
                attention_out_multiplier=float(cfg.get("attention_out_multiplier", 1.0)),
                ssm_in_multiplier=float(cfg.get("ssm_in_multiplier", 1.0)),
                ssm_out_multiplier=float(cfg.get("ssm_out_multiplier", 1.0)),
                ssm_multipliers=tuple(float(m) for m in
                                      cfg.get("ssm_multipliers") or (1.0,) * 5),
                mlp_multipliers=tuple(float(m) for m in cfg.get("mlp_multipliers") or (1.0, 1.0)),
                lm_head_multiplier=float(cfg.get("lm_head_multiplier", 1.0)),
            )
        except KeyError as exc:
            raise HbenchError(f"falcon_h1 config.json lacks required field {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise HbenchError(f"malformed falcon_h1 config.json: {exc}") from None

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> FalconH1Config:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise HbenchError(f"config file not found: {path}")
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except json.JSONDecodeError as exc:
            raise HbenchError(f"{path} is not valid JSON: {exc}") from None
