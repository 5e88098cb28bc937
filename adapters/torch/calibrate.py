"""Time the torch engine over the calibration design (``hbench calibrate --engine torch``).

The engine times its own steps (``duration_s`` of each step row: scheduling,
forward passes, state copies, bookkeeping), so every step is one sample, and
`TorchEngine` records each step's `adapters.sim.cost.StepShape` beside it.
Each design cell is one run of the real engine over fresh page pools, with
the model loaded once; a first cell is run and thrown away so that one-time
costs (allocator growth, lazy initialisation) do not land in a sample.
"""

from __future__ import annotations

from pathlib import Path

from harness.calibration.design import Cell, cell_workload, step_samples
from harness.calibration.fit import Sample
from harness.config import RunConfig
from harness.run_setup import validate

#: State memory for the calibration runs: enough that no design cell waits
#: or is preempted (the design measures step shapes, not memory pressure).
BUDGET = "b64"


def cell_config(model_dir: Path, cell: Cell, org: str, device: str, dtype: str,
                max_model_len: int, seed: int) -> RunConfig:
    return RunConfig(engine="torch", model=str(model_dir),
                     config_path=str(model_dir / "config.json"), org=org, budget=BUDGET,
                     cap=max(cell.batch, 1), token_budget=cell.chunk,
                     max_model_len=max_model_len, max_output=max(cell.output, 1),
                     device=device, dtype=dtype, seed=seed)


def measure(model_dir: str | Path, cells: tuple[Cell, ...], *, org: str = "s2",
            device: str = "cpu", dtype: str = "auto", max_model_len: int = 4096,
            seed: int = 0, progress=None, model=None) -> tuple[list[Sample], dict]:
    """Run every cell on the torch engine; the samples and what was measured on.
    ``model`` is a `FalconH1` already on ``device`` (else loaded from ``model_dir``,
    whose config.json is the geometry either way)."""
    from adapters.torch.engine import TorchEngine, load_model, resolve_device

    model_dir = Path(model_dir)
    dev, torch_dtype = resolve_device(device, dtype)
    if model is None:
        model = load_model(str(model_dir), dev, torch_dtype)
    else:
        torch_dtype = model.dtype
    engine = TorchEngine(model=model, record_shapes=True)
    vocab = model.cfg.vocab_size
    samples: list[Sample] = []
    for i, cell in enumerate((cells[0], *cells)):
        setup = validate(cell_config(model_dir, cell, org, device, dtype, max_model_len, seed))
        run = engine.run(cell_workload(cell, vocab, seed), setup)
        if i == 0:
            continue                        # the warm-up run
        durations = [row["duration_s"] for row in run.steps]
        samples += step_samples(cell, engine.step_shapes, durations)
        if progress:
            progress(cell)
    info = {"engine": "torch", "device": dev, "dtype": str(torch_dtype).removeprefix("torch."),
            "org": org, "model_dir": str(model_dir), "budget": BUDGET,
            "engine_version": engine.version()}
    return samples, info
