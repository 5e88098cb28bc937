"""SGLang's own memory code serving hbench's workloads without a GPU.

Everything in this package except `engine` runs inside the SGLang venv
(`scripts/setup_sglang_cpu.sh`, ``HBENCH_SGLANG_PYTHON``), never in hbench's:
`stubs` makes SGLang's memory modules importable on torch's CPU build,
`pools` builds SGLang's pools from hbench's byte budget. docs/engines.md
("SGLang's memory code without a GPU") says which parts are SGLang's code
and which are hbench's.
"""
