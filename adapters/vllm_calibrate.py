"""Time a vLLM server over the calibration design from outside (``hbench calibrate --engine vllm``).

vLLM does not publish per-step times, so steps are inferred from what a
client sees, on one launched server with no memory pressure:

* **ITL at fixed decode batch sizes** (``decode`` cells): ``batch`` requests
  sent together; once the last of them has its first token, every request
  decodes in every step, so the mean gap between tokens over a stretch of
  that window is one decode step of ``batch`` requests. Each of a few
  stretches (median over the requests) is one sample: a decode step at the
  stretch's middle context. On a loaded machine the API server or the client
  can stall for a whole window and then stream it at once; such a request's
  window is told apart by the server's own inter-token latency (timed where
  the engine makes the tokens, read from ``/metrics`` around the cell) and
  left out, and a cell left with no sample is timed again.
* **TTFT over prompt lengths** (``prefill`` cells): one request alone; its
  TTFT is the sum of its prefill steps, chunked by the server's
  ``--max-num-batched-tokens``, plus the client's own round trip (HTTP,
  tokenization, the first streamed chunk), fitted as a nuisance term
  (``client_s``) that does not enter the profile.

What this cannot see: how a step splits into scheduling, forward pass and
state copies; checkpoint copies (vLLM's Mamba ``align`` mode copies a state at
every block boundary; the samples count them as the simulator would, one per
grid boundary crossed, so their cost hides in the per-token terms); prefix
hits (the design's prompts are private); and the streaming path's own cost
per token, which lands in the per-request overhead. ``shared`` cells are
skipped for the same reason.
"""

from __future__ import annotations

import itertools
import os
import random
from dataclasses import replace
from pathlib import Path

import numpy as np

from adapters.calibration.design import Cell, cell_workload
from adapters.calibration.fit import Sample
from common.errors import HbenchError
from harness.config import RunConfig
from harness.engine.shape import StepShape

#: State memory for the calibration server: the design must not wait or preempt.
BUDGET = "b64"
#: Pure-decode steps each decode cell is timed over, and the stretches they
#: are cut into (one sample each).
DECODE_TOKENS = 24
SEGMENTS = 4
#: A request whose pure-decode window's mean gap is below this fraction of the
#: server's own mean inter-token latency over the cell was read in one burst:
#: the API server or the client did not run for the whole window (a loaded
#: machine), then streamed it at once, ~15 us a token. Its window says nothing
#: about a step. (The server's ITL is timed where the engine makes the tokens,
#: so a stalled stream does not shorten it; it includes the cell's mixed
#: steps, so it is no smaller than a decode step.)
BURST_RATIO = 0.25
#: The server's histogram of inter-token latency (`adapters.metrics_scrape`).
SERVER_ITL = "vllm:inter_token_latency_seconds"
#: Times a decode cell is timed again when no request's window could be read.
RETIMES = 4


def decode_samples(cell: Cell, records, grid: int, segments: int = SEGMENTS,
                   server_itl: float | None = None) -> list[Sample]:
    """Mean inter-token gap over each of ``segments`` stretches of the pure-decode
    window (after every request's first token), median over the requests.

    Not single gaps: when the API server falls behind the engine it streams
    several tokens back to back, so one gap can be ~0 and the next two steps
    long; a stretch's mean is the step time either way, unless a whole stretch
    came in one burst. So a request's stretch counts only if its mean is
    within a factor of two of the request's mean over the whole window, and,
    given the server's mean inter-token latency over the cell
    (``server_itl``), a request counts only if its window was not read in
    one burst itself (`BURST_RATIO`). No sample when no request's window
    can be read."""
    ok = [r for r in records if r.status == "finished" and len(r.token_times) >= 2]
    if len(ok) < cell.batch:
        raise HbenchError(f"calibration cell {cell.name}: {cell.batch - len(ok)} requests "
                          "did not finish")
    start = max(float(r.token_times[0]) for r in ok)
    first = max(int(np.searchsorted(r.token_times, start)) for r in ok)
    last = min(len(r.token_times) for r in ok) - 1
    if last - first < segments:
        return []

    def mean_gap(r, a: int, b: int) -> float:
        return float(r.token_times[b] - r.token_times[a]) / (b - a)

    window = {id(r): mean_gap(r, first, last) for r in ok}
    if server_itl is not None:
        ok = [r for r in ok if window[id(r)] >= BURST_RATIO * server_itl]
    edges = np.linspace(first, last, segments + 1).round().astype(int)
    samples = []
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        if b <= a:
            continue
        gaps = [g for r in ok
                if 0.5 <= (g := mean_gap(r, a, b)) / max(window[id(r)], 1e-12) <= 2.0]
        if not gaps:
            continue
        context = cell.prompt + (a + b) // 2
        shape = StepShape.from_requests(decode_contexts=(context,) * cell.batch)
        samples.append(Sample("itl", (shape,), float(np.median(gaps)), held_out=cell.held_out,
                              cell=cell.name))
    return samples


