"""The designed measurements ``hbench calibrate`` times an engine over.

Each `Cell` is a handful of requests served together on an otherwise idle
engine, chosen so that its steps vary one kind of work at a time:

* ``decode`` cells: ``batch`` requests of ``prompt`` tokens decoding together,
  so the decode steps vary batch size and context length (per-request cost,
  KV bytes, attention FLOPs); their prefill steps add mixed shapes;
* ``prefill`` cells: one ``prompt``-token request chunked by ``chunk`` tokens
  per step, so chunk size and context before the chunk vary (GEMM and scan
  FLOPs per token, the causal attention pairs, checkpoint copies at grid
  boundaries);
* ``shared`` cells: requests that share a ``shared``-token prefix arriving one
  after another, so later ones adopt a cached checkpoint (checkpoint loads).

A few cells are *held out*: the fit never sees them, and the profile's error
on them is its error on shapes it was not fitted to. Held-out cells sit
between and beyond the fitted ones (batch 6 between 4 and 8, a context past
the longest fitted one) rather than being random steps of fitted cells.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, replace

import numpy as np

from adapters.calibration.fit import Sample
from common.errors import HbenchError
from workloads.workload import Workload, WorkloadRequest


@dataclass(frozen=True)
class Cell:
    name: str
    kind: str              # decode | prefill | shared
    batch: int             # requests
    prompt: int            # prompt tokens per request
    output: int            # output tokens per request
    chunk: int             # token budget per step (>= the organization's grid)
    shared: int = 0        # shared cells: prefix tokens the requests share
    held_out: bool = False


def design(quick: bool = False, max_context: int = 4096, min_chunk: int = 512) -> tuple[Cell, ...]:
    """The calibration cells; ``quick`` is a smaller set for tests and CI.
    Contexts are capped by ``max_context`` (prompt + output); chunks are at
    least ``min_chunk`` tokens (the organization's grid: the scheduler's token
    budget may not be smaller)."""
    if quick:
        decode = [(1, 256), (4, 256), (8, 256), (2, 1024), (8, 1024)]
        held_decode = [(6, 640)]
        prefill = [(1024, 512), (2048, 1024)]
        held_prefill = [(1536, 768)]
        shared = [(3, 1024)]
        out = 6
    else:
        decode = [(b, c) for b in (1, 2, 4, 8, 16) for c in (128, 512, 1536)]
        held_decode = [(6, 1024), (12, 256), (3, 2560)]
        prefill = [(2048, 512), (2048, 1024), (3584, 2048), (1024, 1024)]
        held_prefill = [(3072, 768), (2560, 640)]
        shared = [(3, 1024), (3, 2048)]
        out = 10
    cells = []

    def add(cell: Cell) -> None:
        if cell.prompt + cell.output > max_context:
            return
        if cell.chunk < min_chunk:
            cell = replace(cell, chunk=min_chunk,
                           name=cell.name.replace(f"by {cell.chunk}", f"by {min_chunk}"))
        if all(c.name != cell.name for c in cells):
            cells.append(cell)

    for held, group in ((False, decode), (True, held_decode)):
        for b, c in group:
            add(Cell(f"decode b{b} c{c}", "decode", b, c, out, chunk=max(512, b * c), held_out=held))
    for held, group in ((False, prefill), (True, held_prefill)):
        for length, chunk in group:
            add(Cell(f"prefill {length} by {chunk}", "prefill", 1, length, 2, chunk,
                     held_out=held))
    for n, prefix in shared:
        add(Cell(f"shared {n}x{prefix}", "shared", n, prefix + 64, 2, chunk=prefix + 64,
                 shared=prefix))
    if len([c for c in cells if not c.held_out]) < 4:
        raise HbenchError(f"--max-model-len {max_context} leaves too few calibration cells")
    return tuple(cells)


def prompts(cell: Cell, vocab: int, seed: int = 0) -> list[np.ndarray]:
    """The cell's prompts as token ids: random, private per request except a
    shared cell's common prefix."""
    rng = np.random.default_rng([seed, zlib.crc32(cell.name.encode())])
    prefix = rng.integers(0, vocab, cell.shared, dtype=np.int64)
    out = []
    for _ in range(cell.batch):
        own = rng.integers(0, vocab, cell.prompt - cell.shared, dtype=np.int64)
        out.append(np.concatenate([prefix, own]))
    return out


def cell_workload(cell: Cell, vocab: int, seed: int) -> Workload:
    """The cell's requests: all at t=0, except a shared cell's, which arrive
    one after another (the first publishes the checkpoints the others adopt)."""
    reqs = []
    for i, ids in enumerate(prompts(cell, vocab, seed)):
        arrival = i * 1.0 if cell.kind == "shared" else 0.0
        reqs.append(WorkloadRequest(request_id=i, arrival_s=arrival, prompt_text="",
                                    prompt_token_ids=ids, output_len=cell.output,
                                    prefix_group=0 if cell.shared else -1,
                                    prefix_tokens=cell.shared))
    return Workload(requests=tuple(reqs), meta={"calibration_cell": cell.name})


def classify(shape) -> str:
    """A measured step's shape class (the fit reports residuals per class)."""
    if shape.checkpoint_loads or shape.checkpoint_copies:
        return "copy"
    if shape.prefill_tokens and shape.decode_requests:
        return "mixed"
    return "prefill" if shape.prefill_tokens else "decode"


def step_samples(cell: Cell, shapes, durations) -> list[Sample]:
    """One sample per measured step of ``cell``."""
    return [Sample(classify(sh), (sh,), float(t), held_out=cell.held_out, cell=cell.name)
            for sh, t in zip(shapes, durations, strict=True) if t > 0]


def fastest(prev: list[Sample] | None, samples: list[Sample]) -> list[Sample]:
    """Sample by sample, the fastest of the repeats so far: load from elsewhere
    only ever adds time. Repeats whose samples differ in shape (a shared cell
    whose arrivals fell differently) are not mixed: the faster whole repeat wins."""
    if prev is None:
        return samples
    if [p.steps for p in prev] == [s.steps for s in samples]:
        return [p if p.seconds <= s.seconds else s for p, s in zip(prev, samples, strict=True)]
    return prev if sum(p.seconds for p in prev) <= sum(s.seconds for s in samples) else samples


def repeat_fastest(cells, timed, repeats: int, seed: int, progress=None) -> list[Sample]:
    """Time every cell ``repeats`` times, the cells in a new random order each
    pass (a slow spell hits every cell alike), keeping each sample's fastest
    time (`fastest`); ``timed(cell)`` returns one pass's samples of a cell."""
    best: dict[str, list[Sample]] = {}
    order = list(cells)
    rng = random.Random(seed)
    for _ in range(repeats):
        rng.shuffle(order)
        for cell in order:
            best[cell.name] = fastest(best.get(cell.name), timed(cell))
            if progress:
                progress(cell)
    return [s for cell in cells for s in best[cell.name]]
