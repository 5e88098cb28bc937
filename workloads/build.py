"""The one entry point runs use to get their workload.

`build_workload` loads the dataset (memoized in-process and cached on disk),
picks the tokenizer and derives the workload; `workload_from_config` reads
the workload recipe out of a `RunConfig`. A sweep calls these many times in
one process; only the first call pays for parsing and tokenizing.
"""

from __future__ import annotations

from pathlib import Path

from workloads.sharegpt.derive import WorkloadSpec, derive_workload
from workloads.sharegpt.loader import load_pairs
from workloads.sharegpt.tokenizer import Tokenizer, get_tokenizer
from workloads.workload import Workload

_TOKENIZERS: dict[str, Tokenizer] = {}


def _tokenizer(path: str | Path | None) -> Tokenizer:
    if path is None:
        return get_tokenizer()
    key = str(Path(path).expanduser().resolve())
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = get_tokenizer(key)
    return _TOKENIZERS[key]


def build_workload(
    *,
    seed: int,
    q: float,
    rate: float,
    arrival: str = "poisson",
    burstiness: float = 1.0,
    requests: int = 240,
    duration_s: float | None = None,
    contexts: int = 8,
    max_model_len: int = 8192,
    max_output: int = 1024,
    isolate: bool = False,
    dataset: str | Path | None = None,
    tokenizer: str | Path | None = None,
    mean_input_tokens: int = 3332,
) -> Workload:
    """A ShareGPT-derived workload; ``dataset``/``tokenizer`` None mean the
    packaged ShareGPT V3 and the download-free regex tokenizer."""
    spec = WorkloadSpec(
        seed=seed, q=q, rate=rate, arrival=arrival, burstiness=burstiness, requests=requests,
        duration_s=duration_s, contexts=contexts, max_model_len=max_model_len,
        max_output=max_output, isolate=isolate, mean_input_tokens=mean_input_tokens,
    )
    return derive_workload(load_pairs(dataset), _tokenizer(tokenizer), spec)


def workload_from_config(cfg) -> Workload:
    """The workload of one run (``cfg`` is a `harness.config.RunConfig`)."""
    return build_workload(
        seed=cfg.seed, q=cfg.q, rate=cfg.rate, arrival=cfg.arrival, burstiness=cfg.burstiness,
        requests=cfg.requests, duration_s=cfg.duration_s, contexts=cfg.contexts,
        max_model_len=cfg.max_model_len, max_output=cfg.max_output, isolate=cfg.isolate,
        mean_input_tokens=cfg.mean_input,
    )
