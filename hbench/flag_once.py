"""Every setting is given once: a repeated flag, or a field set both by its
flag and by ``--set``, is an error, never a silent choice.

click keeps the last of a repeated single-valued option (``--seeds 1-3
--seeds 4-6`` would sweep seeds 4-6 alone) and a command that merges
``--set`` into its flags picks one by the order of its code. `OnceGroup`
refuses the first before a command parses its arguments (a group whose
commands are checked: the CLI's and ``hbench workload``); `set_fields`
reads ``--set KEY=VALUE`` items and refuses a key given twice or given by its
own flag too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import click


def _options(command: click.Command) -> dict[str, click.Option]:
    return {o: p for p in command.params if isinstance(p, click.Option)
            for o in (*p.opts, *p.secondary_opts)}


def _single(p: click.Option) -> bool:
    return not (p.multiple or p.count or p.is_flag) and p.nargs == 1


def repeated_option(command: click.Command, args: Iterable[str]) -> str | None:
    """The first single-valued option of ``command`` that ``args`` give more
    than once, as the user wrote its second use; None when none is."""
    options, seen = _options(command), set()
    args = list(args)
    i = 0
    while i < len(args):
        tok = args[i]
        if tok == "--":
            break
        if tok.startswith("--"):
            name, inline = tok.partition("=")[0], "=" in tok
        elif tok.startswith("-") and len(tok) > 1:
            name, inline = tok[:2], len(tok) > 2
        else:
            i += 1
            continue
        p = options.get(name)
        i += 1
        if p is None:
            continue
        if _single(p):
            if p.name in seen:
                return name
            seen.add(p.name)
        if not (p.is_flag or p.count) and not inline:
            i += p.nargs   # its value, whatever it looks like
    return None


class OnceGroup(click.Group):
    """A group whose commands refuse a single-valued option given twice."""

    def resolve_command(self, ctx, args):
        name, cmd, rest = super().resolve_command(ctx, args)
        if cmd is not None and not isinstance(cmd, click.Group):
            flag = repeated_option(cmd, rest)
            if flag is not None:
                raise click.UsageError(f"{flag} was given more than once; give it once")
        return name, cmd, rest


def set_fields(items: Iterable[str], flags: Mapping[str, str], form: str = "KEY=VALUE") -> dict[str, str]:
    """``--set KEY=VALUE`` items as {field: text}, a key's dashes read as
    underscores; click.UsageError for an item that is not ``form``, a key
    given twice, or a key that ``flags`` ({field: flag} of the flags the user
    typed) sets too."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        field = key.strip().replace("-", "_")
        if not sep or not field:
            raise click.UsageError(f"--set expects {form}, got {item!r}")
        if field in out:
            raise click.UsageError(f"--set {key.strip()} was given more than once; give it once")
        if field in flags:
            raise click.UsageError(f"{field} is set both by {flags[field]} and by --set {key.strip()}; "
                                   "give it once")
        out[field] = value
    return out
