"""``--engine torch``: an in-process serving engine whose pools are real memory.

The same `Scheduler`, organization and event loop
(`harness.engine.loop.EngineLoop`) the simulator uses decide what runs and
when; this engine's executor (`TensorExecutor`) runs every step with real
tensors on the wall clock (`harness.engine.clock.WallClock`)::

    pools = Pools(org.capacity())            # one preallocated tensor per pool
                                             # (u0, e0: one buffer, `org.region()`)
    loop (wall clock, open loop):
        hand over every request that has arrived
        batch = sched.schedule()             # org calls -> adopt copies, poison
        tokens = executor.run(batch)         # forward passes over paged state
        sched.complete(batch, t, tokens)     # commit -> publish copies, state placed

Why: a layout that is only counted cannot be wrong; here a page read or
written in the wrong place changes the tokens, so continuation can be checked
against recomputation (`hbench verify --engine torch`). Tokens are the
model's greedy output, so prefix keys and recomputation use real ids. What
is physical and what is not (times, memory by kind, u0/e0's region, the
state kernels on a GPU, ``poison=True``): docs/engines.md, "The torch engine".
"""

from __future__ import annotations

import math
import resource
from dataclasses import dataclass
from pathlib import Path

from common.code_digest import code_digest
from common.errors import HbenchError
from harness import __version__
from harness.config import ORG_NAMES
from harness.engine.clock import WallClock
from harness.engine.fits import check_fits
from harness.engine.info import engine_info
from harness.engine.loop import EngineLoop
from harness.engine.recorder import StepRecorder
from harness.engine.shape import StepShape
from harness.orgs import CheckpointPolicy, build_organization
from harness.records import EngineRun
from harness.scheduler import Scheduler, SchedulerPolicy


@dataclass(frozen=True)
class _Unmeasured:
    """The step row's timing fields before the step ran (filled in afterwards)."""

    total_s: float = 0.0
    weights_s: float = math.nan
    kv_s: float = math.nan
    state_io_s: float = 0.0
    compute_s: float = 0.0
    overhead_s: float = 0.0
    bound: str = "measured"


def _torch():
    try:
        import torch
    except ImportError:
        raise HbenchError("the torch engine needs PyTorch (pip install 'hbench[engines]')") from None
    return torch


def resolve_device(name: str, dtype: str = "auto") -> tuple[str, object]:
    """(device, compute dtype); ``auto`` is float32 on CPU, bfloat16 on a GPU."""
    torch = _torch()
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise HbenchError(f"--device {name}: no CUDA device is available")
    if name != "cpu" and not name.startswith("cuda"):
        raise HbenchError(f"--device must be cpu or cuda[:N], got {name!r}")
    if dtype == "auto":
        dtype = "fp32" if name == "cpu" else "bf16"
    return name, {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]


def use_kernels(device: str, requested: bool | None) -> bool:
    """Whether decode runs the Triton state kernels: as ``requested``, else on a
    GPU when Triton is installed (CPU keeps the torch path)."""
    import importlib.util

    have = importlib.util.find_spec("triton") is not None
    if requested is None:
        return device.startswith("cuda") and have
    if requested and not have:
        raise HbenchError("the torch engine's state kernels need Triton (pip install triton)")
    return requested


def load_model(model_dir: str, device: str, dtype):
    """The Falcon-H1 weights of ``model_dir`` on ``device`` in ``dtype``."""
    from adapters.torch.model import FalconH1

    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise HbenchError(f"the torch engine serves a model directory (config.json and "
                          f"model.safetensors, e.g. from hbench tiny-model); {model_dir!r} is not one")
    return FalconH1.from_dir(path).to(device, dtype)


def check_geometry(model, geom) -> None:
    """The run's geometry must describe the served model, element for element."""
    sh = model.shapes
    u = geom.dtype_bytes
    mine = (sh.n_layers, sh.kv_token_elems * u, sh.ssm_elems * u, sh.conv_elems * u)
    theirs = (geom.n_layers, geom.attn_bytes_per_token, geom.ssm_state_bytes,
              geom.conv_state_bytes)
    if mine != theirs or geom.attn_groups != 1 or geom.ssm_groups != 1:
        raise HbenchError(
            f"the run's geometry {geom.name} (layers, KV bytes/token, SSM bytes, conv bytes = "
            f"{theirs}) does not describe the served model ({mine}); give --model DIR without "
            "--config, or the model's own config.json")


