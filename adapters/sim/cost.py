"""Roofline cost of one engine step of a hybrid (attention + SSM) model.

Each planned step is described by a handful of aggregate counts
(`harness.engine.shape.StepShape`); `CostModel.step` turns them into seconds with a
roofline: a step takes as long as the slower of moving its bytes through HBM
and doing its FLOPs on the tensor cores, plus a fixed per-step overhead::

    memory_s  = (weights + KV + state I/O bytes) / (bandwidth x mem_efficiency)
    compute_s = GEMM-like FLOPs / (peak x compute_efficiency)
              + SSM scan FLOPs  / (peak x compute_efficiency x scan_efficiency)
    total_s   = max(memory_s, compute_s) + step_overhead_s

Bytes per step:
  * weights: every weight streamed once per step, except the input embedding
    table of an untied model (a gather reads only the step's rows);
  * KV: the cached context every attention layer reads (decode contexts plus
    the earlier prefix of prefill chunks) and the new tokens' K/V it writes;
  * state I/O: each request touched this step reads and writes its SSM + conv
    state (a checkpoint's bytes) in every SSM layer; a published checkpoint is
    a copy (read + write), and so is a checkpoint gathered into a live state.

FLOPs per step:
  * linear layers: 2 x active non-embedding parameters per token
    (prefill tokens + decode requests), plus the LM head for each decode;
  * attention: 4 x head_dim x query heads per (query, key) pair per layer
    (QK^T and PV), pairs counted causally for prefill, the context for decode;
  * SSM: Mamba-2 SSD chunked scan for prefill tokens, the recurrent update for
    decode tokens, and the short causal convolution (`ssm_flops_per_token`).

Everything is reduced to per-unit coefficients in ``CostModel.__init__``;
``step`` is a few multiply-adds, because the simulator calls it once per step,
tens of thousands of times per run. docs/cost-model.md gives the derivation,
the provenance of every constant and the measured call rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import NamedTuple

from adapters.sim.hardware import Hardware
from common.errors import HbenchError
from common.numbers import check_physical
from harness.engine.shape import StepShape
from harness.prefix_flops import idle_expert_params, ssm_flops_per_token


# --------------------------------------------------------------------------
# Tunable constants, all in one place
# --------------------------------------------------------------------------
def _const(default: float, provenance: str):
    return field(default=default, metadata={"provenance": provenance})


@dataclass(frozen=True)
class CostConstants:
    """Every tunable number of the cost model, each with its provenance.

    None is fitted to published throughput. ``hbench hardware`` prints them
    with the provenance stored in each field's metadata.
    """

    mem_efficiency: float = _const(
        0.8,
        "assumed: achieved fraction of peak HBM bandwidth over a whole step; a tuned "
        "read kernel reaches 88% of peak on an A100 80GB SXM (Nsight Compute, NVIDIA "
        "developer forum 'Trouble to reach peak bandwidth of A100'), a step of mixed "
        "GEMV, attention and state-copy kernels somewhat less",
    )
    compute_efficiency: float = _const(
        0.6,
        "assumed: achieved fraction of dense bf16 tensor-core peak for prefill GEMMs "
        "and flash attention at serving batch shapes",
    )
    scan_efficiency: float = _const(
        0.5,
        "assumed: Mamba-2 SSD chunked scan throughput relative to the GEMMs (its "
        "matmuls are chunk-sized, 256 x 256, interleaved with element-wise work)",
    )
    step_overhead_s: float = _const(
        0.004,
        "assumed: fixed per-step cost of a Python engine without CUDA graphs "
        "(scheduling, input preparation, kernel launches)",
    )
    ssd_chunk_size: int = _const(
        256,
        "model config: Mamba-2 SSD chunk length; transformers FalconH1Config "
        "default mamba_chunk_size=256",
    )
    vmm_granule_bytes: int = _const(
        2 * 1024 * 1024,
        "datasheet: CUDA driver API documentation, cuMemCreate's minimum physical allocation granularity on NVIDIA "
        "GPUs (2 MiB; cuMemGetAllocationGranularity), the unit a mapping moves",
    )
    vmm_remap_s: float = _const(
        63.07e-6,
        "measured (published, not by hbench): moving one 2 MiB physical granule from one virtual range to "
        "another = cuMemUnmap 25.63 + cuMemMap 1.45 + cuMemSetAccess 35.99 us (averages, "
        "1 thread, 4096 pages of 2 MiB, A100; kvcached benchmarks/bench_vmm/README.md); "
        "the handle is reused, so no cuMemCreate. Charged to the step that moves "
        "capacity (e0), not overlapped with its kernels",
    )

    def __post_init__(self) -> None:
        for name in ("mem_efficiency", "compute_efficiency", "scan_efficiency"):
            v = getattr(self, name)
            if not 0 < v <= 1:
                raise HbenchError(f"cost constant {name}={v} must be in (0, 1]")
        if self.step_overhead_s < 0:
            raise HbenchError(f"cost constant step_overhead_s={self.step_overhead_s} must be >= 0")
        if self.ssd_chunk_size < 1:
            raise HbenchError(f"cost constant ssd_chunk_size={self.ssd_chunk_size} must be >= 1")
        if self.vmm_granule_bytes < 1 or self.vmm_remap_s < 0:
            raise HbenchError(f"cost constants vmm_granule_bytes={self.vmm_granule_bytes} "
                              f"must be >= 1 and vmm_remap_s={self.vmm_remap_s} >= 0")

    def provenance(self) -> dict[str, tuple[float, str]]:
        """name -> (value, provenance), in declaration order."""
        return {f.name: (getattr(self, f.name), f.metadata["provenance"]) for f in fields(self)}


DEFAULTS = CostConstants()


# --------------------------------------------------------------------------
# What comes back
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class StepCost:
    """One step's time and where it went.

    ``weights_s + kv_s + state_io_s`` is the memory side of the roofline,
    ``compute_s`` the compute side; ``total_s`` is the larger plus
    ``overhead_s``, and ``bound`` names the side that won.
    """

    weights_s: float
    kv_s: float
    state_io_s: float
    compute_s: float
    overhead_s: float
    total_s: float
    bound: str  # "memory" | "compute"
    flops: float
    bytes: float

    @property
    def memory_s(self) -> float:
        return self.weights_s + self.kv_s + self.state_io_s


# --------------------------------------------------------------------------
# Parameter and FLOP counts from the geometry
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts the cost model needs (not bytes: dtype applies later)."""

    embedding: int  # input embedding table
    lm_head: int  # output projection (0 if tied to the embedding)
    body: int  # everything else: attention, SSM, MLP/experts, norms
    body_active: int  # body parameters one token multiplies by (MoE: routed experts only)

    @property
    def total(self) -> int:
        return self.embedding + self.lm_head + self.body


