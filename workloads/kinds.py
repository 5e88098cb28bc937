"""The workload kinds: CLI name -> the deriver that builds that kind of workload.

`WORKLOAD_KINDS` is the one list of kinds: ``--workload-kind`` choices and
`workloads.spec.WorkloadSpec` read its keys. Each entry names its deriver by
module and function, imported only when a workload is derived (`deriver`), so
checking a recipe does not load the corpus machinery. A deriver takes
(pairs, tokenizer, spec) and returns a `workloads.workload.Workload`.
"""

from __future__ import annotations

import importlib

WORKLOAD_KINDS: dict[str, tuple[str, str]] = {
    "sharegpt": ("workloads.sharegpt.derive", "derive_workload"),     # the study's shape
    "multiturn": ("workloads.multiturn.derive", "derive_multiturn"),  # replayed sessions
}


def deriver(kind: str):
    """The function deriving a ``kind`` workload (a key of `WORKLOAD_KINDS`)."""
    module, name = WORKLOAD_KINDS[kind]
    return getattr(importlib.import_module(module), name)
