"""Calibration: the simulator's cost rates fitted to a real engine's step times.

* `design`: the step shapes ``hbench calibrate`` measures;
* `fit`: least-squares rates from measured step times, residuals per shape class.

The engines' own drivers (``adapters/torch/calibrate.py``,
``adapters/vllm_calibrate.py``) time the design; `hbench.calibration` runs a
driver and builds the profile; `analysis.fidelity` compares whole runs of a
real engine with the simulator's.
"""
