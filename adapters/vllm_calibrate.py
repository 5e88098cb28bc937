"""Time a vLLM server over the calibration design from outside (``hbench calibrate --engine vllm``).

vLLM does not publish per-step times, so steps are inferred from what a
client sees, on one launched server with no memory pressure:

* **ITL at fixed decode batch sizes** (``decode`` cells): ``batch`` requests
  sent together; once the last of them has its first token, every request
  decodes in every step, so the gap between consecutive tokens is one decode
  step of ``batch`` requests. For each token index the median gap over the
  requests is one sample: a decode step at that context.
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

import os
from pathlib import Path

import numpy as np

from adapters.sim.cost import StepShape
from harness.calibration.design import Cell, cell_workload
from harness.calibration.fit import Sample
from harness.config import RunConfig
from harness.errors import HbenchError

#: State memory for the calibration server: the design must not wait or preempt.
BUDGET = "b64"


def decode_samples(cell: Cell, records, grid: int) -> list[Sample]:
    """Median inter-token gap per token index, after every request has started."""
    ok = [r for r in records if r.status == "finished" and len(r.token_times) >= 2]
    if len(ok) < cell.batch:
        raise HbenchError(f"calibration cell {cell.name}: {cell.batch - len(ok)} requests "
                          "did not finish")
    start = max(float(r.token_times[0]) for r in ok)
    samples = []
    for i in range(1, cell.output):
        gaps = [float(r.token_times[i] - r.token_times[i - 1]) for r in ok
                if len(r.token_times) > i and r.token_times[i - 1] >= start]
        if len(gaps) < cell.batch:
            continue                      # someone was still in prefill: a mixed step
        context = cell.prompt + i
        shape = StepShape.from_requests(decode_contexts=(context,) * cell.batch)
        samples.append(Sample("itl", (shape,), float(np.median(gaps)),
                              held_out=cell.held_out, cell=cell.name))
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
            max_model_len: int = 4096, seed: int = 0, progress=None) -> tuple[list[Sample], dict]:
    """Launch one vLLM server and time every ``decode`` and ``prefill`` cell on it."""
    from adapters.client.dispatch import run_open_loop
    from adapters.client.http import Endpoint, served_models
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
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"hbench-calibrate-vllm-{port}.log"
    samples: list[Sample] = []
    with ServerProcess(argv, Endpoint("127.0.0.1", port), log, env=engine.launch_env(config),
                       ready_timeout_s=engine.ready_timeout_s) as server:
        model = served_models(server.endpoint)[0]
        vocab = _vocab(model_dir)
        run_open_loop(server.endpoint, model, cell_workload(cells[0], vocab, seed + 1),
                      extra_body=engine.extra_body)                     # warm-up, discarded
        for cell in cells:
            result = run_open_loop(server.endpoint, model, cell_workload(cell, vocab, seed),
                                   extra_body=engine.extra_body)
            records = sorted(result.records, key=lambda r: r.request_id)
            if cell.kind == "decode":
                samples += decode_samples(cell, records, grid)
            else:
                samples.append(ttft_sample(cell, records, chunk, grid))
            if progress:
                progress(cell)
    info = {"engine": "vllm", "device": "cpu" if engine.cpu else "cuda", "org": org,
            "model_dir": str(model_dir), "budget": BUDGET, "engine_version": engine.version(),
            "max_num_batched_tokens": chunk, "server_argv": argv}
    return samples, info


def _vocab(model_dir: Path) -> int:
    import json

    return int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
