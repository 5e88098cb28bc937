"""The hbench application: the command line and what only it drives.

The commands (`hbench.cli`, `hbench.commands`), one run end to end
(`hbench.runner`), sweeps and their executors, calibration of a real engine
and the fidelity experiment sit here, above the engines (`adapters`) and the
statistics (`analysis`), which sit above the harness core (`harness`) and the
workloads (`workloads`). No package below imports this one.
"""
