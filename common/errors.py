"""The exceptions the CLI turns into a one-line error, and their exit codes.

Anything a user can get wrong (an unknown model, a malformed config.json, a
budget that cannot hold one request) raises `HbenchError` with a message that
says what was wrong and what would be right. The CLI prints it as
``Error: <message>`` and exits 2 without a traceback.

`HbenchFailure` is the other kind of error: the input was good, the command
ran, and what it measured failed a documented check (requests failed on the
server, sweep cells failed, a calibration fit was refused). It exits 1, so a
script can tell "you asked wrongly" (2) from "it ran and failed" (1). Any other
exception is a bug and keeps its traceback.
"""

BAD_INPUT_EXIT = 2
FAILURE_EXIT = 1


class HbenchError(Exception):
    """A user-facing error: bad input, infeasible configuration, missing file (exit 2)."""

    exit_code = BAD_INPUT_EXIT


class HbenchFailure(HbenchError):
    """A documented failure of a command that ran on good input (exit 1)."""

    exit_code = FAILURE_EXIT
