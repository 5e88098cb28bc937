"""``hbench`` invoked in process (click's CliRunner), and what a refusal must look like."""

from __future__ import annotations

import json

from click.testing import CliRunner, Result

from hbench.cli import cli


def invoke(*args) -> Result:
    """``hbench ARGS`` in this process; every argument as a string."""
    return CliRunner().invoke(cli, [str(a) for a in args])


def overridden(pairs, args) -> list:
    """``pairs`` (flag, value, flag, value, ...) less the flags ``args`` give,
    then ``args``: a case replaces a default flag, since hbench refuses a flag
    given twice."""
    given = {str(a) for a in args}
    kept = [x for flag, value in zip(pairs[::2], pairs[1::2], strict=True) if flag not in given
            for x in (flag, value)]
    return [*kept, *args]


def one_error_line(res: Result, *needles: str, code: int | None = 2,
                   other_lines: bool = False) -> str:
    """Assert a refusal: exit ``code`` (any non-zero when None), no traceback,
    exactly one ``Error:`` line holding every needle (case-insensitive) and,
    unless ``other_lines``, nothing else printed. Returns the error line."""
    if code is None:
        assert res.exit_code != 0, res.output
    else:
        assert res.exit_code == code, (res.exit_code, res.output)
    assert "Traceback" not in res.output, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("Error:")]
    assert len(errors) == 1, res.output
    if not other_lines:
        assert lines == errors, res.output
    for needle in needles:
        assert needle.lower() in errors[0].lower(), (needle, errors[0])
    return errors[0]


def hbench_run(out, *args) -> tuple[dict, str]:
    """``hbench run --out OUT --json ARGS``, which must succeed; returns its
    JSON answer and the run directory it wrote."""
    res = invoke("run", "--out", out, "--json", *args)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    return doc, doc["run_dir"]
