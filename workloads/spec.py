"""What identifies a workload: the recipe it is derived from, or the file it is read from.

`WorkloadSpec` is the frozen recipe of one derived workload and the only
input of the builder (`workloads.build.workload_for`), so two runs whose specs
are equal are served the same request stream. It refuses a recipe outside the
limits of `workloads.bounds`, and a run configuration's recipe is checked by
building its spec, so both are refused at the same values. `WorkloadSpec.from_config`
reads every one of its fields out of a `harness.config.RunConfig` by name
(warm-up requests are served first, so they extend ``requests``): adding a
knob to the spec adds it to the builder's input and to every cache key built
from a spec at once, and a knob the spec does not hold cannot change a
workload. `SavedWorkload` names a file written by ``hbench workload build``
by path and content, so an edited file is a different workload.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, fields
from pathlib import Path
from types import SimpleNamespace

from common.errors import HbenchError
from workloads.bounds import (
    MAX_DURATION_S,
    MAX_REQUESTS,
    MIN_MODEL_LEN,
    MIN_TURN_TOKENS,
    expected_requests,
)
from workloads.kinds import WORKLOAD_KINDS
from workloads.sharegpt.arrivals import ARRIVALS, THINK_TIMES

# WorkloadSpec field -> the RunConfig field that holds it, where the names differ.
CONFIG_NAMES = {"mean_input_tokens": "mean_input"}
# WorkloadSpec field -> the key of a derived workload's meta that records it.
META_NAMES = {"mean_input_tokens": "mean_input_target", "dataset": "dataset_arg"}


@dataclass(frozen=True)
class WorkloadSpec:
    """The recipe of one derived workload (the workload part of a RunConfig)."""

    seed: int
    q: float
    rate: float
    arrival: str = "poisson"
    burstiness: float = 1.0
    requests: int = 240
    duration_s: float | None = None
    contexts: int = 8
    max_model_len: int = 8192
    max_output: int = 1024
    isolate: bool = False
    mean_input_tokens: int = 3332
    # multi-turn replay (workload_kind "multiturn"; requests/rate count sessions)
    workload_kind: str = "sharegpt"
    max_turns: int = 8
    max_history: int | None = None
    think: str = "exponential"
    think_time_s: float = 5.0
    replay_answers: bool = False
    # the corpus (workloads.corpus.load_corpus): None is the packaged ShareGPT
    dataset: str | None = None
    chat_column: str | None = None

    def __post_init__(self):
        """Refuse (HbenchError, naming the flag) a recipe outside the limits of
        `workloads.bounds`, those relative to the model length included."""
        _check_recipe(self, within_model_len=True)

    @classmethod
    def from_config(cls, config) -> WorkloadSpec:
        """The recipe a run configuration describes, warm-up requests included
        (they are the first ``config.warmup_requests`` of the stream); refuses
        (HbenchError) a recipe outside the limits, and a warm-up that leaves
        no measured request."""
        return cls(**cls._values_of(config))

    @classmethod
    def check_config(cls, config) -> None:
        """Refuse (HbenchError) a run configuration whose recipe is outside the
        limits, except those relative to ``--max-model-len``: a config also
        launches servers and serves saved or a driver's own workloads, for
        which a prompt-length recipe longer than the model is no error. The
        spec built to derive the workload (`from_config`) checks those too."""
        _check_recipe(SimpleNamespace(**cls._values_of(config)), within_model_len=False)

    @classmethod
    def _values_of(cls, config) -> dict:
        """The spec's fields from ``config``, after the checks a spec cannot make
        itself (the warm-up against the measured requests)."""
        if config.requests < 1:
            raise HbenchError(f"--requests must be >= 1, got {config.requests}")
        if not 0 <= config.warmup_requests <= MAX_REQUESTS:
            raise HbenchError(f"--warmup must be in [0, {MAX_REQUESTS:,}], "
                              f"got {config.warmup_requests}")
        values = {f.name: getattr(config, CONFIG_NAMES.get(f.name, f.name)) for f in fields(cls)}
        values["requests"] += config.warmup_requests
        return values


@dataclass(frozen=True)
class SavedWorkload:
    """A workload file, identified by its resolved path and the sha256 of its bytes."""

    path: str
    sha256: str

    @classmethod
    def of(cls, path: str | Path) -> SavedWorkload:
        p = Path(path)
        try:
            data = p.read_bytes()
        except OSError as exc:
            raise HbenchError(f"cannot read workload file {p}: {exc.strerror or exc}") from None
        return cls(str(p.expanduser().resolve()), hashlib.sha256(data).hexdigest())


def workload_source(config) -> WorkloadSpec | SavedWorkload:
    """What identifies the workload of ``config``: its saved file or its recipe.
    Equal sources give the same workload, so this is the workload cache key."""
    if config.workload_path:
        return SavedWorkload.of(config.workload_path)
    return WorkloadSpec.from_config(config)


def config_fields_from_meta(meta: dict, length: int, warmup_requests: int) -> dict:
    """The RunConfig fields of the recipe a saved workload records in its
    ``meta`` (what `from_config` would read back), for a stream of ``length``
    requests whose first ``warmup_requests`` are warm-up. Fields the meta
    does not record are left out."""
    out = {}
    for f in fields(WorkloadSpec):
        key = META_NAMES.get(f.name, f.name)
        if key in meta:
            out[CONFIG_NAMES.get(f.name, f.name)] = meta[key]
    if "requests" in out:
        out["requests"] = length - warmup_requests
    return out


def _check_recipe(spec, within_model_len: bool) -> None:
    """Refuse (HbenchError, naming the flag) the recipe ``spec`` (a `WorkloadSpec`,
    or any object with its fields) outside the limits of `workloads.bounds`; the
    limits relative to ``max_model_len`` (prompt, output and history lengths
    below it) only where ``within_model_len``."""
    for name, value, choices in (("workload_kind", spec.workload_kind, WORKLOAD_KINDS),
                                 ("think", spec.think, THINK_TIMES),
                                 ("arrival", spec.arrival, ARRIVALS)):
        if value not in choices:
            raise HbenchError(f"unknown {_flag(name)} {value!r}; choose from {', '.join(choices)}")
    for f in fields(WorkloadSpec):
        value = getattr(spec, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise HbenchError(f"{_flag(f.name)} must be a finite number, got {value}")
    expected = expected_requests(spec.requests, spec.duration_s, spec.rate,
                                 spec.workload_kind, spec.max_turns)
    length = spec.max_model_len
    # the limits relative to the model length hold only where they are checked
    below = length if within_model_len else math.inf
    checks = [
        (spec.seed >= 0, f"--seed must be >= 0, got {spec.seed}"),
        (0.0 <= spec.q <= 1.0, f"--q must be in [0, 1], got {spec.q}"),
        (spec.rate > 0, f"--rate must be > 0, got {spec.rate}"),
        (spec.burstiness > 0, f"--burstiness must be > 0, got {spec.burstiness}"),
        (spec.requests >= 1, f"--requests must be >= 1, got {spec.requests}"),
        (spec.requests <= MAX_REQUESTS,
         f"--requests must be <= {MAX_REQUESTS:,}, got {spec.requests:,}"),
        (spec.duration_s is None or spec.duration_s > 0, "--duration must be > 0"),
        (spec.duration_s is None or spec.duration_s <= MAX_DURATION_S,
         f"--duration must be <= {MAX_DURATION_S:.0f} s, got {spec.duration_s}"),
        (expected <= MAX_REQUESTS,
         f"{'--duration x --rate' if spec.duration_s is not None else '--requests'}"
         f"{' x --max-turns' if spec.workload_kind == 'multiturn' else ''} asks for about "
         f"{expected:,.0f} requests; the most one run may ask for is {MAX_REQUESTS:,}"),
        (spec.contexts >= 1, f"--contexts must be >= 1, got {spec.contexts}"),
        (length >= MIN_MODEL_LEN, f"--max-model-len must be >= {MIN_MODEL_LEN}, got {length}"),
        (1 <= spec.max_output < below,
         f"--max-output must be in [1, max-model-len {length}), got {spec.max_output}"),
        # a multi-turn prompt is its conversation's history: --mean-input is not used there
        (spec.workload_kind != "sharegpt" or MIN_TURN_TOKENS < spec.mean_input_tokens < below,
         f"--mean-input must be in ({MIN_TURN_TOKENS}, max-model-len {length}), "
         f"got {spec.mean_input_tokens}"),
        (spec.max_turns >= 1, f"--max-turns must be >= 1, got {spec.max_turns}"),
        (spec.max_history is None or MIN_TURN_TOKENS < spec.max_history <= below,
         f"--max-history must be in ({MIN_TURN_TOKENS}, max-model-len {length}], "
         f"got {spec.max_history}"),
        (spec.think_time_s >= 0, f"--think-time must be >= 0, got {spec.think_time_s}"),
    ]
    for ok, msg in checks:
        if not ok:
            raise HbenchError(msg)


def _flag(field: str) -> str:
    """The command-line flag of a `WorkloadSpec` field."""
    name = {"mean_input_tokens": "mean_input", "duration_s": "duration",
            "think_time_s": "think_time"}.get(field, field)
    return "--" + name.replace("_", "-")
