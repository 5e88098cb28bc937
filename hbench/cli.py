"""The ``hbench`` command line: a click group whose commands live in
``hbench/commands/``, one module per command (or command group).

Each command is thin: it parses flags, calls plain functions of the room that
does the work (the runner, sweeps, calibration, fidelity and verification in
`hbench`; organizations, workloads, engines, analysis below it) and prints.
No command calls another command. A user error raises `HbenchError`, which
the group turns into ``Error: ...`` and exit status 2 (1 for an
`HbenchFailure`: good input, a documented check failed); an interrupt
(SIGINT, SIGTERM, SIGHUP: `hbench.interrupts`) becomes one ``Error:`` line and
the signal's exit status, 128 + its number.
"""

from __future__ import annotations

import errno
import gc
import importlib
import os
import sys

import click

from common.atomic import DISK_ERRNOS
from common.errors import HbenchError
from harness import __version__
from hbench.flag_once import OnceGroup
from hbench.interrupts import as_interrupted, signals_interrupt

# (module, attribute) of each registered command; imported lazily so that a
# command's heavy imports (pandas, matplotlib) do not slow the others.
COMMANDS: dict[str, tuple[str, str]] = {
    "geometry": ("hbench.commands.geometry", "geometry"),
    "budget": ("hbench.commands.budget", "budget"),
    "ledger": ("hbench.commands.ledger", "ledger"),
    "tiny-model": ("hbench.commands.tiny_model", "tiny_model"),
    "verify": ("hbench.commands.verify", "verify"),
    "analyze": ("hbench.commands.analyze", "analyze"),
    "reuse": ("hbench.commands.reuse", "reuse"),
    "regress": ("hbench.commands.regress", "regress"),
    "hardware": ("hbench.commands.hardware", "hardware"),
    "workload": ("hbench.commands.workload", "workload"),
    "run": ("hbench.commands.run", "run"),
    "sweep": ("hbench.commands.sweep", "sweep"),
    "reproduce": ("hbench.commands.reproduce", "reproduce"),
    "capacity": ("hbench.commands.capacity", "capacity"),
    "advise": ("hbench.commands.advise", "advise"),
    "explain": ("hbench.commands.explain", "explain"),
    "report": ("hbench.commands.report", "report"),
    "calibrate": ("hbench.commands.calibrate", "calibrate"),
    "fidelity": ("hbench.commands.fidelity", "fidelity"),
    "probe": ("hbench.commands.probe", "probe"),
}


class LazyGroup(OnceGroup):
    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module, attr = COMMANDS[name]
        return getattr(importlib.import_module(module), attr)

    def invoke(self, ctx):
        try:
            with signals_interrupt():
                return super().invoke(ctx)
        except KeyboardInterrupt as exc:   # SIGINT, SIGTERM, SIGHUP: unwound, cleaned up
            interrupted = as_interrupted(exc)
            click.echo(f"Error: {interrupted.message}", err=True)
            sys.exit(interrupted.exit_code)
        except HbenchError as exc:
            click.echo(f"Error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except click.UsageError as exc:   # bad flag value: one line, not the usage text
            click.echo(f"Error: {exc.format_message()}", err=True)
            sys.exit(2)
        except OSError as exc:   # the terminal or file that stdout goes to took no more
            if exc.errno not in OUTPUT_ERRNOS:
                raise
            _stdout_to_devnull()
            click.echo(f"Error: cannot write the output: {exc.strerror}", err=True)
            sys.exit(2)


#: What writing the output (stdout: a full disk, a closed pipe) may fail with.
OUTPUT_ERRNOS = DISK_ERRNOS | {errno.EPIPE}


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush of what could
    not be written fails no second time at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):   # no real file behind stdout (a test's)
        pass


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hbench")
def cli():
    """hbench: how should serving memory be laid out for hybrid
    (attention + state-space) LLMs?

    \b
    Typical use:
      hbench geometry --model falcon-h1-7b     state sizes per layer
      hbench budget b83                        what a budget buys each organization
      hbench run --org s2 --budget b83         one simulated serving run
      hbench analyze results/                  paired-seed statistics and figures
    """


def main():
    try:
        cli(prog_name="hbench")
    finally:
        exit_without_collecting()


def exit_without_collecting() -> None:
    """Let the process end without the cyclic collector's last passes.

    At exit the interpreter collects garbage again as it tears the modules
    down: ~20 ms of a study-sized run (0.5 s), spent traversing numpy's,
    pyarrow's and hbench's objects to free memory the process is about to
    return anyway. `gc.freeze` moves every object to the permanent
    generation, which no pass visits. What exit must still do happens as
    before: atexit handlers run (temporary directories are removed by
    `weakref.finalize`'s), stdout and stderr are flushed, objects are freed
    by reference counting and the exit status stands. Only finalizers of
    objects in reference cycles are skipped; a command has written, closed
    and renamed every file it makes before it returns (`common.atomic`).
    Called by the ``hbench`` entry point alone, never inside a command, so
    that a process that calls commands (a test, a notebook) keeps its
    collector.
    """
    gc.freeze()


if __name__ == "__main__":
    main()