def retimed(timed, cell: Cell, retimes: int = RETIMES) -> list[Sample]:
    """``timed(cell)``'s samples, timing the cell again (up to ``retimes``
    times) while it gives none: a window read in one burst is the machine's
    moment, not the cell's."""
    for _ in range(retimes + 1):
        samples = timed(cell)
        if samples:
            break
    return samples


def prefill_steps(prompt: int, chunk: int, grid: int) -> tuple[StepShape, ...]:
    """The prefill steps of one ``prompt``-token request chunked by ``chunk``."""
    steps, start = [], 0
    while start < prompt:
        end = min(prompt, start + chunk)
        steps.append(StepShape.from_requests(prefill_chunks=((end - start, start),),
                                             checkpoint_copies=end // grid - start // grid))
        start = end
    return tuple(steps)


def ttft_sample(cell: Cell, records, chunk: int, grid: int) -> Sample:
    r = records[0]
    if r.status != "finished" or r.first_token_s is None:
        raise HbenchError(f"calibration cell {cell.name}: the request did not finish ({r.error})")
    ttft = r.first_token_s - (r.dispatch_s if r.dispatch_s is not None else r.arrival_s)
    return Sample("ttft", prefill_steps(cell.prompt, chunk, grid), float(ttft),
                  held_out=cell.held_out, nuisance={"client_s": 1.0}, cell=cell.name)


def _flag(argv: list[str], name: str) -> int | None:
    return int(argv[argv.index(name) + 1]) if name in argv else None


def measure(model_dir: str | Path, cells: tuple[Cell, ...], *, org: str = "s0",
            max_model_len: int = 4096, seed: int = 0, progress=None,
            repeats: int = 3) -> tuple[list[Sample], dict]:
    """Launch one vLLM server and time every ``decode`` and ``prefill`` cell on
    it, ``repeats`` passes in shuffled order, every pass's samples kept."""
    from adapters.client.dispatch import run_open_loop
    from adapters.client.http import Endpoint, served_models
    from adapters.metrics_scrape import histogram_mean, read_metrics
    from adapters.server_process import ServerProcess, free_port
    from adapters.vllm import VllmEngine
    from harness.orgs import layout_for
    from harness.run_setup import validate

    model_dir = Path(model_dir)
    cells = tuple(c for c in cells if c.kind in ("decode", "prefill"))
    cap = max(c.batch for c in cells)
    config = RunConfig(engine="vllm", model=str(model_dir),
                       config_path=str(model_dir / "config.json"), org=org, budget=BUDGET,
                       cap=cap, max_model_len=max_model_len, launch=True, seed=seed)
    setup = validate(config)
    grid = layout_for(org, setup.geometry).grid_tokens
    engine = VllmEngine()
    engine.check_config(config)
    port = free_port()
    argv = engine.launch_argv(config, port)
    chunk = _flag(argv, "--max-num-batched-tokens") or 8192
    # only gaps after the last request's first token count: every request of a decode
    # cell decodes through the others' prefill steps and then DECODE_TOKENS more
    cells = tuple(replace(c, output=DECODE_TOKENS + -(-c.batch * c.prompt // chunk))
                  if c.kind == "decode" else c for c in cells)
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"hbench-calibrate-vllm-{port}.log"
    with ServerProcess(argv, Endpoint("127.0.0.1", port), log, env=engine.launch_env(config),
                       ready_timeout_s=engine.ready_timeout_s) as server:
        model = served_models(server.endpoint)[0]
        vocab = _vocab(model_dir)
        passes = itertools.count(1)

        def timed_once(cell: Cell) -> list[Sample]:
            # a fresh seed per pass: private prompts, never a prefix hit on an earlier pass
            before = read_metrics(server.endpoint)
            result = run_open_loop(server.endpoint, model,
                                   cell_workload(cell, vocab, seed + next(passes)),
                                   extra_body=engine.extra_body)
            records = sorted(result.records, key=lambda r: r.request_id)
            if cell.kind == "decode":
                itl = histogram_mean(before, read_metrics(server.endpoint), SERVER_ITL)
                return decode_samples(cell, records, grid, server_itl=itl)
            return [ttft_sample(cell, records, chunk, grid)]

        def timed(cell: Cell) -> list[Sample]:
            return retimed(timed_once, cell)

        timed(cells[0])                                                 # warm-up, discarded
        # every pass's samples are kept: a client-side gap is not only ever
        # lengthened by load (a burst shortens it), so the fastest is not the truest
        order, samples, rng = list(cells), [], random.Random(seed)
        for _ in range(repeats):
            rng.shuffle(order)
            for cell in order:
                samples += timed(cell)
                if progress:
                    progress(cell)
    info = {"engine": "vllm", "device": "cpu" if engine.cpu else "cuda", "org": org,
            "model_dir": str(model_dir), "budget": BUDGET, "engine_version": engine.version(),
            "max_num_batched_tokens": chunk, "server_argv": argv, "repeats": repeats}
    return samples, info


def _vocab(model_dir: Path) -> int:
    import json

    return int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
