"""Model configs: Hugging Face ``config.json`` files and presets -> `ModelGeometry`.

Supported ``model_type`` values (see `BUILDERS`):

    falcon_h1         attention + Mamba-2 side by side in every layer
    bamba             Mamba-2 layers, attention at ``attn_layer_indices``
    nemotron_h        ``hybrid_override_pattern``: M Mamba-2, * attention,
                      - MLP, E MoE (one block per character)
    granitemoehybrid  ``layer_types``: "mamba" (Mamba-2) or "attention"
    jamba             Mamba-1 layers, attention where
                      i % attn_layer_period == attn_layer_offset
    llama, mistral,   pure attention (no SSM layers): the ledger shows their
    qwen2, qwen3      KV budget for comparison

Each builder reads only the fields geometry needs and turns a missing or
ill-typed one into a one-line `HbenchError`.

A config (or a preset) may also declare its grid, where pages and
checkpoints fall (`harness.layout.Grid`), under the key ``hbench_grid``:
``{"shared_block_tokens": 512, "dual_block_tokens": 16, "dual_grid_tokens":
1792}``. `from_config` keeps it as ``ModelGeometry.declared_grid``; a model
that declares none gets the geometry rule's (`harness.layout.rule_grid`).
Hugging Face ignores the key, so a served model directory may carry it.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from common.errors import HbenchError
from common.safe_json import load_json_object
from harness.geometry import DTYPE_BYTES, ModelGeometry
from harness.layout import Grid


def load_config(path: str | Path) -> dict:
    """Read a Hugging Face config.json (or a folder holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.exists() and not p.is_symlink():
        raise HbenchError(f"config file not found: {p}")
    return load_json_object(p, "config file")


_MISSING = object()


def _need(cfg: dict, key: str, source: str):
    if key not in cfg or cfg[key] is None:
        raise HbenchError(f"{source}: config.json lacks required field {key!r}")
    return cfg[key]


def _int(cfg: dict, keys: str | tuple[str, ...], src: str, default=_MISSING, auto=None,
         minimum: int = 1) -> int:
    """The first of ``keys`` present in ``cfg`` as an integer >= ``minimum``.

    ``"auto"`` (as transformers configs write derived head sizes) resolves to
    ``auto``; a missing field takes ``default`` or, without one, is an error.
    """
    keys = (keys,) if isinstance(keys, str) else keys
    value = next((cfg[k] for k in keys if cfg.get(k) is not None), _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            raise HbenchError(f"{src}: config.json lacks required field {keys[0]!r}")
        value = default
    if value == "auto" and auto is not None:
        value = auto
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise HbenchError(f"{src}: field {keys[0]!r} must be an integer >= {minimum}, got {value!r}")
    return value


def _attention_fields(cfg: dict, src: str) -> dict:
    hidden = _int(cfg, "hidden_size", src)
    heads = _int(cfg, "num_attention_heads", src)
    return dict(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=_int(cfg, "num_key_value_heads", src, default=heads),
        head_dim=_int(cfg, ("head_dim", "attention_head_dim"), src, default=hidden // heads),
        vocab_size=_int(cfg, "vocab_size", src),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_position_embeddings=_int(cfg, "max_position_embeddings", src, default=0, minimum=0),
    )


def _mamba2_fields(cfg: dict, src: str, hidden: int, heads_key, head_dim_key, state_key,
                   groups_key, conv_key, expand_key="mamba_expand") -> dict:
    heads = _int(cfg, heads_key, src)
    expand = _int(cfg, expand_key, src, default=2)
    head_dim = _int(cfg, head_dim_key, src, auto=expand * hidden // heads,
                    default=expand * hidden // heads)
    return dict(
        ssm_kind="mamba2",
        ssm_n_heads=heads,
        ssm_head_dim=head_dim,
        ssm_d_inner=heads * head_dim,
        ssm_d_state=_int(cfg, state_key, src),
        ssm_n_groups=_int(cfg, groups_key, src, default=1),
        ssm_d_conv=_int(cfg, conv_key, src, default=4, minimum=2),
    )


def _layer_list(cfg: dict, key: str, src: str) -> list:
    value = _need(cfg, key, src)
    if not isinstance(value, list) or not value:
        raise HbenchError(f"{src}: field {key!r} must be a non-empty list")
    return value


def from_falcon_h1(cfg: dict, name: str = "falcon_h1", **dtypes) -> ModelGeometry:
    """Falcon-H1: every layer runs attention and Mamba-2 heads in parallel."""
    src = name
    attn = _attention_fields(cfg, src)
    n_layers = _int(cfg, "num_hidden_layers", src)
    m_heads = _int(cfg, "mamba_n_heads", src)
    expand = _int(cfg, "mamba_expand", src, default=2)
    m_head_dim = _int(cfg, "mamba_d_head", src, default=attn["hidden_size"] * expand // m_heads,
                      auto=attn["hidden_size"] * expand // m_heads)
    d_ssm = _int(cfg, "mamba_d_ssm", src, default=m_heads * m_head_dim)
    return ModelGeometry(
        name=name,
        model_type="falcon_h1",
        n_layers=n_layers,
        n_attn_layers=n_layers,
        n_ssm_layers=n_layers,
        intermediate_size=_int(cfg, "intermediate_size", src),
        ssm_kind="mamba2",
        ssm_d_inner=d_ssm,
        ssm_n_heads=m_heads,
        ssm_head_dim=m_head_dim,
        ssm_d_state=_int(cfg, "mamba_d_state", src),
        ssm_n_groups=_int(cfg, "mamba_n_groups", src, default=1),
        ssm_d_conv=_int(cfg, "mamba_d_conv", src, default=4, minimum=2),
        ssm_norm=bool(cfg.get("mamba_rms_norm", False)),
        **attn,
        **dtypes,
    )


def from_bamba(cfg: dict, name: str = "bamba", **dtypes) -> ModelGeometry:
    """Bamba: Mamba-2 layers with attention at ``attn_layer_indices``."""
    src = name
    attn = _attention_fields(cfg, src)
    n_layers = _int(cfg, "num_hidden_layers", src)
    idx = _layer_list(cfg, "attn_layer_indices", src)
    if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n_layers for i in idx):
        raise HbenchError(f"{src}: attn_layer_indices must be layer numbers in [0, {n_layers})")
    n_attn = len(set(idx))
    return ModelGeometry(
        name=name, model_type="bamba", n_layers=n_layers, n_attn_layers=n_attn,
        n_ssm_layers=n_layers - n_attn,
        intermediate_size=_int(cfg, "intermediate_size", src),
        **_mamba2_fields(cfg, src, attn["hidden_size"], "mamba_n_heads", "mamba_d_head",
                         "mamba_d_state", "mamba_n_groups", "mamba_d_conv"),
        **attn, **dtypes,
    )


def from_granitemoehybrid(cfg: dict, name: str = "granitemoehybrid", **dtypes) -> ModelGeometry:
    """Granite-4.0-H: ``layer_types`` of "mamba" / "attention"; MoE (or dense) MLP per layer."""
    src = name
    attn = _attention_fields(cfg, src)
    kinds = _layer_list(cfg, "layer_types" if "layer_types" in cfg else "layers_block_type", src)
    if any(k not in ("mamba", "attention") for k in kinds):
        raise HbenchError(f"{src}: layer_types entries must be 'mamba' or 'attention'")
    n_layers = len(kinds)
    experts = _int(cfg, "num_local_experts", src, default=0, minimum=0)
    shared = _int(cfg, "shared_intermediate_size", src, default=0, minimum=0)
    if experts:
        mlp = dict(n_mlp_layers=0, n_moe_layers=n_layers, n_experts=experts,
                   moe_intermediate_size=_int(cfg, "intermediate_size", src),
                   n_shared_experts=1 if shared else 0, shared_intermediate_size=shared,
                   intermediate_size=0)
    else:  # dense variants: the shared MLP is the layer's MLP
        mlp = dict(intermediate_size=shared or _int(cfg, "intermediate_size", src))
    return ModelGeometry(
        name=name, model_type="granitemoehybrid", n_layers=n_layers,
        n_attn_layers=kinds.count("attention"), n_ssm_layers=kinds.count("mamba"),
        **mlp,
        **_mamba2_fields(cfg, src, attn["hidden_size"], "mamba_n_heads", "mamba_d_head",
                         "mamba_d_state", "mamba_n_groups", "mamba_d_conv"),
        **attn, **dtypes,
    )


def from_nemotron_h(cfg: dict, name: str = "nemotron_h", **dtypes) -> ModelGeometry:
    """Nemotron-H: one block per character of ``hybrid_override_pattern``.

    M = Mamba-2, * = attention, - = MLP (squared ReLU, not gated), E = MoE.
    """
    src = name
    attn = _attention_fields(cfg, src)
    pattern = _need(cfg, "hybrid_override_pattern", src)
    if not isinstance(pattern, str) or not pattern or set(pattern) - set("M*-E"):
        raise HbenchError(f"{src}: hybrid_override_pattern must be a string of M, *, - and E")
    n_moe = pattern.count("E")
    moe = {}
    if n_moe:
        moe = dict(n_experts=_int(cfg, "n_routed_experts", src),
                   moe_intermediate_size=_int(cfg, "moe_intermediate_size", src),
                   n_shared_experts=_int(cfg, "n_shared_experts", src, default=0, minimum=0),
                   shared_intermediate_size=_int(cfg, "moe_shared_expert_intermediate_size",
                                                 src, default=0, minimum=0))
    return ModelGeometry(
        name=name, model_type="nemotron_h", n_layers=len(pattern),
        n_attn_layers=pattern.count("*"), n_ssm_layers=pattern.count("M"),
        intermediate_size=_int(cfg, "intermediate_size", src, default=0, minimum=0),
        n_mlp_layers=pattern.count("-"), n_moe_layers=n_moe, mlp_gated=False,
        norms_per_layer=1, **moe,
        **_mamba2_fields(cfg, src, attn["hidden_size"], "mamba_num_heads", "mamba_head_dim",
                         "ssm_state_size", ("n_groups", "mamba_n_groups"),
                         ("conv_kernel", "mamba_d_conv"), expand_key=("expand", "mamba_expand")),
        **attn, **dtypes,
    )


def from_jamba(cfg: dict, name: str = "jamba", **dtypes) -> ModelGeometry:
    """Jamba: Mamba-1 layers; attention where i % attn_layer_period == attn_layer_offset."""
    src = name
    attn = _attention_fields(cfg, src)
    hidden = attn["hidden_size"]
    n_layers = _int(cfg, "num_hidden_layers", src)
    period = _int(cfg, "attn_layer_period", src)
    offset = _int(cfg, "attn_layer_offset", src, minimum=0)
    if offset >= period:
        raise HbenchError(f"{src}: attn_layer_offset {offset} must be < attn_layer_period {period}")
    n_attn = sum(1 for i in range(n_layers) if i % period == offset)
    experts = _int(cfg, "num_experts", src, default=1)
    n_moe = 0
    if experts > 1:
        e_period = _int(cfg, "expert_layer_period", src)
        e_offset = _int(cfg, "expert_layer_offset", src, minimum=0)
        n_moe = sum(1 for i in range(n_layers) if i % e_period == e_offset)
    inter = _int(cfg, "intermediate_size", src)
    d_inner = _int(cfg, "mamba_expand", src, default=2) * hidden
    return ModelGeometry(
        name=name, model_type="jamba", n_layers=n_layers, n_attn_layers=n_attn,
        n_ssm_layers=n_layers - n_attn, intermediate_size=inter,
        n_mlp_layers=n_layers - n_moe, n_moe_layers=n_moe, n_experts=experts,
        moe_intermediate_size=inter if n_moe else 0,
        ssm_kind="mamba1", ssm_d_inner=d_inner,
        ssm_d_state=_int(cfg, "mamba_d_state", src),
        ssm_d_conv=_int(cfg, "mamba_d_conv", src, default=4, minimum=2),
        ssm_dt_rank=_int(cfg, "mamba_dt_rank", src, default=math.ceil(hidden / 16),
                         auto=math.ceil(hidden / 16)),
        **attn, **dtypes,
    )


def from_dense_attention(cfg: dict, name: str = "llama", **dtypes) -> ModelGeometry:
    """A pure-attention decoder (Llama, Mistral, Qwen2/3): no recurrent state."""
    src = name
    n_layers = _int(cfg, "num_hidden_layers", src)
    return ModelGeometry(
        name=name, model_type=str(cfg.get("model_type")), n_layers=n_layers,
        n_attn_layers=n_layers, n_ssm_layers=0,
        intermediate_size=_int(cfg, "intermediate_size", src),
        **_attention_fields(cfg, src), **dtypes,
    )


# model_type -> builder. Each builder takes (cfg, name, **dtypes).
BUILDERS = {
    "falcon_h1": from_falcon_h1,
    "bamba": from_bamba,
    "granitemoehybrid": from_granitemoehybrid,
    "nemotron_h": from_nemotron_h,
    "jamba": from_jamba,
    "llama": from_dense_attention,
    "mistral": from_dense_attention,
    "qwen2": from_dense_attention,
    "qwen3": from_dense_attention,
}


def from_config(cfg: dict, name: str | None = None, declared_by: str = "declared in config.json",
                **dtypes) -> ModelGeometry:
    """Build the geometry for any supported ``model_type``, with the grid the
    config declares (``hbench_grid``, recorded as declared by ``declared_by``)."""
    if not isinstance(cfg, dict):
        raise HbenchError("a model config must be a JSON object")
    model_type = cfg.get("model_type")
    if model_type not in BUILDERS:
        raise HbenchError(
            f"unsupported model_type {model_type!r}; supported: {', '.join(sorted(BUILDERS))}"
        )
    try:
        geom = BUILDERS[model_type](cfg, name or model_type, **dtypes)
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        raise HbenchError(f"malformed {model_type} config: {exc}") from None
    if cfg.get("hbench_grid") is None:
        return geom
    return dataclasses.replace(geom, declared_grid=Grid.from_record(cfg["hbench_grid"], declared_by))


def _falcon_h1(hidden, inter, layers, heads, kv, head_dim, m_heads, m_head_dim, d_state, vocab,
               max_pos, tied=False) -> dict:
    return {
        "model_type": "falcon_h1",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "mamba_n_heads": m_heads,
        "mamba_d_head": m_head_dim,
        "mamba_d_ssm": m_heads * m_head_dim,
        "mamba_d_state": d_state,
        "mamba_n_groups": 1,
        "mamba_d_conv": 4,
        "vocab_size": vocab,
        "max_position_embeddings": max_pos,
        "tie_word_embeddings": tied,
    }


#: The study's grid for Falcon-H1-7B (512-token S0/S1/S2 pages; D0 16-token
#: blocks, a checkpoint every 1792 tokens), as an ``hbench_grid`` record: its
#: preset declares it, and so do the tiny models standing in for it
#: (`adapters.tiny_model`).
STUDY_GRID = {"shared_block_tokens": 512, "dual_block_tokens": 16, "dual_grid_tokens": 1792}

# Preset configs (the fields geometry needs). Depth, dim, heads, KV heads,
# Mamba heads, head dims, d_state and context length (max_position_embeddings)
# come from the Falcon-H1 table in the transformers documentation
# (model_doc/falcon_h1; 0.5B: the 16K SFT context); mamba_d_ssm is Mamba heads
# x Mamba head dim. The 7B row's intermediate_size 12288 and vocab_size 130049
# are those of tiiuae/Falcon-H1-7B-Instruct's config.json. For the other sizes
# intermediate_size and vocab_size are our best recollection of the public
# config.json files, checked against the published parameter counts (the
# `hbench geometry` weights row prints what they give):
#   0.5B  2048 / 32784  -> 0.52e9 parameters
#   1.5B  4096 / 65537  -> 1.48e9 (published size class 1.5B)
#   3B    6144 / 65537  -> 3.15e9 (3.1494e9 reported for Falcon-H1-3B-Instruct)
#   34B  21504 / 261120 -> 33.6e9 (the 34B tokenizer has ~261k entries)
PRESETS: dict[str, dict] = {
    "falcon-h1-0.5b": _falcon_h1(1024, 2048, 36, 8, 2, 64, 24, 64, 128, 32784, 16384),
    "falcon-h1-1.5b": _falcon_h1(2048, 4096, 24, 8, 2, 128, 48, 64, 256, 65537, 131072),
    "falcon-h1-3b": _falcon_h1(2560, 6144, 32, 10, 2, 128, 32, 128, 256, 65537, 131072),
    # the study's model declares the study's grid (which the geometry rule also gives it)
    "falcon-h1-7b": {**_falcon_h1(3072, 12288, 44, 12, 2, 128, 24, 128, 256, 130049, 262144),
                     "hbench_grid": STUDY_GRID},
    "falcon-h1-34b": _falcon_h1(5120, 21504, 72, 20, 4, 128, 32, 128, 256, 261120, 262144),
}


def preset(name: str, **dtypes) -> ModelGeometry:
    key = name.lower()
    if key not in PRESETS:
        raise HbenchError(f"unknown model {name!r}; presets: {', '.join(sorted(PRESETS))}")
    return from_config(PRESETS[key], name=key, declared_by=f"declared by preset {key}", **dtypes)


DEFAULT_MODEL = "falcon-h1-7b"


def geometry_from_options(model: str | None, config_path: str | None, dtype: str = "bf16",
                          ssm_dtype: str = "bf16") -> ModelGeometry:
    """The geometry the model flags select (one-line HbenchError on bad input)."""
    for flag, value in (("--dtype", dtype), ("--ssm-dtype", ssm_dtype)):
        if value not in DTYPE_BYTES:
            raise HbenchError(f"{flag} {value!r} is not one of {', '.join(DTYPE_BYTES)}")
    if model and config_path:
        raise HbenchError("give --model or --config, not both")
    dtypes = dict(dtype=dtype, ssm_state_dtype=ssm_dtype)
    if config_path:
        return from_config(load_config(config_path), declared_by=f"declared in {config_path} (hbench_grid)",
                           **dtypes)
    if model and model.lower() not in PRESETS and (Path(model) / "config.json").is_file():
        # a model directory a real engine serves: its own config.json is the geometry
        path = Path(model) / "config.json"
        return from_config(load_config(path), declared_by=f"declared in {path} (hbench_grid)", **dtypes)
    return preset(model or DEFAULT_MODEL, **dtypes)


def geometry_for_run(config) -> ModelGeometry:
    """The geometry a `RunConfig` names (its config.json wins over the preset name)."""
    return geometry_from_options(None if config.config_path else config.model,
                                 config.config_path, "bf16", config.ssm_state_dtype)
