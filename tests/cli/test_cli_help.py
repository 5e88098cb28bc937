"""Every registered command loads and explains itself."""

import pytest
from click.testing import CliRunner

from hbench.cli import COMMANDS, cli


def test_top_level_help_lists_every_command():
    res = CliRunner().invoke(cli, ["--help"])
    assert res.exit_code == 0
    for name in COMMANDS:
        assert name in res.output


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_command_help_renders(name):
    res = CliRunner().invoke(cli, [name, "--help"])
    assert res.exit_code == 0, res.output
    assert "Usage:" in res.output and len(res.output.splitlines()) > 3


def test_unknown_command_is_an_error():
    res = CliRunner().invoke(cli, ["frobnicate"])
    assert res.exit_code != 0
