"""What to deploy: the engine settings that realize an organization, or come
closest, on vLLM and on SGLang, as `hbench advise` states them.

Each entry says which release its flags were checked against (the ones
hbench's adapters drive: vLLM 0.32.0, `adapters.vllm_plugin.plan.VLLM_VERSION`;
SGLang 0.5.23, scripts/setup_sglang_cpu.sh), whether the engine ships the
organization, and the flags for the run's budget and cap on a GPU server, so
that they are the numbers hbench itself would launch with (block counts by
`adapters.vllm.block_count_for`, SGLang's pool limits by
`adapters.sglang.memory_limits`). Where no shipped engine offers the
organization it says so plainly and names the closest shipped setting.
"""

from __future__ import annotations

from dataclasses import dataclass

from adapters.sglang import mamba_full_memory_ratio, memory_limits
from adapters.vllm import VLLM_DTYPES, block_count_for
from adapters.vllm_plugin.plan import VLLM_VERSION

SGLANG_VERSION = "0.5.23"
SHIPS, CLOSEST, NONE = "ships it", "closest shipped setting", "not shipped"


@dataclass(frozen=True)
class Deployment:
    """One engine's way to serve an organization."""

    engine: str
    version: str
    status: str                  # SHIPS, CLOSEST or NONE
    flags: tuple[str, ...]
    note: str = ""

    def line(self) -> str:
        flags = f": {' '.join(self.flags)}" if self.flags else ""
        note = f" ({self.note})" if self.note else ""
        return f"{self.engine} {self.version}, {self.status}{flags}{note}"


def vllm_flags(config) -> tuple[str, ...]:
    """Stock vLLM serving the budget as S0 (one shared pool of whole-state
    pages) with the run's cap, headroom and admission."""
    flags = ["--enable-prefix-caching", "--mamba-cache-mode", "align",
             "--max-num-seqs", str(config.cap),
             "--mamba-ssm-cache-dtype", VLLM_DTYPES[config.ssm_state_dtype]]
    blocks = block_count_for(config, cpu=False)
    if blocks is not None:
        flags += ["--num-gpu-blocks-override", str(blocks)]
    if config.headroom > 0:
        flags += ["--watermark", str(config.headroom)]
    if config.admission == "first-chunk":
        flags += ["--no-scheduler-reserve-full-isl"]
    return tuple(flags)


def sglang_flags(config) -> tuple[str, ...]:
    """SGLang serving the budget as D0 (a state pool beside the token pool)."""
    flags = ["--max-running-requests", str(config.cap)]
    limits = memory_limits(config)
    if limits is None:
        return (*flags, "--mamba-full-memory-ratio",
                f"{mamba_full_memory_ratio(config.d0_attn_fraction):.6g}")
    return (*flags, "--max-total-tokens", str(limits["max_total_tokens"]),
            "--max-mamba-cache-size", str(limits["max_mamba_cache_size"]))


def deployments(config) -> list[Deployment]:
    """How vLLM and SGLang serve ``config.org`` at its budget and cap."""
    org = config.org
    v = lambda status, flags, note="": Deployment("vLLM", VLLM_VERSION, status, flags, note)  # noqa: E731
    s = lambda status, flags, note="": Deployment("SGLang", SGLANG_VERSION, status, flags, note)  # noqa: E731
    stock = vllm_flags(config)
    if org == "s0":
        return [v(SHIPS, stock),
                s(NONE, (), "SGLang keeps Mamba states in a pool of their own (D0), never in "
                          "shared pages")]
    if org in ("s1", "s2"):
        return [v(CLOSEST, stock,
                  f"{org.upper()} itself is not shipped: vLLM's Mamba kernel reads a whole state "
                  "from one block, so a page cannot be smaller than a state; hbench's plugin "
                  f"charges {org.upper()}'s page counts in vLLM's blocks (HBENCH_ORG={org}, "
                  "--scheduler-cls adapters.vllm_plugin.scheduler.PinningScheduler) but is not the "
                  "small-page layout (docs/engines.md, \"Why the plugin's S1/S2 are not physical\")"),
                s(NONE, (), "SGLang has no paged checkpoint layout")]
    if org == "d0":
        return [s(SHIPS, sglang_flags(config)),
                v(CLOSEST, stock, "stock vLLM has one shared pool; hbench's plugin carves D0's two "
                                  "pools (HBENCH_ORG=d0) but no vLLM release ships them")]
    if org == "u0":
        return [s(SHIPS, (*sglang_flags(config)[:2], "--enable-unified-memory"),
                  "one region whose KV and Mamba sides move; hbench runs SGLang's own memory code "
                  "for it in process, never against a server"),
                v(NONE, (), "vLLM has no movable split between its pools")]
    return [s(NONE, (), f"no engine ships {org.upper()}: its capacity moves between the pools "
                        "on demand (hbench's organization); the closest shipped layout is "
                        "SGLang's D0 or its unified memory (U0)"),
            v(NONE, (), "vLLM has no movable split between its pools")]


def check_commands(config, endpoint: str = "http://HOST:PORT") -> list[str]:
    """Commands a user runs against their own server to see it behave as advised."""
    engine = "sglang" if config.org in ("d0", "u0") else "vllm"
    return [f"hbench probe --endpoint {endpoint}",
            f"hbench verify --engine {engine} --endpoint {endpoint}",
            f"hbench run --engine {engine} --endpoint {endpoint} --org {config.org} "
            f"--budget {config.budget} --rate R"]
