"""The grid flags every command that runs something takes, defined once.

``--grid-from`` picks where pages and checkpoints fall (`harness.layout`:
``declared``, ``rule``, ``vllm``, ``sglang``); ``--shared-block-tokens``,
``--dual-block-tokens`` and ``--dual-grid-tokens`` replace single numbers of
it. They are `RunConfig` fields of the same names (`harness.config.GRID_FIELDS`),
checked there (positive, at most `MAX_GRID_TOKENS`, D0's interval a multiple
of its block) and by `harness.run_grid.run_grid` against the chosen grid.
``hbench run``, ``capacity``, ``advise`` and ``sweep`` take them.
"""

from __future__ import annotations

import click

from harness.config import GRID_FIELDS
from harness.layout import GRID_SOURCES, MAX_GRID_TOKENS
from hbench.flag_types import Int

GRID_FROM_HELP = (
    "Where pages and checkpoints fall: declared (the model's own: a preset's, or its "
    "config.json's hbench_grid key; else the rule), rule (S0/S1/S2 page: the largest power of "
    "two >= 16 tokens of at most a third of an SSM state; D0: 16-token blocks, a checkpoint "
    "every checkpoint's worth of attention tokens rounded up to 256), vllm (one block raised "
    "until it holds a state, as vLLM does) or sglang (a state every 256 tokens, SGLang's "
    "--mamba-track-interval). Falcon-H1-7B: 512 / 16 / 1792 tokens (declared and rule).")

_TOKENS = Int(1, MAX_GRID_TOKENS)

#: (flag, RunConfig field, help) of the grid flags.
GRID_FLAGS = (
    ("--grid-from", "grid_from", GRID_FROM_HELP),
    ("--shared-block-tokens", "shared_block_tokens",
     "S0/S1/S2: attention page (and checkpoint grid) in tokens, replacing the grid's."),
    ("--dual-block-tokens", "dual_block_tokens",
     "D0/U0/E0: attention block in tokens, replacing the grid's."),
    ("--dual-grid-tokens", "dual_grid_tokens",
     "D0/U0/E0: checkpoint interval in tokens (a multiple of the block), replacing the grid's."),
)
assert tuple(field for _, field, _ in GRID_FLAGS) == GRID_FIELDS


def grid_options(f):
    """Add the grid flags to a click command; each defaults to None (the
    model's declared grid, no override), so `grid_fields` passes on only what
    was given."""
    for flag, field, text in reversed(GRID_FLAGS):
        kind = click.Choice(GRID_SOURCES) if field == "grid_from" else _TOKENS
        f = click.option(flag, field, type=kind, default=None, help=text)(f)
    return f


def grid_fields(values: dict) -> dict:
    """The `RunConfig` fields among a command's parameter ``values`` that were given."""
    return {field: values[field] for field in GRID_FIELDS if values.get(field) is not None}
