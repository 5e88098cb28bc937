"""S0, coarse shared pages: one pool of checkpoint-sized pages.

Every object takes one page of max(A, C) bytes: a 512-token attention block
uses A of it (for Falcon-H1-7B 512 of 1557 KiB; 1045 KiB wasted) and a
checkpoint fills it. This is what stock vLLM does when it pads attention and
Mamba pages to one size. Nothing here but the layout: the shared machinery in
`harness.orgs.base` does the rest.
"""

from harness.orgs.base import Organization


class S0(Organization):
    name = "s0"