#: Where the import walk of the torch engine's code digest starts: the engine
#: and the executor, model and pools it imports where it runs.
DIGEST_ROOTS = ("adapters.torch.engine",)


class TorchEngine:
    name = "torch"
    # every registered organization: fixed pools as one tensor each, a region
    # (u0, e0) as one buffer whose two ends follow the split (`adapters.torch.region`)
    supported_orgs = ORG_NAMES

    def __init__(self, keep_logits: bool = False, model=None, record_shapes: bool = False,
                 kernels: bool | None = None):
        self.keep_logits = keep_logits
        self.kernels = kernels    # decode through the state kernels; None: on a GPU only
        self.model = model        # a FalconH1 already on its device (else --model DIR is loaded)
        # each step's `StepShape`, in step-row order (last run; hbench calibrate fits them)
        self.step_shapes: list | None = [] if record_shapes else None
        self.outputs: dict[int, list[int]] = {}   # rid -> generated token ids (last run)
        self.logits: dict | None = None            # rid -> per-token logits (keep_logits)
        self.stats: dict = {}

    def version(self) -> str:
        """Changes whenever code that decides its outputs changes: this
        package and what it imports (scheduler, organizations, engine loop)."""
        return f"torch-{__version__}-{code_digest(DIGEST_ROOTS)}"

    def run(self, workload, setup, progress=None) -> EngineRun:
        torch = _torch()
        config, geom = setup.config, setup.geometry
        if geom.ssm_state_dtype != geom.dtype:
            raise HbenchError("the torch engine stores every state in one dtype: "
                              f"--ssm-dtype must be {geom.dtype}")
        device, dtype = resolve_device(config.device, config.dtype)
        threads = torch.get_num_threads()
        if device == "cpu":
            # one intra-op thread: the model's ops are small, and on a shared CPU more
            # threads cost far more in synchronisation than they gain
            torch.set_num_threads(1)
        try:
            return self._run(workload, setup, progress, device, dtype)
        finally:
            torch.set_num_threads(threads)

    def _run(self, workload, setup, progress, device, dtype) -> EngineRun:
        from adapters.torch.executor import Executor
        from adapters.torch.pools import Pools
        from adapters.torch.tracking import Poisoner, TrackedOrg

        torch = _torch()
        config, geom, budget = setup.config, setup.geometry, setup.budget
        model = self.model or load_model(config.model, device, dtype)
        check_geometry(model, geom)
        org = build_organization(setup.layout, tuple(p.pages for p in budget.pools),
                                 CheckpointPolicy.from_config(config, geom))
        check_fits(org, workload, config, budget.label)
        pools = Pools(org.capacity(), model.shapes, geom.dtype_bytes, dtype, device,
                      region=org.region(), org=org)
        kernels = use_kernels(device, self.kernels)
        tensors = Executor(model, pools, org, keep_logits=self.keep_logits, kernels=kernels)
        poisoner = Poisoner(org, pools) if config.poison else None
        tracked = TrackedOrg(org, tensors.on_admit, tensors.on_commit, poisoner, pools)
        sched = Scheduler(tracked, SchedulerPolicy.from_config(config))
        recorder = StepRecorder(org, geom.pool_layers)
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats(device)
        shapes = self.step_shapes = [] if self.step_shapes is not None else None
        clock = WallClock()
        executor = TensorExecutor(sched, tensors, recorder, clock, shapes)
        loop = EngineLoop(workload, sched, executor, clock,
                          warmup_requests=config.warmup_requests, progress=progress,
                          check=org.check_invariants if config.debug_invariants else None)
        table = loop.run()
        scale = pools.byte_scale
        rows = [_scaled(row, scale) for row in recorder.rows]
        last = table.last_finish()
        process_peak = (torch.cuda.max_memory_allocated(device) if device.startswith("cuda")
                        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        self.outputs = executor.outputs
        self.logits = tensors.logits
        self.stats = {
            "adopt_copies": tensors.copies["adopt"],
            "publish_copies": tensors.copies["publish"],
            "poisoned_pages": poisoner.poisoned if poisoner else 0,
            "preemptions": sched.preemptions,
            "adopted_requests": int((table.array("j_adopt") > 0).sum()),
            "steps": len(rows),
        }
        if pools.slots is not None:     # u0, e0: what the region did, in pages and moves
            self.stats.update(pools.slots.counters())
            self.stats.update({k: v for k, v in org.region_counters(1).items()
                               if not k.endswith("_bytes")})
        info = engine_info(self.name, setup, org)
        info.update({
            "device": device, "dtype": str(dtype).removeprefix("torch."),
            "pool_tensor_bytes": pools.physical_bytes, "byte_scale": scale,
            "process_peak_bytes": int(process_peak), "poison": bool(config.poison),
            "state_kernels": "triton" if kernels else "torch",
            **self.stats,
        })
        counters = recorder.counters(sched.preemptions, budget.rounding_loss_bytes)
        for key in org.region_counters(1):          # u0, e0: bytes in the engine's elements
            if key.endswith("_bytes"):
                counters[key] = int(counters[key] * scale)
        counters["rounding_waste_bytes"] = {
            "budget": int(counters["rounding_waste_bytes"]["budget"] * scale),
            "pages": max((sum(r[f"waste_{k}_bytes"] for k in ("attention", "ssm", "conv"))
                          for r in rows), default=0)}
        return EngineRun(requests=table, steps=rows, window_start_s=0.0, window_end_s=last,
                         engine_info=info,
                         peak_memory={k: int(v * scale) for k, v in recorder.peak.items()},
                         counters=counters)


class TensorExecutor:
    """The torch engine's `harness.engine.executor.Executor`: each step runs
    with real tensors (``tensors``, an `adapters.torch.executor.Executor`) and
    is measured on the wall clock ``clock``. Its row is recorded before the
    step runs and its timing filled in when the scheduler completed it (the
    step's duration includes the planning and the commits); ``shapes``, if a
    list, gets each step's `StepShape` in row order. The tokens are what the
    model computed (``outputs``: request id -> generated ids)."""

    def __init__(self, sched, tensors, recorder, clock, shapes: list | None = None):
        self.sched, self.tensors, self.recorder, self.clock = sched, tensors, recorder, clock
        self.shapes = shapes
        self.outputs: dict[int, list[int]] = {}
        self.start = 0.0
        self.tokens: dict = {}

    def begin_step(self, now: float) -> None:
        self.start = now
        self.tensors.begin_step()      # adopt copies happen while the scheduler plans

    def execute(self, batch) -> float:
        sched = self.sched
        self.recorder.step_started(self.start, batch, _Unmeasured(), len(sched.running),
                                   len(sched.waiting))
        if self.shapes is not None:
            self.shapes.append(StepShape.of_batch(batch))
        self.tokens = self.tensors.run(batch)
        computed = self.clock.now
        for rid, tok in self.tokens.items():
            self.outputs.setdefault(rid, []).append(tok)
        return computed

    def complete(self, batch, now: float) -> list:
        finished = self.sched.complete(batch, now, self.tokens)
        end = self.clock.now
        _fill_timing(self.recorder.rows[-1], self.start, end, self.tensors.timing)
        self.recorder.step_finished(end)
        return finished

    def generated_ids(self, request) -> list[int]:
        return self.outputs.get(request.rid, [])



def _fill_timing(row: dict, start: float, end: float, timing) -> None:
    row["duration_s"] = end - start
    row["compute_s"] = timing.compute_s
    row["state_io_s"] = timing.state_io_s
    row["overhead_s"] = max(0.0, end - start - timing.compute_s - timing.state_io_s)


def _scaled(row: dict, scale: float) -> dict:
    """A step row with its byte columns in the engine's element size."""
    out = dict(row)
    for key, value in row.items():
        if key.endswith("_bytes"):
            out[key] = int(value * scale)
    return out
