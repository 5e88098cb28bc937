"""The one entry point runs use to get their workload.

`workload_for` derives the workload of a `workloads.spec.WorkloadSpec`: it
loads the dataset (memoized in-process and cached on disk), picks the
tokenizer and derives. A workload derived before from the same recipe,
corpus and code is read back from `workloads.derived_cache` instead.
`workload_from_config` builds the spec of a `RunConfig`; `build_workload`
takes the spec's fields as keywords. A sweep calls these many times in one
process; only the first call pays for parsing and tokenizing.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from workloads import derived_cache
from workloads.kinds import deriver
from workloads.spec import WorkloadSpec
from workloads.workload import Workload

if TYPE_CHECKING:
    from workloads.sharegpt.tokenizer import Tokenizer

_TOKENIZERS: dict[str, Tokenizer] = {}


def _tokenizer(path: str | Path | None) -> Tokenizer:
    # imported here: a workload read back from the cache is never tokenized
    from workloads.sharegpt.tokenizer import get_tokenizer

    if path is None:
        return get_tokenizer()
    key = str(Path(path).expanduser().resolve())
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = get_tokenizer(key)
    return _TOKENIZERS[key]


def workload_for(spec: WorkloadSpec, *, dataset: str | Path | None = None,
                 tokenizer: str | Path | None = None, chat_column: str | None = None,
                 revision: str | None = None) -> Workload:
    """The workload of ``spec`` (the study's shape, or multi-turn sessions when
    ``spec.workload_kind`` is "multiturn") from ``spec.dataset`` (``dataset`` and
    ``chat_column`` given here replace the spec's); no dataset means the
    packaged ShareGPT V3, no tokenizer the download-free regex tokenizer. The
    corpus is read by `workloads.corpus.load_corpus`, whose identity the meta
    records as ``dataset_identity``."""
    if dataset is not None or chat_column is not None:
        spec = dataclasses.replace(spec, dataset=None if dataset is None else str(dataset),
                                   chat_column=chat_column)
    key = derived_cache.derived_key(spec, tokenizer=tokenizer, revision=revision)
    kept = None if key is None else derived_cache.read(key)
    if kept is not None:
        return kept
    w = _derive(spec, tokenizer, revision)
    if key is not None:
        derived_cache.write(key, w)
    return w


def _derive(spec: WorkloadSpec, tokenizer, revision) -> Workload:
    # imported here: a workload read back from the cache loads no corpus
    from workloads.corpus import load_corpus
    from workloads.sharegpt.loader import release_pages

    pairs = load_corpus(spec.dataset, chat_column=spec.chat_column, revision=revision)
    w = deriver(spec.workload_kind)(pairs, _tokenizer(tokenizer), spec)
    release_pages()   # the texts it read are copied into the workload
    extra = {"dataset_identity": pairs.identity, "workload_kind": spec.workload_kind}
    if spec.dataset is not None:
        extra.update(dataset_arg=spec.dataset, chat_column=spec.chat_column)
    return dataclasses.replace(w, meta={**w.meta, **extra})


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
