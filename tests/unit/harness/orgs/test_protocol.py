"""The organization protocol lists exactly what the scheduler and the engines
call on an organization, and every organization (and the torch engine's
forwarding wrapper) satisfies it."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import harness.scheduler
from harness.model_configs import preset
from harness.orgs import ORGANIZATIONS, build_organization, layout_for, pool_split
from harness.orgs.protocol import OrganizationProtocol

ROOT = Path(__file__).resolve().parents[4]
#: the code that drives an organization: the scheduler and the engines
CALLERS = ("harness/scheduler", "harness/engine", "adapters/sim", "adapters/torch")
#: the names an organization goes by there
ORG_NAMES = {"org", "organization"}


def _is_org(node: ast.AST) -> bool:
    """``org`` / ``organization``, or ``self.org`` / ``self._org``."""
    if isinstance(node, ast.Name):
        return node.id in ORG_NAMES
    return (isinstance(node, ast.Attribute) and node.attr in ORG_NAMES | {"_org"}
            and isinstance(node.value, ast.Name) and node.value.id == "self")


def called_names() -> set[str]:
    """Every attribute the callers read or call on an organization, from their source
    (``org.x``, and ``getattr(org, "x")``)."""
    names = set()
    for folder in CALLERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Attribute) and _is_org(node.value):
                    names.add(node.attr)
                elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                      and node.func.id in ("getattr", "hasattr") and node.args
                      and _is_org(node.args[0]) and isinstance(node.args[1], ast.Constant)):
                    names.add(node.args[1].value)
    return names


def protocol_names() -> set[str]:
    members = {n for n, _ in inspect.getmembers(OrganizationProtocol)
               if not n.startswith("_") and n in OrganizationProtocol.__dict__}
    return members | set(OrganizationProtocol.__annotations__)


def test_the_protocol_lists_exactly_what_scheduler_and_engines_call():
    called, listed = called_names(), protocol_names()
    assert "allocate" in called and "grid" in called   # the walk found the callers
    assert sorted(called - listed) == [], "called but not in OrganizationProtocol"
    assert sorted(listed - called) == [], "in OrganizationProtocol but called by none"


def test_the_scheduler_is_typed_on_the_protocol():
    hints = inspect.signature(harness.scheduler.Scheduler.__init__).parameters
    assert hints["org"].annotation in ("OrganizationProtocol", OrganizationProtocol)


@pytest.mark.parametrize("org", sorted(ORGANIZATIONS))
def test_every_organization_satisfies_the_protocol(org):
    layout = layout_for(org, preset("falcon-h1-7b"))
    built = build_organization(layout, (64,) * pool_split(org).pool_count)
    assert isinstance(built, OrganizationProtocol)
    for name in protocol_names():
        assert hasattr(built, name), name


@pytest.mark.slow   # imports torch
def test_the_torch_engines_wrapper_satisfies_it():
    tracking = pytest.importorskip("adapters.torch.tracking")
    layout = layout_for("s1", preset("falcon-h1-7b"))
    org = tracking.TrackedOrg(build_organization(layout, (64,)), lambda *a: None, lambda *a: None)
    assert isinstance(org, OrganizationProtocol)
