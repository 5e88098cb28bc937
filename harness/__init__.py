"""hbench: memory organization in hybrid (attention + state-space) LLM serving.

Data flows one way: workloads -> engine (scheduler + organization + executor)
-> results -> analysis. Each top-level package is one room of that flow.
"""

__version__ = "0.1.0"
