"""The in-process engine core: what the simulator and the torch engine share.

An in-process engine is a `harness.scheduler.Scheduler` over an organization,
an executor that turns each planned step into time (`executor.Executor`: the
simulator prices it, the torch engine computes it) and one event loop
(`loop.EngineLoop`) that orders arrivals and step completions on a clock
(`clock`); `stretch.run_stretch` prices and records a run of quiet decode steps
the scheduler hands out. `shape.StepShape` describes a planned step, `recorder.StepRecorder`
turns steps into rows of ``steps.parquet``, `fits.check_fits` refuses a
budget that cannot serve the workload before the loop starts, `info.engine_info`
is the part of a manifest's ``engine_info`` they share. Nothing here imports
an engine adapter.
"""
