"""D0, native dual pools: a token-block attention pool and a checkpoint pool.

Attention lives in 16-token blocks of its own pool; checkpoints are single
contiguous units of C bytes in a second pool, published every 1792 tokens.
Both pool sizes are fixed at start by the budget split, and free space in one
pool can never serve the other: each `Demand` is checked per pool. This is
the layout SGLang uses (a Mamba state pool beside a token KV pool).
"""

from harness.orgs.base import Organization


class D0(Organization):
    name = "d0"
