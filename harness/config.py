"""The run configuration: frozen, validated once, saved with the results.

`RunConfig` holds every knob of one `hbench run` (engine, organization,
budget, scheduler policy, workload recipe, seed). It is validated in
``__post_init__`` and never mutated; a sweep derives cells with
`dataclasses.replace`. `RunConfig.to_dict()` is what the manifest stores and
what the content-addressed sweep cell id hashes.

Validation has two layers: ``__post_init__`` checks each value on its own
(finite, in range, below the size caps), and `harness.run_setup.validate`
checks what needs the model (the token budget against the organization's
grid, the estimated memory of the run against `MAX_RUN_MEMORY_BYTES`).
Every command that runs something (run, sweep, reproduce) calls
`hbench.runner.validate_run` (that, and the simulated GPU's memory) on every
config before any work, and `hbench.runner.execute` calls it again.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, fields

from harness.errors import HbenchError
from harness.layout import PAGINGS
from harness.orgs import ORGANIZATIONS

ORG_NAMES = tuple(ORGANIZATIONS)       # the CLI names, in registry order
ARRIVALS = ("poisson", "constant", "gamma")
#: What must fit for a waiting request to start: its first chunk (the study,
#: DESIGN.md section 4) or its whole input (vLLM 0.32's scheduler_reserve_full_isl).
ADMISSIONS = ("first-chunk", "whole-input")
WORKLOAD_KINDS = ("sharegpt", "multiturn")
THINK_TIMES = ("exponential", "constant", "gamma")

#: Most requests one run may ask for, directly or as duration x rate; far above
#: any study run (240) and far below what would exhaust memory on the way.
MAX_REQUESTS = 1_000_000
#: Largest simulated duration (s): a week of virtual time.
MAX_DURATION_S = 7 * 24 * 3600.0
#: Peak memory (RSS) of one run grows linearly with its requests, and per
#: request linearly with the prompt length. Measured (ru_maxrss, sim engine,
#: s2 at b83, 240 vs 1920 requests, mean input 1000 / 3332 / 6000 tokens):
#: 115 / 257 / 428 kB per request, i.e. about 52 kB + 63 B per prompt token;
#: rounded up here.
RUN_BYTES_PER_REQUEST = 56_000
RUN_BYTES_PER_PROMPT_TOKEN = 64
#: The simulator's bookkeeping per page of the organization's pools. Measured
#: (ru_maxrss of building each organization at a 2 TiB budget, 31k to 1.5M
#: pages): 349 to 379 B per page; rounded up here.
RUN_BYTES_PER_PAGE = 400
#: A run whose estimated memory exceeds this is refused before any work.
MAX_RUN_MEMORY_BYTES = 8 * 2**30


@dataclass(frozen=True)
class RunConfig:
    # what is measured
    org: str = "s2"
    budget: str = "b83"
    engine: str = "sim"
    model: str = "falcon-h1-7b"
    config_path: str | None = None         # a config.json instead of a preset
    gpu: str = "a100-pcie-40gb"
    ssm_state_dtype: str = "bf16"
    d0_attn_fraction: float = 0.5          # D0: share of the budget for the attention pool
    paging: str | None = None              # study or vllm pages (harness/layout.py); None: the engine's own
    # scheduler policy
    cap: int = 63                          # max running requests
    token_budget: int = 8192               # tokens per step (prefill chunks + decodes)
    headroom: float = 0.0                  # admission headroom fraction f
    retention: bool = False
    retention_threshold: int = 2           # distinct requests demanding a prefix
    admission: str = "first-chunk"         # first-chunk (the study) or whole-input (vLLM's default)
    isolate: bool = False
    # workload recipe
    rate: float = 3.0
    arrival: str = "poisson"
    burstiness: float = 1.0                # gamma arrivals: coefficient of variation squared
    q: float = 1.0
    requests: int = 240
    duration_s: float | None = None
    contexts: int = 8
    mean_input: int = 3332                 # target mean prompt length in tokens
    max_model_len: int = 8192
    max_output: int = 1024
    # multi-turn replay: --requests/--rate/--arrival count sessions
    workload_kind: str = "sharegpt"        # "sharegpt" (the study's shape) or "multiturn"
    max_turns: int = 8                     # turns per session at most
    max_history: int | None = None         # a session's prompt + output at most (None: max_model_len)
    think: str = "exponential"             # think-time distribution between turns
    think_time_s: float = 5.0              # mean think time after an answer, before the next turn
    replay_answers: bool = False           # next prompt holds the dataset's answer, not the generated one
    dataset: str | None = None             # a chat corpus (file, folder, saved dataset, hub id); None: ShareGPT
    chat_column: str | None = None         # the corpus column holding the messages (None: detected)
    warmup_requests: int = 0
    seed: int = 0
    workload_path: str | None = None       # a saved workload (hbench workload build) instead
    # engine connection (real engines)
    endpoint: str | None = None
    launch: bool = False
    server_cmd: str | None = None
    # the in-process torch engine
    device: str = "cpu"                    # cpu or cuda[:N]
    dtype: str = "auto"                    # compute dtype: auto (cpu fp32, cuda bf16), fp32, bf16
    poison: bool = False                   # NaN into every freed or invalidated page
    # diagnostics
    debug_invariants: bool = False

    def __post_init__(self):
        if self.org not in ORG_NAMES:
            raise HbenchError(f"unknown organization {self.org!r}; choose from {', '.join(ORG_NAMES)}")
        if self.arrival not in ARRIVALS:
            raise HbenchError(f"unknown arrival process {self.arrival!r}; choose from {', '.join(ARRIVALS)}")
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise HbenchError(f"{_flag(f.name)} must be a finite number, got {value}")
        checks = [
            (self.cap >= 1, f"--cap must be >= 1, got {self.cap}"),
            (self.token_budget >= 16, f"--token-budget must be >= 16, got {self.token_budget}"),
            (0.0 <= self.headroom < 1.0, f"--headroom must be in [0, 1), got {self.headroom}"),
            (self.retention_threshold >= 1, "--retention-threshold must be >= 1"),
            (self.rate > 0, f"--rate must be > 0, got {self.rate}"),
            (self.paging is None or self.paging in PAGINGS,
             f"unknown --paging {self.paging!r}; choose from {', '.join(PAGINGS)}"),
            (self.admission in ADMISSIONS,
             f"unknown --admission {self.admission!r}; choose from {', '.join(ADMISSIONS)}"),
            (self.burstiness > 0, f"--burstiness must be > 0, got {self.burstiness}"),
            (0.0 <= self.q <= 1.0, f"--q must be in [0, 1], got {self.q}"),
            (self.requests >= 1, f"--requests must be >= 1, got {self.requests}"),
            (self.requests <= MAX_REQUESTS, f"--requests must be <= {MAX_REQUESTS:,}, got {self.requests:,}"),
            (self.duration_s is None or self.duration_s > 0, "--duration must be > 0"),
            (self.duration_s is None or self.duration_s <= MAX_DURATION_S,
             f"--duration must be <= {MAX_DURATION_S:.0f} s, got {self.duration_s}"),
            (self.expected_requests <= MAX_REQUESTS,
             f"{'--duration x --rate' if self.duration_s is not None else '--requests'}"
             f"{' x --max-turns' if self.workload_kind == 'multiturn' else ''} asks for about "
             f"{self.expected_requests:,.0f} requests; "
             f"the most one run may ask for is {MAX_REQUESTS:,}"),
            (self.contexts >= 1, "--contexts must be >= 1"),
            (self.mean_input >= 16, f"--mean-input must be >= 16, got {self.mean_input}"),
            (self.max_model_len >= 32, "--max-model-len must be >= 32"),
            (1 <= self.max_output < self.max_model_len, "--max-output must be in [1, max-model-len)"),
            (self.workload_kind in WORKLOAD_KINDS,
             f"unknown --workload-kind {self.workload_kind!r}; choose from {', '.join(WORKLOAD_KINDS)}"),
            (self.think in THINK_TIMES,
             f"unknown --think {self.think!r}; choose from {', '.join(THINK_TIMES)}"),
            (self.max_turns >= 1, f"--max-turns must be >= 1, got {self.max_turns}"),
            (self.max_history is None or 16 <= self.max_history <= self.max_model_len,
             f"--max-history must be in [16, max-model-len {self.max_model_len}], "
             f"got {self.max_history}"),
            (self.think_time_s >= 0, f"--think-time must be >= 0, got {self.think_time_s}"),
            (self.warmup_requests >= 0, "--warmup must be >= 0"),
            (self.warmup_requests <= MAX_REQUESTS, f"--warmup must be <= {MAX_REQUESTS:,}"),
            (0.0 < self.d0_attn_fraction < 1.0, "--d0-attn-fraction must be in (0, 1)"),
            (self.seed >= 0, "--seed must be >= 0"),
            (self.device == "cpu" or self.device.startswith("cuda"),
             f"--device must be cpu or cuda[:N], got {self.device!r}"),
            (self.dtype in ("auto", "fp32", "bf16"),
             f"--dtype must be auto, fp32 or bf16, got {self.dtype!r}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise HbenchError(msg)

    @property
    def expected_requests(self) -> float:
        """Requests the workload recipe asks for (warm-up included): the count,
        or the expected arrivals of a ``--duration`` run; for a multi-turn
        workload, at most ``max_turns`` per session."""
        if self.duration_s is not None:
            n = self.duration_s * self.rate
        else:
            n = self.requests + self.warmup_requests
        # multi-turn: --requests counts sessions; bound the turns by --max-turns each
        return n * self.max_turns if self.workload_kind == "multiturn" else n

    @property
    def estimated_run_bytes(self) -> float:
        """Estimated peak memory of the run's requests (see `RUN_BYTES_PER_REQUEST`);
        `validate` adds the simulator's pages."""
        per_request = RUN_BYTES_PER_REQUEST + RUN_BYTES_PER_PROMPT_TOKEN * self.mean_input
        return self.expected_requests * per_request

    @property
    def resolved_paging(self) -> str:
        """How this run's pages are laid out: ``--paging``, else the engine's
        own (vLLM's blocks on vLLM, the study's pages elsewhere)."""
        if self.paging is not None:
            return self.paging
        return "vllm" if self.engine == "vllm" else "study"

    @property
    def cost_profile_path(self) -> str | None:
        """The measured cost profile ``--gpu`` names (`adapters.sim.profile`), or
        None when it names a datasheet preset."""
        return self.gpu if is_profile_path(self.gpu) else None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> RunConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise HbenchError(f"unknown run config keys: {', '.join(sorted(unknown))}")
        return cls(**d)

    def digest(self) -> str:
        """Stable short hash of the resolved configuration."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def is_profile_path(spec: str) -> bool:
    """Whether a ``--gpu`` value names a cost profile file (``*.json`` or a
    path) rather than a preset name."""
    return spec.lower().endswith(".json") or "/" in spec or "\\" in spec


def _flag(field: str) -> str:
    return "--" + {"duration_s": "duration", "ssm_state_dtype": "ssm-dtype",
                   "warmup_requests": "warmup",
                   "think_time_s": "think-time"}.get(field, field).replace("_", "-")
