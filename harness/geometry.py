"""Per-layer state geometry of a hybrid model, derived from its config.json.

Every byte count hbench uses (pages, budgets, the cost model) is derived here
from a Hugging Face ``config.json``; nothing downstream stores a size twice.
DESIGN.md section 1 gives Falcon-H1-7B's numbers, which the tests re-derive.

Organizations allocate per *pool layer*: one page of a pool spans the same
offset in ``pool_layers`` layers, as vLLM V1 groups layers so that every group
has the same layer count. For a parallel hybrid such as Falcon-H1 (attention
and SSM in every layer) a pool layer is simply a layer. For an interleaved
hybrid such as Jamba (4 attention layers, 28 Mamba layers) the pool layer is
gcd(4, 28) = 4 layers, and one checkpoint spans 7 of them: the ``*_groups``
multipliers fold that into per-pool-layer sizes.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.errors import HbenchError

KIB = 1024
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass(frozen=True)
class ModelGeometry:
    """State geometry of one model. Sizes in bytes, per layer of that kind.

    ``ssm_kind`` is ``"mamba2"`` (multi-head SSD state, heads x head_dim x
    d_state) or ``"mamba1"`` (d_inner x d_state). ``n_attn_layers`` /
    ``n_ssm_layers`` count layers that hold attention KV / recurrent state.
    """

    name: str
    model_type: str
    n_layers: int
    n_attn_layers: int
    n_ssm_layers: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    ssm_kind: str = "mamba2"
    ssm_d_inner: int = 0
    ssm_n_heads: int = 0
    ssm_head_dim: int = 0
    ssm_d_state: int = 0
    ssm_n_groups: int = 1
    ssm_d_conv: int = 4
    tie_word_embeddings: bool = False
    n_experts: int = 1
    n_moe_layers: int = 0
    dtype: str = "bf16"
    ssm_state_dtype: str = "bf16"
    max_position_embeddings: int = 0
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES or self.ssm_state_dtype not in DTYPE_BYTES:
            raise HbenchError(
                f"unknown dtype {self.dtype!r}/{self.ssm_state_dtype!r}; "
                f"choose from {sorted(DTYPE_BYTES)}"
            )
        if self.n_layers <= 0 or self.n_attn_layers < 0 or self.n_ssm_layers < 0:
            raise HbenchError(f"{self.name}: layer counts must be positive")

    # ---- per-layer sizes -------------------------------------------------
    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def attn_bytes_per_token(self) -> int:
        """K and V for one token in one attention layer."""
        return 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def ssm_state_bytes(self) -> int:
        """Recurrent (SSM) state of one request in one SSM layer."""
        b = DTYPE_BYTES[self.ssm_state_dtype]
        if self.n_ssm_layers == 0:
            return 0
        if self.ssm_kind == "mamba1":
            return self.ssm_d_inner * self.ssm_d_state * b
        return self.ssm_n_heads * self.ssm_head_dim * self.ssm_d_state * b

    @property
    def conv_state_bytes(self) -> int:
        """Convolution state (last d_conv - 1 inputs) in one SSM layer."""
        if self.n_ssm_layers == 0:
            return 0
        channels = self.ssm_d_inner
        if self.ssm_kind == "mamba2":
            channels += 2 * self.ssm_n_groups * self.ssm_d_state
        return channels * (self.ssm_d_conv - 1) * self.dtype_bytes

    @property
    def checkpoint_bytes(self) -> int:
        """A checkpoint: SSM + conv state at one token position, one layer."""
        return self.ssm_state_bytes + self.conv_state_bytes

    @property
    def is_hybrid(self) -> bool:
        return self.n_attn_layers > 0 and self.n_ssm_layers > 0

    # ---- pool layers (see module docstring) --------------------------------
    @property
    def pool_layers(self) -> int:
        if self.n_attn_layers and self.n_ssm_layers:
            return math.gcd(self.n_attn_layers, self.n_ssm_layers)
        return self.n_attn_layers or self.n_ssm_layers

    @property
    def attn_groups(self) -> int:
        return self.n_attn_layers // self.pool_layers if self.n_attn_layers else 0

    @property
    def ssm_groups(self) -> int:
        return self.n_ssm_layers // self.pool_layers if self.n_ssm_layers else 0

    @property
    def slot_attn_bytes_per_token(self) -> int:
        """Attention bytes per token per pool layer."""
        return self.attn_bytes_per_token * self.attn_groups

    @property
    def slot_ssm_bytes(self) -> int:
        return self.ssm_state_bytes * self.ssm_groups

    @property
    def slot_conv_bytes(self) -> int:
        return self.conv_state_bytes * self.ssm_groups

    @property
    def slot_checkpoint_bytes(self) -> int:
        """Checkpoint bytes per pool layer; a budget label bN is N of these."""
        return self.slot_ssm_bytes + self.slot_conv_bytes

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("extra")
        return d


def load_config(path: str | Path) -> dict:
    """Read a Hugging Face config.json (or a folder holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.exists():
        raise HbenchError(f"config file not found: {p}")
    try:
        cfg = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HbenchError(f"{p} is not valid JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise HbenchError(f"{p} does not hold a JSON object")
    return cfg


def _need(cfg: dict, key: str, source: str):
    if key not in cfg or cfg[key] is None:
        raise HbenchError(f"{source}: config.json lacks required field {key!r}")
    return cfg[key]


def from_falcon_h1(cfg: dict, name: str = "falcon_h1", **dtypes) -> ModelGeometry:
    """Falcon-H1: every layer runs attention and Mamba-2 heads in parallel."""
    src = name
    hidden = _need(cfg, "hidden_size", src)
    n_layers = _need(cfg, "num_hidden_layers", src)
    heads = _need(cfg, "num_attention_heads", src)
    head_dim = cfg.get("head_dim") or hidden // heads
    m_heads = _need(cfg, "mamba_n_heads", src)
    m_head_dim = cfg.get("mamba_d_head") or hidden * cfg.get("mamba_expand", 2) // m_heads
    d_ssm = cfg.get("mamba_d_ssm") or m_heads * m_head_dim
    return ModelGeometry(
        name=name,
        model_type="falcon_h1",
        n_layers=n_layers,
        n_attn_layers=n_layers,
        n_ssm_layers=n_layers,
        hidden_size=hidden,
        intermediate_size=_need(cfg, "intermediate_size", src),
        vocab_size=_need(cfg, "vocab_size", src),
        num_attention_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        ssm_kind="mamba2",
        ssm_d_inner=d_ssm,
        ssm_n_heads=m_heads,
        ssm_head_dim=m_head_dim,
        ssm_d_state=_need(cfg, "mamba_d_state", src),
        ssm_n_groups=cfg.get("mamba_n_groups", 1),
        ssm_d_conv=cfg.get("mamba_d_conv", 4),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_position_embeddings=cfg.get("max_position_embeddings", 0),
        **dtypes,
    )


# model_type -> builder. Each builder takes (cfg, name, **dtypes).
BUILDERS = {
    "falcon_h1": from_falcon_h1,
}


def from_config(cfg: dict, name: str | None = None, **dtypes) -> ModelGeometry:
    """Build the geometry for any supported ``model_type``."""
    model_type = cfg.get("model_type")
    if model_type not in BUILDERS:
        raise HbenchError(
            f"unsupported model_type {model_type!r}; supported: {', '.join(sorted(BUILDERS))}"
        )
    try:
        return BUILDERS[model_type](cfg, name or model_type, **dtypes)
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        raise HbenchError(f"malformed {model_type} config: {exc}") from None


# Preset configs (the fields geometry needs, from the public config.json files).
PRESETS: dict[str, dict] = {
    "falcon-h1-7b": {
        "model_type": "falcon_h1",
        "hidden_size": 3072,
        "intermediate_size": 12288,
        "num_hidden_layers": 44,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "mamba_n_heads": 24,
        "mamba_d_head": 128,
        "mamba_d_ssm": 3072,
        "mamba_d_state": 256,
        "mamba_n_groups": 1,
        "mamba_d_conv": 4,
        "vocab_size": 130049,
        "max_position_embeddings": 262144,
        "tie_word_embeddings": False,
    },
}


def preset(name: str, **dtypes) -> ModelGeometry:
    key = name.lower()
    if key not in PRESETS:
        raise HbenchError(f"unknown model {name!r}; presets: {', '.join(sorted(PRESETS))}")
    return from_config(PRESETS[key], name=key, **dtypes)
