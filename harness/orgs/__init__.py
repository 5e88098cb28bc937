"""The four memory organizations behind one interface (`harness.orgs.base`).

``ORGANIZATIONS`` maps the CLI name to the class; `build_organization` turns
a model geometry and a budget into a ready organization.
"""

from __future__ import annotations

from harness.layout import layout_for
from harness.orgs.base import Organization
from harness.orgs.d0 import D0
from harness.orgs.s0 import S0
from harness.orgs.s1 import S1
from harness.orgs.s2 import S2
from harness.orgs.values import Demand, PrefixHit, Usage

ORGANIZATIONS: dict[str, type[Organization]] = {"s0": S0, "s1": S1, "s2": S2, "d0": D0}


def build_organization(org: str, geom, pool_pages: tuple[int, ...]) -> Organization:
    """An organization of ``org``'s layout with the given pages per pool
    (one count for s0/s1/s2; attention then checkpoint pool for d0)."""
    layout = layout_for(org, geom)
    want = 2 if layout.dual_pool else 1
    if len(pool_pages) != want:
        raise ValueError(f"{org} takes {want} pool size(s), got {pool_pages}")
    return ORGANIZATIONS[org](layout, tuple(pool_pages))


__all__ = ["ORGANIZATIONS", "Demand", "Organization", "PrefixHit", "Usage", "build_organization"]
