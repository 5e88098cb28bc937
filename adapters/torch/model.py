"""Falcon-H1's forward pass over caller-owned, paged request state.

Each layer runs, on the same RMS-normed input, a Mamba-2 branch and a
grouped-query attention branch side by side, adds both to the residual, then
a SwiGLU MLP (transformers' ``FalconH1DecoderLayer``)::

    h = rms_norm(x)
    x = x + mixer(h) * ssm_out + o_proj(attn(h * attn_in)) * attn_out
    x = x + mlp(rms_norm(x))

The model holds weights only. A call names the state it computes on:

* `FalconH1.prefill_chunk` - one request's tokens at positions
  ``start_pos ..``: their K/V are written into the request's blocks first,
  then every query attends over the block table up to itself; the SSM and
  conv states ``[layers, ...]`` are read as the state at ``start_pos`` and
  left as the state after the chunk.
* `FalconH1.decode` - one token for each of ``b`` requests, each with its own
  block table, position and state rows ``[b, layers, ...]``.
  `FalconH1.decode_paged` is the same step with the recurrent states left in
  their pool pages, read and updated there by the Triton kernels of
  `adapters.torch.kernels` through per-request page tables.

Splitting a prompt into chunks at any boundaries gives the logits of one
whole-prompt prefill (up to float32 rounding); tests check both against
transformers' ``FalconH1ForCausalLM``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from adapters.torch.attention import paged_attention, paged_decode_attention
from adapters.torch.config import FalconH1Config
from adapters.torch.layers import apply_rope, rms_norm, rope_tables, swiglu_mlp
from adapters.torch.mamba import mixer, mup_vector
from adapters.torch.paging import StateShapes, block_table_tensor, write_kv, write_kv_tokens
from common.errors import HbenchError

_LAYER_PARAMS = (
    "input_layernorm.weight", "pre_ff_layernorm.weight",
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mamba.in_proj.weight", "mamba.conv1d.weight", "mamba.dt_bias", "mamba.A_log", "mamba.D",
    "mamba.out_proj.weight",
    "feed_forward.gate_proj.weight", "feed_forward.up_proj.weight",
    "feed_forward.down_proj.weight",
)


def _sub(weights: dict, prefix: str) -> dict:
    """The entries under ``prefix`` with the prefix removed."""
    return {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}


class FalconH1:
    """Falcon-H1 weights and the two calls a paged engine makes (see the module docstring)."""

    def __init__(self, cfg: FalconH1Config, weights: dict[str, torch.Tensor]):
        need = ["model.embed_tokens.weight", "model.final_layernorm.weight"]
        need += [] if cfg.tie_word_embeddings else ["lm_head.weight"]
        for i in range(cfg.num_hidden_layers):
            need += [f"model.layers.{i}.{p}" for p in _LAYER_PARAMS]
            if cfg.mamba_rms_norm:
                need.append(f"model.layers.{i}.mamba.norm.weight")
        missing = [n for n in need if n not in weights]
        if missing:
            raise HbenchError(f"model.safetensors lacks {len(missing)} parameter(s), "
                              f"e.g. {', '.join(missing[:3])}")
        w = {k: v.to(torch.float32) for k, v in weights.items()}
        self.cfg = cfg
        self.shapes = StateShapes.of(cfg)
        self.embed = w["model.embed_tokens.weight"]
        self.lm_head = self.embed if cfg.tie_word_embeddings else w["lm_head.weight"]
        self.final_norm = w["model.final_layernorm.weight"]
        self.layers = [_sub(w, f"model.layers.{i}.") for i in range(cfg.num_hidden_layers)]
        self.attn = [_sub(lw, "self_attn.") for lw in self.layers]
        self.mamba = [_sub(lw, "mamba.") for lw in self.layers]
        self.mlp = [_sub(lw, "feed_forward.") for lw in self.layers]
        self.mup = mup_vector(cfg)
        self.scale = cfg.head_dim ** -0.5

    def to(self, device: str | torch.device, dtype: torch.dtype = torch.float32) -> FalconH1:
        """Move every weight to ``device`` in ``dtype`` (in place); returns self.

        Activations follow the weights: a call computes in the dtype and on the
        device of the weights, so the caller's state tensors must match them.
        """
        def mv(d: dict) -> dict:
            return {k: v.to(device=device, dtype=dtype) for k, v in d.items()}

        self.embed = self.embed.to(device=device, dtype=dtype)
        tied = self.cfg.tie_word_embeddings
        self.lm_head = self.embed if tied else self.lm_head.to(device=device, dtype=dtype)
        self.final_norm = self.final_norm.to(device=device, dtype=dtype)
        self.layers = [mv(lw) for lw in self.layers]
        self.attn = [_sub(lw, "self_attn.") for lw in self.layers]
        self.mamba = [_sub(lw, "mamba.") for lw in self.layers]
        self.mlp = [_sub(lw, "feed_forward.") for lw in self.layers]
        self.mup = self.mup.to(device=device, dtype=dtype)
        return self

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> FalconH1:
        """Load ``config.json`` and ``model.safetensors`` from a model directory."""
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise HbenchError("the torch engine needs the safetensors package "
                              "(pip install 'hbench[engines]')") from None
        cfg = FalconH1Config.from_dir(model_dir)
        path = Path(model_dir) / "model.safetensors"
        if not path.is_file():
            raise HbenchError(f"weights file not found: {path}")
        return cls(cfg, load_file(str(path)))

    # ---- one layer -------------------------------------------------------------
    def _qkv(self, i: int, h: torch.Tensor, positions: torch.Tensor):
        """Rotated q ``[T, heads, D]``, rotated k and v ``[T, kv_heads, D]`` of ``h [T, hidden]``."""
        c, w = self.cfg, self.attn[i]
        h = h * c.attention_in_multiplier
        q = F.linear(h, w["q_proj.weight"], w.get("q_proj.bias"))
        k = F.linear(h, w["k_proj.weight"], w.get("k_proj.bias")) * c.key_multiplier
        v = F.linear(h, w["v_proj.weight"], w.get("v_proj.bias"))
        T = h.shape[0]
        q = q.view(T, c.num_attention_heads, c.head_dim)
        k = k.view(T, c.num_key_value_heads, c.head_dim)
        v = v.view(T, c.num_key_value_heads, c.head_dim)
        cos, sin = rope_tables(positions, c.head_dim, c.rope_theta)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _attn_out(self, i: int, o: torch.Tensor) -> torch.Tensor:
        w = self.attn[i]
        o = F.linear(o.flatten(-2), w["o_proj.weight"], w.get("o_proj.bias"))
        return o * self.cfg.attention_out_multiplier

    def _finish_layer(self, i: int, x, mamba_out, attn_out):
        c = self.cfg
        x = x + mamba_out * c.ssm_out_multiplier + attn_out
        h = rms_norm(x, self.layers[i]["pre_ff_layernorm.weight"], c.rms_norm_eps)
        return x + swiglu_mlp(h, self.mlp[i], *c.mlp_multipliers)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        x = rms_norm(x, self.final_norm, self.cfg.rms_norm_eps)
        return F.linear(x, self.lm_head) * self.cfg.lm_head_multiplier

    # ---- the engine's calls ----------------------------------------------------
    @torch.inference_mode()
    def prefill_chunk(self, tokens: torch.Tensor, start_pos: int, kv: torch.Tensor,
                      block_table: Sequence[int], ssm_state: torch.Tensor,
                      conv_state: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Logits ``[T, vocab]`` (``[1, vocab]`` with ``last_only``) of one request's chunk.

        ``tokens [T]`` sit at positions ``start_pos .. start_pos + T - 1``; ``kv``
        is `paging.kv_view` of the attention pool and ``block_table`` covers
        at least ``start_pos + T`` positions (earlier blocks hold the K/V of
        positions ``< start_pos``). ``ssm_state [layers, H, P, N]`` and
        ``conv_state [layers, conv_dim, d_conv - 1]`` are updated in place.
        """
        c = self.cfg
        T = tokens.shape[0]
        positions = torch.arange(start_pos, start_pos + T, device=tokens.device)
        x = self.embed[tokens] * c.embedding_multiplier                      # [T, hidden]
        for i, lw in enumerate(self.layers):
            h = rms_norm(x, lw["input_layernorm.weight"], c.rms_norm_eps)
            m = mixer(h[None], self.mamba[i], c, self.mup, ssm_state[i][None],
                      conv_state[i][None])[0]
            q, k, v = self._qkv(i, h, positions)
            write_kv(kv, i, block_table, start_pos, k, v)
            o = paged_attention(q, positions, kv[:, i], block_table, start_pos + T, self.scale)
            x = self._finish_layer(i, x, m, self._attn_out(i, o))
        return self._logits(x[-1:] if last_only else x)

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, kv: torch.Tensor,
               block_tables: Sequence[Sequence[int]], ssm_state: torch.Tensor,
               conv_state: torch.Tensor) -> torch.Tensor:
        """Logits ``[b, vocab]`` of one new token for each of ``b`` requests.

        Request ``r``'s token ``tokens[r]`` is at position ``positions[r]``; its
        K/V go into ``block_tables[r]``, which must cover ``positions[r] + 1``
        tokens. ``ssm_state [b, layers, H, P, N]`` and ``conv_state [b, layers,
        conv_dim, d_conv - 1]`` hold each request's state and are updated in place.
        """
        def mix(i: int, h: torch.Tensor) -> torch.Tensor:
            return mixer(h[:, None], self.mamba[i], self.cfg, self.mup, ssm_state[:, i],
                         conv_state[:, i])[:, 0]

        return self._decode(tokens, positions, kv, block_tables, mix)

    @torch.inference_mode()
    def decode_paged(self, tokens: torch.Tensor, positions: torch.Tensor, kv: torch.Tensor,
                     block_tables: Sequence[Sequence[int]], pool: torch.Tensor,
                     tables) -> torch.Tensor:
        """`decode` with every request's recurrent state read and updated where it
        lies: in ``pool [pages, layers, page_elems]`` at the page tables
        ``tables`` (an `adapters.torch.kernels.tables.StateTables`), through the
        Triton state kernels (`adapters.torch.kernels.mixer`)."""
        from adapters.torch.kernels.mixer import mixer_paged

        def mix(i: int, h: torch.Tensor) -> torch.Tensor:
            return mixer_paged(h, self.mamba[i], self.cfg, self.mup, pool[:, i], tables)

        return self._decode(tokens, positions, kv, block_tables, mix)

    def _decode(self, tokens, positions, kv, block_tables, mix) -> torch.Tensor:
        """The decode step around ``mix(layer, h) -> Mamba branch`` (see `decode`)."""
        c = self.cfg
        b = tokens.shape[0]
        if len(block_tables) != b or positions.shape[0] != b:
            raise ValueError(f"{b} tokens need {b} positions and block tables, got "
                             f"{positions.shape[0]} and {len(block_tables)}")
        tables = block_table_tensor(block_tables).to(tokens.device)
        block = kv.shape[3]
        j = positions // block
        if bool((j >= torch.tensor([len(t) for t in block_tables], device=j.device)).any()):
            raise ValueError("a block table does not cover its request's position")
        pages, offsets = tables.gather(1, j[:, None])[:, 0], positions % block
        x = self.embed[tokens] * c.embedding_multiplier                      # [b, hidden]
        for i, lw in enumerate(self.layers):
            h = rms_norm(x, lw["input_layernorm.weight"], c.rms_norm_eps)
            m = mix(i, h)
            q, k, v = self._qkv(i, h, positions)
            write_kv_tokens(kv, i, pages, offsets, k, v)
            o = paged_decode_attention(q, positions, kv[:, i], tables, self.scale)
            x = self._finish_layer(i, x, m, self._attn_out(i, o))
        return self._logits(x)
