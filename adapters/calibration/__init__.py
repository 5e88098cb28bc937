"""Calibration: the simulator's cost rates fitted to a real engine's step times.

* `design`: the step shapes ``hbench calibrate`` measures;
* `fit`: least-squares rates from measured step times, residuals per shape class.

The engines' own drivers (``adapters/torch/calibrate.py``,
``adapters/vllm_calibrate.py``) time the design; `hbench.calibration` runs a
driver and builds the profile; `analysis.fidelity` compares whole runs of a
real engine with the simulator's.

`DRIVERS` is the one list of engines that can be calibrated (``hbench
calibrate --engine``, ``hbench fidelity --engine``): engine name -> the module
of its driver, imported only when that engine is calibrated.
"""

DRIVERS = {"torch": "adapters.torch.calibrate", "vllm": "adapters.vllm_calibrate"}
