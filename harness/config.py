"""The run configuration: frozen, validated once, saved with the results.

`RunConfig` holds every knob of one `hbench run` (engine, organization,
budget, scheduler policy, workload recipe, seed). It is validated in
``__post_init__`` and never mutated; a sweep derives cells with
`dataclasses.replace`. `RunConfig.to_dict()` is what the manifest stores and
what the content-addressed sweep cell id hashes.

Validation has two layers. ``__post_init__`` checks each value on its own
(finite, in range, below the size caps); the workload recipe's values it
checks by building the run's `workloads.spec.WorkloadSpec`, whose limits
(`workloads.bounds`) are the workload's own, so a config and a workload are
refused at the same values. `harness.run_setup.validate` checks what needs
the model (the token budget against the organization's grid, the estimated
memory of the run against `MAX_RUN_MEMORY_BYTES`). Every command that runs
something (run, sweep, reproduce) calls `hbench.runner.validate_run` (that,
and the simulated GPU's memory) on every config before any work, and hands
what it resolved to `hbench.runner.execute`, which validates only a config
handed to it alone.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, fields

from common.errors import HbenchError
from harness.budget_label import budget_label
from harness.layout import GRID_SOURCES, MAX_GRID_TOKENS, PAGINGS, VLLM_STUDY_PAGE_ORGS
from harness.orgs import ORGANIZATIONS, check_attn_fraction
from harness.orgs.evict_policy import EVICT_POLICIES
from harness.orgs.publish_policy import PUBLISH_POLICIES
from workloads.bounds import expected_requests
from workloads.request_seq import MADE_AT_ONCE
from workloads.spec import WorkloadSpec

ORG_NAMES = tuple(ORGANIZATIONS)       # the CLI names, in registry order
#: What must fit for a waiting request to start: its first chunk (the study,
#: DESIGN.md section 4) or its whole input (vLLM 0.32's scheduler_reserve_full_isl).
ADMISSIONS = ("first-chunk", "whole-input")
#: The torch engine's compute dtypes (`adapters.torch.engine.resolve_device`):
#: auto is float32 on a CPU, bfloat16 on a GPU.
COMPUTE_DTYPES = ("auto", "fp32", "bf16")

#: Peak memory (RSS) of one run grows linearly with its requests, and per
#: request linearly with the prompt length while the workload is held whole
#: (a saved workload, a multi-turn one, or a derived one of at most
#: `workloads.request_seq.MADE_AT_ONCE` requests). Measured (ru_maxrss, sim
#: engine, s2 at b83, 240 vs 1920 requests, mean input 1000 / 3332 / 6000
#: tokens): 115 / 257 / 428 kB per request, i.e. about 52 kB + 63 B per
#: prompt token; rounded up here.
RUN_BYTES_PER_REQUEST = 56_000
RUN_BYTES_PER_PROMPT_TOKEN = 64
#: A larger derived workload is made request by request as it is served, so
#: a request's prompt costs memory only while it is in flight; the simulator
#: keeps of an ended request only fixed-width columns and its inter-token
#: gaps as counted values, and writes its step rows to disk as they come.
#: Measured (whole process peak RSS, sim engine at b83 and a rate each
#: organization sustains, mean input 3,332; docs/benchmarks.md, "Memory and
#: time at scale"): 10,000 to 100,000 requests 5.7 (e0) to 6.7 (s2) kB per
#: request; a million requests peaked at 5,402 MiB (s1, 1.5 req/s), 5,023 MiB (d0, 1.5)
#: and 7,690 MiB (s0, 1.0 req/s: 8.06 kB a request, its peak while the
#: results are written), all valid, so a million fit the limit. Rounded up
#: from S0's here. (An overloaded run holds the prompts of its growing queue
#: on top: S2 at 3 req/s measured 13.6 kB per request.)
RUN_BYTES_PER_MADE_REQUEST = 8_200
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
    # where pages and checkpoints fall (harness/layout.py `Grid`, harness/run_grid.py):
    # the model's declared grid (else the geometry rule's), the rule, or an engine's
    # shape, each number replaceable; recorded in to_dict only when set (`GRID_FIELDS`)
    grid_from: str = "declared"
    shared_block_tokens: int | None = None  # S0/S1/S2 attention page = checkpoint grid
    dual_block_tokens: int | None = None    # D0/U0/E0 attention block
    dual_grid_tokens: int | None = None     # D0/U0/E0 checkpoint interval
    # scheduler policy
    cap: int = 63                          # max running requests
    token_budget: int = 8192               # tokens per step (prefill chunks + decodes)
    headroom: float = 0.0                  # admission headroom fraction f
    retention: bool = False
    retention_threshold: int = 2           # distinct requests demanding a prefix
    admission: str = "first-chunk"         # first-chunk (the study) or whole-input (vLLM's default)
    isolate: bool = False
    # checkpoint policies (harness/orgs/publish_policy.py, evict_policy.py)
    ckpt_publish: str = "every"            # where checkpoints are published: every, every-k, marconi
    ckpt_every_k: int = 2                  # every-k: publish at every k-th grid boundary
    ckpt_evict: str = "lru"                # which cached checkpoint is evicted: lru, utility
    utility_alpha: float | str = 1.0       # utility: weight of FLOPs saved per byte against recency,
                                           # or "auto": tuned online as Marconi does
                                           # (harness/orgs/alpha_tuning.py)
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
        # one run however it was typed: S2 is s2, B083 is b83 (cell ids, directories)
        if isinstance(self.org, str):
            object.__setattr__(self, "org", self.org.strip().lower())
        object.__setattr__(self, "budget", budget_label(self.budget))
        if self.org not in ORG_NAMES:
            raise HbenchError(f"unknown organization {self.org!r}; choose from {', '.join(ORG_NAMES)}")
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise HbenchError(f"{_flag(f.name)} must be a finite number, got {value}")
        checks = [
            (self.cap >= 1, f"--cap must be >= 1, got {self.cap}"),
            (self.token_budget >= 16, f"--token-budget must be >= 16, got {self.token_budget}"),
            (0.0 <= self.headroom < 1.0, f"--headroom must be in [0, 1), got {self.headroom}"),
            (self.retention_threshold >= 1, "--retention-threshold must be >= 1"),
            (self.paging is None or self.paging in PAGINGS,
             f"unknown --paging {self.paging!r}; choose from {', '.join(PAGINGS)}"),
            (self.admission in ADMISSIONS,
             f"unknown --admission {self.admission!r}; choose from {', '.join(ADMISSIONS)}"),
            (self.ckpt_publish in PUBLISH_POLICIES,
             f"unknown --ckpt-publish {self.ckpt_publish!r}; choose from {', '.join(PUBLISH_POLICIES)}"),
            (self.ckpt_every_k >= 1, f"--ckpt-every-k must be >= 1, got {self.ckpt_every_k}"),
            (self.ckpt_evict in EVICT_POLICIES,
             f"unknown --ckpt-evict {self.ckpt_evict!r}; choose from {', '.join(EVICT_POLICIES)}"),
            (self.utility_alpha == "auto" if isinstance(self.utility_alpha, str)
             else self.utility_alpha >= 0.0,
             f"--utility-alpha must be >= 0 or auto, got {self.utility_alpha!r}"),
            (self.grid_from in GRID_SOURCES,
             f"unknown --grid-from {self.grid_from!r}; choose from {', '.join(GRID_SOURCES)}"),
            *((value is None or (isinstance(value, int) and not isinstance(value, bool)
                                 and 1 <= value <= MAX_GRID_TOKENS),
               f"{_flag(name)} must be a whole number of tokens in [1, {MAX_GRID_TOKENS:,}], "
               f"got {value!r}")
              for name, value in self._grid_tokens()),
            (None in (self.dual_block_tokens, self.dual_grid_tokens)
             or not isinstance(self.dual_grid_tokens, int) or not isinstance(self.dual_block_tokens, int)
             or self.dual_block_tokens < 1 or self.dual_grid_tokens % self.dual_block_tokens == 0,
             f"--dual-grid-tokens {self.dual_grid_tokens} must be a multiple of "
             f"--dual-block-tokens {self.dual_block_tokens}"),
            (self.device == "cpu" or self.device.startswith("cuda"),
             f"--device must be cpu or cuda[:N], got {self.device!r}"),
            (self.dtype in COMPUTE_DTYPES,
             f"unknown --dtype {self.dtype!r}; choose from {', '.join(COMPUTE_DTYPES)}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise HbenchError(msg)
        check_attn_fraction(self.d0_attn_fraction)
        WorkloadSpec.check_config(self)   # the workload recipe, against the workload's limits

    def _grid_tokens(self) -> list[tuple[str, object]]:
        return [(name, getattr(self, name)) for name in GRID_FIELDS[1:]]

    @property
    def expected_requests(self) -> float:
        """Requests the workload recipe asks for (warm-up included): the count,
        or the expected arrivals of a ``--duration`` run; for a multi-turn
        workload, at most ``max_turns`` per session."""
        return expected_requests(self.requests + self.warmup_requests, self.duration_s,
                                 self.rate, self.workload_kind, self.max_turns)

    @property
    def made_on_read(self) -> bool:
        """Whether the run's workload is made request by request as it is
        served (`workloads.request_seq.MadeOnRead`): a derived ShareGPT-shaped
        one of more than `MADE_AT_ONCE` requests."""
        return (not self.workload_path and self.workload_kind == "sharegpt"
                and self.expected_requests > MADE_AT_ONCE)

    @property
    def estimated_run_bytes(self) -> float:
        """Estimated peak memory of the run's requests (see `RUN_BYTES_PER_REQUEST`);
        `validate` adds the simulator's pages."""
        return run_bytes(self.expected_requests, self.mean_input, made_on_read=self.made_on_read)

    @property
    def resolved_paging(self) -> str:
        """How this run's pages are laid out: ``--paging``, else the engine's
        own: vLLM's blocks on vLLM (a CUDA vLLM's, and the study's pages for S1
        and S2, when its scheduler runs in process), the study's pages elsewhere."""
        if self.paging is not None:
            return self.paging
        if self.engine != "vllm":
            return "study"
        if self.endpoint or self.launch:
            return "vllm"
        # vLLM's scheduler in process resolves a CUDA vLLM's block
        return "study" if self.org in VLLM_STUDY_PAGE_ORGS else "vllm-gpu"

    @property
    def cost_profile_path(self) -> str | None:
        """The measured cost profile ``--gpu`` names (`adapters.sim.profile`), or
        None when it names a datasheet preset."""
        return self.gpu if is_profile_path(self.gpu) else None

    def to_dict(self) -> dict:
        """Every field by name, but the `GRID_FIELDS` only when set away from
        their defaults, so a run on the model's own grid hashes (and is
        addressed) as it did before the grid could be chosen. The fields are
        scalars, so this equals `dataclasses.asdict` without its deep copies
        (a large grid builds and hashes thousands of configs)."""
        return {name: value for name in _FIELD_NAMES
                if (value := getattr(self, name)) != _GRID_DEFAULTS.get(name, _KEEP)}

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


