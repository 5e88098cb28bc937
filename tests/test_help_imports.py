"""`hbench --help` and every `hbench CMD --help` load none of the heavy
libraries (scipy, pandas, matplotlib, torch): listing or describing commands
must cost what click costs, not what a run or an analysis costs.

Each call runs in a fresh interpreter (a test process has long imported
everything) and reports the modules it loaded; the control case shows that
the probe does see those libraries when they are loaded."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hbench.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("scipy", "pandas", "matplotlib", "torch")

PROBE = """
import json, sys
args, imports, heavy = (json.loads(a) for a in sys.argv[1:4])
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
print(json.dumps({"code": code, "loaded": sorted(m for m in heavy if m in sys.modules)}), file=sys.stderr)
"""


def probe(args: list[str], imports: list[str] = ()) -> tuple[dict, str]:
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args), json.dumps(list(imports)),
                          json.dumps(HEAVY)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    return json.loads(out.stderr.strip().splitlines()[-1]), out.stdout


@pytest.mark.parametrize("args", [["--help"]] + [[name, "--help"] for name in sorted(COMMANDS)],
                         ids=lambda a: " ".join(a))
def test_help_loads_no_heavy_library(args):
    report, text = probe(args)
    assert report["code"] == 0
    assert text.startswith(f"Usage: hbench {' '.join(args[:-1])}".rstrip())
    assert report["loaded"] == []


def test_the_probe_sees_a_heavy_library_that_was_loaded():
    report, text = probe(["--help"], imports=["analysis.designs"])
    assert report["code"] == 0 and text.startswith("Usage: hbench")
    assert {"scipy", "pandas"} <= set(report["loaded"])


def test_the_reproduce_command_names_every_design():
    from analysis.designs import DESIGNS
    from hbench.commands.reproduce import DESIGN_NAMES

    assert DESIGN_NAMES == tuple(DESIGNS)
