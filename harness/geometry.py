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

Reading config.json files and the presets lives in `harness.model_configs`.

Parameter counts (`ModelGeometry.param_breakdown`) follow the modules of the
transformers implementations; linear-layer biases other than conv1d's are
left out (none of the supported families uses them by default).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

from common.errors import HbenchError
from harness.layout import Grid

KIB = 1024
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass(frozen=True)
class ModelGeometry:
    """State geometry of one model. Sizes in bytes, per layer of that kind.

    ``ssm_kind`` is ``"mamba2"`` (multi-head SSD state, heads x head_dim x
    d_state) or ``"mamba1"`` (d_inner x d_state). ``n_attn_layers`` /
    ``n_ssm_layers`` count layers that hold attention KV / recurrent state.
    ``n_mlp_layers`` counts dense MLP blocks (None: one per layer) and
    ``n_moe_layers`` mixture-of-experts blocks; they matter for the weights
    only. ``dtype`` is the weights / KV / conv dtype, ``ssm_state_dtype`` the
    recurrent state's (fp32 doubles the SSM state and nothing else).
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
    # weights-only structure (param_count); state sizes never read these
    n_mlp_layers: int | None = None
    mlp_gated: bool = True
    moe_intermediate_size: int = 0
    n_shared_experts: int = 0
    shared_intermediate_size: int = 0
    ssm_dt_rank: int = 0
    ssm_norm: bool = True
    norms_per_layer: int = 2
    extra: dict = field(default_factory=dict, compare=False, hash=False)
    #: The grid the model's preset or config.json (``hbench_grid``) declares,
    #: if any (`harness.layout.grid_for`); not a size, so not compared.
    declared_grid: Grid | None = field(default=None, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES or self.ssm_state_dtype not in DTYPE_BYTES:
            raise HbenchError(
                f"unknown dtype {self.dtype!r}/{self.ssm_state_dtype!r}; "
                f"choose from {sorted(DTYPE_BYTES)}"
            )
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (isinstance(value, bool) or not isinstance(value, int)):
                raise HbenchError(f"{self.name}: {f.name} must be an integer, got {value!r}")
        if self.n_layers <= 0 or self.n_attn_layers < 0 or self.n_ssm_layers < 0:
            raise HbenchError(f"{self.name}: layer counts must be positive")
        if self.n_attn_layers > self.n_layers or self.n_ssm_layers > self.n_layers:
            raise HbenchError(
                f"{self.name}: {self.n_attn_layers} attention / {self.n_ssm_layers} SSM layers "
                f"exceed the {self.n_layers} layers"
            )
        if self.n_attn_layers == 0:
            raise HbenchError(
                f"{self.name}: no attention layers; hbench lays out attention + SSM state"
            )
        if self.ssm_kind not in ("mamba1", "mamba2"):
            raise HbenchError(f"{self.name}: unknown ssm_kind {self.ssm_kind!r}")
        need = ["hidden_size", "num_attention_heads", "num_kv_heads", "head_dim"]
        if self.n_ssm_layers:
            need += ["ssm_d_inner", "ssm_d_state", "ssm_d_conv", "ssm_n_groups"]
            need += ["ssm_n_heads", "ssm_head_dim"] if self.ssm_kind == "mamba2" else []
        bad = [n for n in need if getattr(self, n) <= 0]
        if bad:
            raise HbenchError(f"{self.name}: {', '.join(bad)} must be positive")

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
    def conv_channels(self) -> int:
        """Channels the causal conv1d sees: x (and, for Mamba-2, B and C)."""
        channels = self.ssm_d_inner
        if self.ssm_kind == "mamba2":
            channels += 2 * self.ssm_n_groups * self.ssm_d_state
        return channels

    @property
    def conv_state_bytes(self) -> int:
        """Convolution state (last d_conv - 1 inputs) in one SSM layer."""
        if self.n_ssm_layers == 0:
            return 0
        return self.conv_channels * (self.ssm_d_conv - 1) * self.dtype_bytes

    @property
    def checkpoint_bytes(self) -> int:
        """A checkpoint: SSM + conv state at one token position, one layer."""
        return self.ssm_state_bytes + self.conv_state_bytes

    @property
    def is_hybrid(self) -> bool:
        return self.n_attn_layers > 0 and self.n_ssm_layers > 0

    # ---- whole-model totals ------------------------------------------------
    @property
    def model_attn_bytes_per_token(self) -> int:
        """Attention KV of one token over all attention layers."""
        return self.attn_bytes_per_token * self.n_attn_layers

    @property
    def model_ssm_state_bytes(self) -> int:
        return self.ssm_state_bytes * self.n_ssm_layers

    @property
    def model_conv_state_bytes(self) -> int:
        return self.conv_state_bytes * self.n_ssm_layers

    @property
    def model_checkpoint_bytes(self) -> int:
        """One checkpoint over all SSM layers (what a request's live state costs)."""
        return self.checkpoint_bytes * self.n_ssm_layers

    @property
    def mlp_layers(self) -> int:
        return self.n_layers if self.n_mlp_layers is None else self.n_mlp_layers

    @property
    def layer_counts(self) -> dict[str, int]:
        """Blocks of each kind. A parallel hybrid counts a layer in several kinds."""
        return {
            "layers": self.n_layers,
            "attention": self.n_attn_layers,
            "ssm": self.n_ssm_layers,
            "mlp": self.mlp_layers,
            "moe": self.n_moe_layers,
            "pool_layers": self.pool_layers,
        }

    # ---- weights -------------------------------------------------------------
    def _ssm_layer_params(self) -> int:
        h, d, n = self.hidden_size, self.ssm_d_inner, self.ssm_d_state
        conv = self.conv_channels * self.ssm_d_conv + self.conv_channels  # weight + bias
        if self.ssm_kind == "mamba1":
            r = self.ssm_dt_rank
            proj = h * 2 * d + d * (r + 2 * n) + r * d + d + d * h  # in, x, dt (+bias), out
            state = d * n + d  # A_log, D
            norm = (r + 2 * n) if self.ssm_norm else 0  # Jamba's dt/B/C layernorms
            return proj + conv + state + norm
        heads = self.ssm_n_heads
        in_proj = h * (2 * d + 2 * self.ssm_n_groups * n + heads)  # z, x, B, C, dt
        out_proj = d * h
        norm = d if self.ssm_norm else 0  # gated RMSNorm before out_proj
        return in_proj + conv + out_proj + 3 * heads + norm  # A_log, D, dt_bias

    def param_breakdown(self) -> dict[str, int]:
        """Parameters by module kind, summed over the model."""
        h = self.hidden_size
        q_width = self.num_attention_heads * self.head_dim
        attn = h * q_width + 2 * h * self.num_kv_heads * self.head_dim + q_width * h
        mats = 3 if self.mlp_gated else 2
        moe = 0
        if self.n_moe_layers:
            experts = self.n_experts * mats * h * self.moe_intermediate_size
            shared = self.n_shared_experts * mats * h * self.shared_intermediate_size
            moe = h * self.n_experts + experts + shared  # router + experts + shared experts
        embed = self.vocab_size * h
        return {
            "embeddings": embed,
            "lm_head": 0 if self.tie_word_embeddings else embed,
            "attention": attn * self.n_attn_layers,
            "ssm": self._ssm_layer_params() * self.n_ssm_layers if self.n_ssm_layers else 0,
            "mlp": mats * h * self.intermediate_size * self.mlp_layers,
            "moe": moe * self.n_moe_layers,
            "norms": (self.norms_per_layer * self.n_layers + 1) * h,
        }

    @property
    def param_count(self) -> int:
        return sum(self.param_breakdown().values())

    @property
    def weights_bytes(self) -> int:
        """Weights in ``dtype`` (the serving precision)."""
        return self.param_count * self.dtype_bytes

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
        d.pop("declared_grid")
        return d
