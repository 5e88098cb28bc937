"""Calibration and fidelity: how far the simulator's numbers can be trusted.

* `design`: the step shapes ``hbench calibrate`` measures;
* `fit`: least-squares rates from measured step times, residuals per shape class;
* `measure`: runs the design on an engine and builds the profile.

The engines' own drivers (``adapters/torch/calibrate.py``,
``adapters/vllm_calibrate.py``) time the design; `analysis.fidelity` compares
whole runs of a real engine with the simulator's.
"""
