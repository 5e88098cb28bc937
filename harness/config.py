"""The run configuration: frozen, validated once, saved with the results.

`RunConfig` holds every knob of one `hbench run` (engine, organization,
budget, scheduler policy, workload recipe, seed). It is validated in
``__post_init__`` and never mutated; a sweep derives cells with
`dataclasses.replace`. `RunConfig.to_dict()` is what the manifest stores and
what the content-addressed sweep cell id hashes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields

from harness.errors import HbenchError
from harness.orgs import ORGANIZATIONS

ORG_NAMES = tuple(ORGANIZATIONS)       # the CLI names, in registry order
ARRIVALS = ("poisson", "constant", "gamma")


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
    # scheduler policy
    cap: int = 63                          # max running requests
    token_budget: int = 8192               # tokens per step (prefill chunks + decodes)
    headroom: float = 0.0                  # admission headroom fraction f
    retention: bool = False
    retention_threshold: int = 2           # distinct requests demanding a prefix
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
    warmup_requests: int = 0
    seed: int = 0
    workload_path: str | None = None       # a saved workload (hbench workload build) instead
    # engine connection (real engines)
    endpoint: str | None = None
    launch: bool = False
    server_cmd: str | None = None
    # diagnostics
    debug_invariants: bool = False

    def __post_init__(self):
        if self.org not in ORG_NAMES:
            raise HbenchError(f"unknown organization {self.org!r}; choose from {', '.join(ORG_NAMES)}")
        if self.arrival not in ARRIVALS:
            raise HbenchError(f"unknown arrival process {self.arrival!r}; choose from {', '.join(ARRIVALS)}")
        checks = [
            (self.cap >= 1, f"--cap must be >= 1, got {self.cap}"),
            (self.token_budget >= 16, f"--token-budget must be >= 16, got {self.token_budget}"),
            (0.0 <= self.headroom < 1.0, f"--headroom must be in [0, 1), got {self.headroom}"),
            (self.retention_threshold >= 1, "--retention-threshold must be >= 1"),
            (self.rate > 0, f"--rate must be > 0, got {self.rate}"),
            (self.burstiness > 0, f"--burstiness must be > 0, got {self.burstiness}"),
            (0.0 <= self.q <= 1.0, f"--q must be in [0, 1], got {self.q}"),
            (self.requests >= 1, f"--requests must be >= 1, got {self.requests}"),
            (self.duration_s is None or self.duration_s > 0, "--duration must be > 0"),
            (self.contexts >= 1, "--contexts must be >= 1"),
            (self.mean_input >= 16, f"--mean-input must be >= 16, got {self.mean_input}"),
            (self.max_model_len >= 32, "--max-model-len must be >= 32"),
            (1 <= self.max_output < self.max_model_len, "--max-output must be in [1, max-model-len)"),
            (self.warmup_requests >= 0, "--warmup must be >= 0"),
            (0.0 < self.d0_attn_fraction < 1.0, "--d0-attn-fraction must be in (0, 1)"),
            (self.seed >= 0, "--seed must be >= 0"),
        ]
        for ok, msg in checks:
            if not ok:
                raise HbenchError(msg)

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
