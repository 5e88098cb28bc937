"""hbench's vLLM plugin: S1, S2 and D0 at vLLM's allocator level.

Registered as the ``vllm.general_plugins`` entry point ``hbench_orgs``, so
vLLM calls `register` in each of its processes. It does nothing unless hbench's
launcher set ``HBENCH_ORG`` (see `plan.Plan.env`); then it refuses any vLLM
other than `plan.VLLM_VERSION` and, in the process that builds the scheduler,
redirects vLLM's block pool and Mamba manager (`hooks.install`). Compute
kernels are untouched: the Mamba state a kernel reads stays one full state
per block id; what changes is which blocks are taken, held and evicted.
"""

from __future__ import annotations

from adapters.vllm_plugin.plan import VLLM_VERSION, plan_from_env


def check_version(version: str) -> None:
    """Raise RuntimeError unless ``version`` is the release the plugin was built for."""
    base = version.split("+", 1)[0]
    if base != VLLM_VERSION:
        raise RuntimeError(f"hbench vLLM plugin supports vLLM {VLLM_VERSION} only; this is vLLM "
                           f"{version}. Unset HBENCH_ORG to run stock vLLM.")


def register() -> None:
    """vLLM's entry point: inert without ``HBENCH_ORG``."""
    plan = plan_from_env()
    if plan is None:
        return
    import vllm

    check_version(vllm.__version__)
    from adapters.vllm_plugin.hooks import install

    install(plan)
