"""The sweep executors: the one list of ``--executor`` choices.

A module of its own, importing nothing, so that the commands' options can
name the choices without loading the sweep machinery (`hbench.sweep` imports
pandas through the results reader). `hbench.sweep.run_sweep` dispatches on
these names: ``local`` runs cells in a process pool (`hbench.sweep_local`),
``ray`` as Ray tasks (`hbench.sweep_ray`).
"""

EXECUTORS = ("local", "ray")
