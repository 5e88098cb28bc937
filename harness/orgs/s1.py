"""S1, paged checkpoints: one pool of attention-sized pages.

An attention block takes one page of A bytes; a checkpoint is scattered over
ceil(SSM / A) SSM member pages plus ceil(conv / A) dedicated conv pages
(Falcon-H1-7B: 3 + 1 pages = 2048 KiB for 1557 KiB of state). The checkpoint
is logically atomic: reclaiming any member page invalidates all of it.
"""

from harness.orgs.base import Organization


class S1(Organization):
    name = "s1"
