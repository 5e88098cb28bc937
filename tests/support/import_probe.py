"""Which of some modules an ``hbench`` command loads, asked of a fresh
interpreter (a test process has long imported everything): `loaded` runs
``hbench ARGS`` there, after importing ``imports`` first (a control that
shows the probe sees a module that was loaded)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support import REPO_ROOT

PROBE = """
import json, sys
args, imports, watched = (json.loads(a) for a in sys.argv[1:4])
for m in imports:
    __import__(m)
sys.argv = ["hbench", *args]
from hbench.cli import main

try:
    main()
    code = 0
except SystemExit as exc:
    code = exc.code or 0
sys.stdout.flush()
print(json.dumps({"code": code, "loaded": sorted(m for m in watched if m in sys.modules)}),
      file=sys.stderr)
"""


def loaded(args: list[str], watched, imports=(), env=None,
           timeout: float = 120) -> tuple[dict, str]:
    """``({"code": exit code, "loaded": the watched modules loaded}, stdout)``."""
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args), json.dumps(list(imports)),
                          json.dumps(list(watched))],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return json.loads(out.stderr.strip().splitlines()[-1]), out.stdout
