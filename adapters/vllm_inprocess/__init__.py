"""vLLM's own V1 scheduler deciding an hbench run, without a model or a GPU.

Everything in this package except `engine` runs inside the vLLM venv
(`scripts/setup_vllm_cpu.sh`, ``HBENCH_VLLM_PYTHON``), never in hbench's:
`config` builds vLLM's `VllmConfig` and `KVCacheConfig` from the run (its
budget's bytes in vLLM's pages), `scheduler` puts vLLM's `Scheduler` behind
hbench's engine loop, `worker` runs the loop with each step priced by
hbench's cost model (for S1/S2/D0 with hbench's plugin, `adapters.vllm_plugin`,
installed in that process). docs/engines.md ("vLLM's scheduler in process") says
which parts are vLLM's code and which are hbench's.
"""