def param_counts(g) -> ParamCounts:
    """Parameter counts of geometry ``g``, read from ``g.param_breakdown()``
    (harness.geometry owns the count; the cost model only groups it)."""
    b = g.param_breakdown()
    emb, lm = b["embeddings"], b["lm_head"]
    body = sum(b.values()) - emb - lm
    return ParamCounts(embedding=emb, lm_head=lm, body=body, body_active=body - idle_expert_params(g))


# --------------------------------------------------------------------------
# Rates: what one step's work is divided by
# --------------------------------------------------------------------------
#: How a step's memory and compute sides combine: ``max`` is the roofline (a
#: GPU overlaps them), ``sum`` adds them (kernels one after another: a CPU, or
#: the sum over a step's kernels of each kernel's own time).
COMBINES = ("max", "sum")


#: The sane range of a rate (bytes/s or FLOP/s): a rate of 1e-300 or 1e308 is
#: a corrupted profile, not a machine, and would make every step take 0 s or
#: forever. The top leaves room for `adapters.calibration.fit.UNRESOLVED_RATE`.
RATE_RANGE = (1.0, 1e21)
#: A per-step or per-request overhead, in seconds: 0, or between a picosecond and an hour.
OVERHEAD_RANGE = (1e-12, 3600.0)


@dataclass(frozen=True)
class Rates:
    """The effective rates a step's work is divided by, and its overheads.

    These are the cost model's physically meaningful constants. A datasheet
    preset gives them as peak x efficiency (`Rates.roofline`); a measured
    profile (``hbench calibrate``, `adapters.sim.profile`) fits them. Work of
    one kind divided by its rate is that kind's seconds:

        memory side   weights + KV bytes / mem_bytes_s, state I/O bytes / state_bytes_s
        compute side  linear FLOPs / gemm_flops_s, attention FLOPs / attn_flops_s,
                      scan FLOPs / scan_flops_s
        overhead      step_overhead_s + request_overhead_s x requests in the step
    """

    mem_bytes_s: float
    state_bytes_s: float
    gemm_flops_s: float
    attn_flops_s: float
    scan_flops_s: float
    step_overhead_s: float
    request_overhead_s: float = 0.0
    combine: str = "max"

    def __post_init__(self) -> None:
        for name in ("mem_bytes_s", "state_bytes_s", "gemm_flops_s", "attn_flops_s",
                     "scan_flops_s"):
            v = getattr(self, name)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v <= 0:
                raise HbenchError(f"rate {name}={v} must be > 0")
            check_physical(v, f"rate {name}", *RATE_RANGE)
        for name in ("step_overhead_s", "request_overhead_s"):
            v = getattr(self, name)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0:
                raise HbenchError("step and request overheads must be >= 0")
            if v != 0:
                check_physical(v, name, *OVERHEAD_RANGE)
        if self.combine not in COMBINES:
            raise HbenchError(f"combine={self.combine!r}: choose from {', '.join(COMBINES)}")

    @classmethod
    def roofline(cls, hardware: Hardware, constants: CostConstants = DEFAULTS) -> Rates:
        """A datasheet preset's rates: peaks times the assumed efficiencies."""
        c = constants
        mem = hardware.mem_bw_bytes_s * c.mem_efficiency
        gemm = hardware.dense_flops_s * c.compute_efficiency
        return cls(mem_bytes_s=mem, state_bytes_s=mem, gemm_flops_s=gemm, attn_flops_s=gemm,
                   scan_flops_s=gemm * c.scan_efficiency, step_overhead_s=c.step_overhead_s)


