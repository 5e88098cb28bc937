"""The one entry point runs use to get their workload.

`workload_for` derives the workload of a `workloads.spec.WorkloadSpec`: it
loads the dataset (memoized in-process and cached on disk), picks the
tokenizer and derives. `workload_from_config` builds the spec of a
`RunConfig`; `build_workload` takes the spec's fields as keywords. A sweep
calls these many times in one process; only the first call pays for parsing
and tokenizing.
"""

from __future__ import annotations

from pathlib import Path

from workloads.multiturn.derive import derive_multiturn
from workloads.sharegpt.derive import derive_workload
from workloads.sharegpt.loader import load_pairs
from workloads.sharegpt.tokenizer import Tokenizer, get_tokenizer
from workloads.spec import WorkloadSpec
from workloads.workload import Workload

_TOKENIZERS: dict[str, Tokenizer] = {}


def _tokenizer(path: str | Path | None) -> Tokenizer:
    if path is None:
        return get_tokenizer()
    key = str(Path(path).expanduser().resolve())
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = get_tokenizer(key)
    return _TOKENIZERS[key]


def workload_for(spec: WorkloadSpec, *, dataset: str | Path | None = None,
                 tokenizer: str | Path | None = None) -> Workload:
    """The ShareGPT-derived workload of ``spec`` (the study's shape, or multi-turn
    sessions when ``spec.workload_kind`` is "multiturn"); ``dataset``/``tokenizer`` None
    mean the packaged ShareGPT V3 and the download-free regex tokenizer."""
    if spec.workload_kind == "multiturn":
        return derive_multiturn(load_pairs(dataset), _tokenizer(tokenizer), spec)
    return derive_workload(load_pairs(dataset), _tokenizer(tokenizer), spec)


def build_workload(*, dataset: str | Path | None = None, tokenizer: str | Path | None = None,
                   **recipe) -> Workload:
    """`workload_for` of ``WorkloadSpec(**recipe)`` (seed, q, rate, ...)."""
    return workload_for(WorkloadSpec(**recipe), dataset=dataset, tokenizer=tokenizer)


def workload_from_config(cfg) -> Workload:
    """The derived workload of one run, warm-up requests first (``cfg`` is a
    `harness.config.RunConfig`)."""
    return workload_for(WorkloadSpec.from_config(cfg))
