"""`hbench --help` and every `hbench CMD --help` load none of the heavy
libraries (scipy, pandas, matplotlib, torch): listing or describing commands
must cost what click costs, not what a run or an analysis costs.

Each call runs in a fresh interpreter (a test process has long imported
everything) and reports the modules it loaded; the control case shows that
the probe does see those libraries when they are loaded."""

import pytest

from hbench.cli import COMMANDS
from tests.support.import_probe import loaded

HEAVY = ("scipy", "pandas", "matplotlib", "torch")


def probe(args: list[str], imports: list[str] = ()) -> tuple[dict, str]:
    return loaded(args, HEAVY, imports)


@pytest.mark.slow
@pytest.mark.parametrize("args", [["--help"]] + [[name, "--help"] for name in sorted(COMMANDS)],
                         ids=lambda a: " ".join(a))
def test_help_loads_no_heavy_library(args):
    report, text = probe(args)
    assert report["code"] == 0
    assert text.startswith(f"Usage: hbench {' '.join(args[:-1])}".rstrip())
    assert report["loaded"] == []


@pytest.mark.slow
def test_the_probe_sees_a_heavy_library_that_was_loaded():
    report, text = probe(["--help"], imports=["analysis.designs"])
    assert report["code"] == 0 and text.startswith("Usage: hbench")
    assert {"scipy", "pandas"} <= set(report["loaded"])


def test_the_reproduce_command_names_every_design():
    from analysis.designs import DESIGNS
    from hbench.commands.reproduce import DESIGN_NAMES

    assert DESIGN_NAMES == tuple(DESIGNS)