class StepWork(NamedTuple):
    """One step's work in physical units (`CostModel.work`): what `Rates` divide.

    ``hbench calibrate`` fits rates to measured step times from exactly these
    quantities, so the simulator and the fit can never count work differently.
    (A named tuple: built once per simulated step, it must be cheap.)
    """

    requests: int             # requests computed in the step (chunks + decodes)
    weights_bytes: float      # weights streamed
    kv_bytes: float           # K/V read and written
    state_bytes: float        # SSM + conv state read and written, checkpoint copies
    gemm_flops: float         # linear layers and LM head
    attn_flops: float         # attention scores and values
    scan_flops: float         # SSM scan and convolution


# --------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------
class CostModel:
    """Step time of one model on one accelerator (see module docstring).

    ``hardware`` is a datasheet preset (`adapters.sim.hardware.Hardware`: the
    roofline, `Rates.roofline` with ``constants``), a measured profile
    (`adapters.sim.profile.CostProfile`: anything with a ``rates`` attribute)
    or `Rates` themselves.
    Weight bytes and parameter counts come from the geometry
    (``weights_bytes``, ``param_breakdown``: harness.geometry owns them);
    linear-layer FLOPs from the active body parameters of `param_counts`.
    """

    def __init__(self, geometry, hardware, constants: CostConstants = DEFAULTS):
        g, c = geometry, constants
        self.geometry, self.hardware, self.constants = g, hardware, c
        if isinstance(hardware, Rates):
            r = hardware
        else:
            r = getattr(hardware, "rates", None) or Rates.roofline(hardware, c)
        self.rates = r
        counts = param_counts(g)
        dtype_b = g.dtype_bytes

        self.params = counts
        self.weights_bytes = float(g.weights_bytes)
        # An untied input embedding is gathered row by row, not streamed.
        untied_emb = 0 if g.tie_word_embeddings else counts.embedding
        self.weights_read_bytes = self.weights_bytes - untied_emb * dtype_b
        if self.weights_read_bytes <= 0:
            raise HbenchError(
                f"{g.name}: weights_bytes {g.weights_bytes} is smaller than its embedding table"
            )

        # bytes per unit
        self.kv_bytes_per_token = float(g.attn_bytes_per_token * g.n_attn_layers)
        self.state_rw_bytes = float(2 * g.checkpoint_bytes * g.n_ssm_layers)
        # FLOPs per unit
        self.linear_flops_per_token = 2.0 * counts.body_active
        self.lm_head_flops_per_seq = 2.0 * g.vocab_size * g.hidden_size
        self.attn_flops_per_pair = 4.0 * g.num_attention_heads * g.head_dim * g.n_attn_layers
        scan_p, scan_d = ssm_flops_per_token(g, c.ssd_chunk_size) if g.n_ssm_layers else (0, 0)
        self.scan_flops_per_prefill_token = scan_p * g.n_ssm_layers
        self.scan_flops_per_decode_token = scan_d * g.n_ssm_layers
        self._weights_s = self.weights_read_bytes / r.mem_bytes_s
        # the roofline divides attention with the GEMMs (one rate, one division,
        # exactly as before rates could differ)
        self._attn_with_gemm = r.attn_flops_s == r.gemm_flops_s
        self._add = r.combine == "sum"
        self._per_decodes: dict[int, tuple] = {}   # `decode_values` per batch size

    def move_s(self, moved_bytes: float) -> float:
        """Seconds to move ``moved_bytes`` (whole model) of free capacity from
        one pool's virtual range to the other's: every granule unmapped from
        the donor, mapped into the receiver and given access (``vmm_remap_s``
        per ``vmm_granule_bytes``, pro rata). Host-side driver calls, so the
        cost is the same on a preset or a measured profile."""
        c = self.constants
        return moved_bytes / c.vmm_granule_bytes * c.vmm_remap_s

    def copy_s(self, copied_bytes: float) -> float:
        """Seconds to copy ``copied_bytes`` (whole model) of pages within device
        memory: each byte read and written once at the memory bandwidth."""
        return 2.0 * copied_bytes / self.rates.mem_bytes_s

    def work(self, shape: StepShape) -> StepWork:
        """The step's work in physical units: the one definition of what a step
        moves and computes (``step`` divides it by the rates; both through
        `_batch` and `_price`)."""
        values, batch = self._priced(shape)
        requests, state_bytes, _, gemm_flops, scan_flops, _, _ = batch
        return StepWork(requests=requests, weights_bytes=self.weights_read_bytes,
                        kv_bytes=values[9], state_bytes=state_bytes, gemm_flops=gemm_flops,
                        attn_flops=values[10], scan_flops=scan_flops)

    def step(self, shape: StepShape) -> StepCost:
        """Time of one step. O(1): a few multiply-adds on the aggregate counts."""
        return StepCost(*self._priced(shape)[0][:9])

    def decode_step(self, requests: int, context_tokens: int) -> StepCost:
        """`decode_values` as a `StepCost`."""
        return StepCost(*self.decode_values(requests, context_tokens)[:9])

    def decode_values(self, requests: int, context_tokens: int) -> tuple:
        """`_price` of a step of ``requests`` decodes whose contexts sum to
        ``context_tokens``: `StepCost`'s fields in order, then its K/V bytes
        and attention FLOPs (a stretch of quiet decode steps prices every step
        with it). The same numbers as ``step(StepShape.of_chunks((), requests,
        context_tokens))``: the batch terms are that shape's, kept per batch
        size; its K/V tokens are the contexts plus one new token per request,
        its attention pairs the contexts."""
        batch = self._per_decodes.get(requests)
        if batch is None:
            s = StepShape.of_chunks((), requests, 0)
            batch = self._per_decodes[requests] = self._batch(
                s.prefill_tokens, s.decode_requests, s.state_requests,
                s.checkpoint_copies + s.checkpoint_loads)
        return self._price(context_tokens + requests, context_tokens, batch)

    def _priced(self, shape: StepShape) -> tuple[tuple, tuple]:
        """`_price` of ``shape`` and its `_batch` terms."""
        p, d = shape.prefill_tokens, shape.decode_requests
        batch = self._batch(p, d, shape.state_requests,
                            shape.checkpoint_copies + shape.checkpoint_loads)
        return self._price(shape.decode_context_tokens + shape.prefill_context_tokens + p + d,
                           shape.prefill_attn_pairs + shape.decode_context_tokens, batch), batch

    def _batch(self, prefill_tokens: int, decode_requests: int, state_requests: int,
               moved_checkpoints: int) -> tuple:
        """The work and seconds of a step that depend on its requests only,
        not on their contexts: (requests, state bytes (each request's state
        read and written, each checkpoint published or loaded copied), state
        seconds, GEMM FLOPs (linear layers per new token, the LM head per
        decode), scan FLOPs, scan seconds, overhead seconds)."""
        p, d, r = prefill_tokens, decode_requests, self.rates
        state_bytes = (state_requests + moved_checkpoints) * self.state_rw_bytes
        gemm_flops = (p + d) * self.linear_flops_per_token + d * self.lm_head_flops_per_seq
        scan_flops = p * self.scan_flops_per_prefill_token + d * self.scan_flops_per_decode_token
        return (state_requests, state_bytes, state_bytes / r.state_bytes_s, gemm_flops,
                scan_flops, scan_flops / r.scan_flops_s,
                r.step_overhead_s + r.request_overhead_s * state_requests)

    def _price(self, kv_tokens: int, attn_pairs, batch: tuple) -> tuple:
        """The roofline (module docstring) of a step whose attention layers
        move the K/V of ``kv_tokens`` tokens (read context and written new
        ones) and score ``attn_pairs`` (query, key) pairs, with `_batch` terms
        ``batch``: `StepCost`'s fields in order, then the K/V bytes and the
        attention FLOPs. The one formula behind `step`, `work` and
        `decode_values`."""
        _, state_bytes, state_s, gemm_flops, scan_flops, scan_s, overhead = batch
        r = self.rates
        kv_bytes = kv_tokens * self.kv_bytes_per_token
        attn_flops = attn_pairs * self.attn_flops_per_pair
        weights_s = self._weights_s
        kv_s = kv_bytes / r.mem_bytes_s
        memory_s = weights_s + kv_s + state_s
        if self._attn_with_gemm:
            compute_s = (gemm_flops + attn_flops) / r.gemm_flops_s
        else:
            compute_s = gemm_flops / r.gemm_flops_s + attn_flops / r.attn_flops_s
        compute_s += scan_s
        if compute_s > memory_s:
            bound = "compute"
            busy = memory_s + compute_s if self._add else compute_s
        else:
            bound = "memory"
            busy = memory_s + compute_s if self._add else memory_s
        return (weights_s, kv_s, state_s, compute_s, overhead, busy + overhead, bound,
                gemm_flops + attn_flops + scan_flops,
                self.weights_read_bytes + kv_bytes + state_bytes, kv_bytes, attn_flops)
