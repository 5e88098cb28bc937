"""Commands hbench prints as a next step, built from the run they follow.

A suggested command is worth printing only if running it as printed measures
the configuration the user was looking at: a capacity search that quietly
went back to the default GPU or prompt length answers another question. So
every suggestion is built here, from the run's recorded configuration (the
manifest's ``config``, `harness.config.RunConfig.to_dict`), one way: each
field that differs from `RunConfig`'s default becomes the target command's
own flag where it has one and ``--set key=value`` otherwise, every value
shell-quoted. A setting the target cannot carry is never dropped: the
`Suggestion` then has no command and names the setting instead.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from common.errors import HbenchError
from harness.config import RunConfig

_DEFAULTS = RunConfig().to_dict()
#: ``hbench capacity``'s own flags for RunConfig fields; every other field goes
#: through its ``--set``. Its rate and seed are the grid it searches.
CAPACITY_FLAGS = {"org": "--org", "budget": "--budget", "requests": "--requests",
                  "ckpt_publish": "--ckpt-publish", "ckpt_evict": "--ckpt-evict"}
CAPACITY_VARIES = ("rate", "seed")


@dataclass(frozen=True)
class Suggestion:
    """A command to run next (``command``, as a shell line), or None with the
    settings of the run it could not carry (``uncarried``, each a short
    phrase naming the flag and why)."""

    command: str | None
    uncarried: tuple[str, ...] = ()


def changed_fields(cfg: Mapping) -> dict:
    """The fields of a recorded config whose values differ from `RunConfig`'s
    defaults, in the config's field order (a field the record lacks is at its
    default)."""
    return {k: cfg[k] for k in _DEFAULTS if k in cfg and cfg[k] != _DEFAULTS[k]}


def capacity_command(cfg: Mapping, rates: Sequence[float], seeds: str = "1-3") -> Suggestion:
    """``hbench capacity`` over ``rates`` and ``seeds`` for the arm of ``cfg``,
    with every other setting of the run: org and budget always, the run
    length (``--requests``; capacity's own default is another), the
    checkpoint policies by their flags, the rest by ``--set``."""
    changed = changed_fields(cfg)
    if changed.get("workload_path"):
        return Suggestion(None, (f"--workload {shlex.quote(str(changed['workload_path']))} "
                                 "(a saved workload keeps the rate it was built with)",))
    argv = ["hbench", "capacity", "--org", str(cfg["org"]), "--budget", str(cfg["budget"]),
            "--rates", ",".join(number_text(r) for r in rates), "--seeds", seeds]
    if cfg.get("duration_s") is None:
        argv += ["--requests", str(cfg["requests"])]
    uncarried = []
    for field, value in changed.items():
        if field in CAPACITY_VARIES or field in ("org", "budget", "requests"):
            continue
        text = value_text(field, value)
        if text is None:
            uncarried.append(f"{field}={value!r} (not expressible as --set {field}=VALUE)")
        elif field in CAPACITY_FLAGS:
            argv += [CAPACITY_FLAGS[field], text]
        else:
            argv += ["--set", f"{field}={text}"]
    if uncarried:
        return Suggestion(None, tuple(uncarried))
    return Suggestion(shlex.join(argv))


def value_text(field: str, value) -> str | None:
    """``value`` of ``field`` as command-line text that reads back to it
    (`harness.grid.parse_values`, what ``--set`` uses), or None if no text
    does (a comma inside would make two values)."""
    from harness.grid import parse_values

    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, float):
        text = number_text(value)
    elif value is None:
        text = "none"
    else:
        text = str(value)
    try:
        return text if parse_values(field, text) == (value,) else None
    except HbenchError:
        return None


def number_text(x: float) -> str:
    """The shortest text of ``x`` that reads back exactly (6 significant
    digits where they are enough)."""
    short = f"{x:g}"
    return short if float(short) == x else repr(float(x))