_FIELD_NAMES = tuple(f.name for f in fields(RunConfig))
#: The grid fields (`RunConfig.to_dict` leaves them out at their defaults).
GRID_FIELDS = ("grid_from", "shared_block_tokens", "dual_block_tokens", "dual_grid_tokens")
_GRID_DEFAULTS = {f.name: f.default for f in fields(RunConfig) if f.name in GRID_FIELDS}
_KEEP = object()


def run_bytes(requests: float, mean_prompt_tokens: float, *, made_on_read: bool = False) -> float:
    """Estimated peak memory of a run serving ``requests`` requests of
    ``mean_prompt_tokens`` prompt tokens on average (see
    `RUN_BYTES_PER_REQUEST`): the one formula for a recipe's requests and a
    saved workload's. ``made_on_read``: the workload is made request by
    request as it is served (`RUN_BYTES_PER_MADE_REQUEST`)."""
    if made_on_read:
        return requests * RUN_BYTES_PER_MADE_REQUEST
    return requests * (RUN_BYTES_PER_REQUEST + RUN_BYTES_PER_PROMPT_TOKEN * mean_prompt_tokens)


def is_profile_path(spec: str) -> bool:
    """Whether a ``--gpu`` value names a cost profile file (``*.json`` or a
    path) rather than a preset name."""
    return spec.lower().endswith(".json") or "/" in spec or "\\" in spec


def _flag(field: str) -> str:
    return "--" + {"duration_s": "duration", "ssm_state_dtype": "ssm-dtype",
                   "warmup_requests": "warmup",
                   "think_time_s": "think-time"}.get(field, field).replace("_", "-")
