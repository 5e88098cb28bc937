"""The one entry point runs use to get their workload.

`workload_for` derives the workload of a `workloads.spec.WorkloadSpec`: it
loads the dataset (memoized in-process and cached on disk), picks the
tokenizer and derives. `workload_from_config` builds the spec of a
`RunConfig`; `build_workload` takes the spec's fields as keywords. A sweep
calls these many times in one process; only the first call pays for parsing
and tokenizing.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from workloads.corpus import load_corpus
from workloads.multiturn.derive import derive_multiturn
from workloads.sharegpt.derive import derive_workload
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
                 tokenizer: str | Path | None = None, chat_column: str | None = None,
                 revision: str | None = None) -> Workload:
    """The ShareGPT-derived workload of ``spec`` (the study's shape, or multi-turn
    sessions when ``spec.workload_kind`` is "multiturn"); ``dataset``/``tokenizer`` None
    mean the packaged ShareGPT V3 and the download-free regex tokenizer; any
    other corpus is read by `workloads.corpus.load_corpus`, whose identity the
    meta records as ``dataset_identity``."""
    pairs = load_corpus(dataset, chat_column=chat_column, revision=revision)
    derive = derive_multiturn if spec.workload_kind == "multiturn" else derive_workload
    w = derive(pairs, _tokenizer(tokenizer), spec)
    return dataclasses.replace(w, meta={**w.meta, "dataset_identity": pairs.identity})


def build_workload(*, dataset: str | Path | None = None, tokenizer: str | Path | None = None,
                   chat_column: str | None = None, revision: str | None = None,
                   **recipe) -> Workload:
    """`workload_for` of ``WorkloadSpec(**recipe)`` (seed, q, rate, ...)."""
    return workload_for(WorkloadSpec(**recipe), dataset=dataset, tokenizer=tokenizer,
                        chat_column=chat_column, revision=revision)


def workload_from_config(cfg) -> Workload:
    """The derived workload of one run, warm-up requests first (``cfg`` is a
    `harness.config.RunConfig`)."""
    return workload_for(WorkloadSpec.from_config(cfg))
