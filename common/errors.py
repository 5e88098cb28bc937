"""The one exception type the CLI turns into a one-line error.

Anything a user can get wrong (an unknown model, a malformed config.json, a
budget that cannot hold one request) raises `HbenchError` with a message that
says what was wrong and what would be right. The CLI prints it as
``Error: <message>`` and exits non-zero without a traceback; any other
exception is a bug and keeps its traceback.
"""


class HbenchError(Exception):
    """A user-facing error: bad input, infeasible configuration, missing file."""
