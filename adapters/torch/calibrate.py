"""Time the torch engine over the calibration design (``hbench calibrate --engine torch``).

The engine times its own steps (``duration_s`` of each step row: scheduling,
forward passes, state copies, bookkeeping), so every step is one sample, and
`TorchEngine` records each step's `harness.engine.shape.StepShape` beside it.
Each design cell is one run of the real engine over fresh page pools, with
the model loaded once; a first cell is run and thrown away so that one-time
costs (allocator growth, lazy initialisation) do not land in a sample. On a
shared machine other work only ever adds time, so every cell is run
``repeats`` times, the cells in a new random order each pass, and each step
keeps its fastest time.
"""

from __future__ import annotations

from pathlib import Path

from adapters.calibration.design import Cell, cell_workload, repeat_fastest, step_samples
from adapters.calibration.fit import Sample
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
            seed: int = 0, progress=None, model=None,
            repeats: int = 3) -> tuple[list[Sample], dict]:
    """Run every cell ``repeats`` times (in a shuffled order each pass) on the
    torch engine and keep each step's fastest time; the samples and what was
    measured on.
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

    def timed(cell: Cell) -> list[Sample]:
        setup = validate(cell_config(model_dir, cell, org, device, dtype, max_model_len, seed))
        run = engine.run(cell_workload(cell, vocab, seed), setup)
        return step_samples(cell, engine.step_shapes, [row["duration_s"] for row in run.steps])

    timed(cells[0])                              # warm-up, thrown away
    samples = repeat_fastest(cells, timed, repeats, seed, progress)
    info = {"engine": "torch", "device": dev, "dtype": str(torch_dtype).removeprefix("torch."),
            "org": org, "model_dir": str(model_dir), "budget": BUDGET, "repeats": repeats,
            "engine_version": engine.version()}
    return samples, info
