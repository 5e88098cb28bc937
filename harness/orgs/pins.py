"""What a preemption pins: one small class per policy, chosen by the layout.

A recompute-style preemption releases everything a request holds, but what
it pins survives until the request is admitted again or abandoned (DESIGN.md
section 4: pinning is a correctness requirement, not retention). Which state
that is depends on the engine being modelled, so it is a policy the
organization is composed with rather than a branch inside it:

    policy                 ``OrgLayout.preempt_pin``  pins
    `DeepestOwnCheckpoint` "checkpoint" (the study)   the deepest valid checkpoint on
                                                      the request's own path
    `JointHit`             "joint" (hbench's plugin)  the longest joint hit a lookup
                                                      would find now, with the
                                                      attention blocks before it
    `NoPin`                "none" (stock vLLM, S0)    nothing

A policy only chooses; `Pins` takes the holds (`EntryTable.pin`,
`PagePool.add_hold`), remembers them per request and releases them, so every
pin goes through the same counters whatever chose it.
"""

from __future__ import annotations

from harness.orgs.attention import AttentionIndex
from harness.orgs.checkpoints import CheckpointStore
from harness.orgs.entries import Entry, EntryTable, RequestState


class PinPolicy:
    """Chooses what a preemption of a request in state ``st`` pins, reading the
    organization's attention index and checkpoint store (never changing them)."""

    def __init__(self, attn: AttentionIndex, ckpts: CheckpointStore, grid: int):
        self.attn, self.ckpts = attn, ckpts

    def choose(self, st: RequestState) -> tuple[Entry | None, list[int]]:
        """(the checkpoint to pin or None, pool-0 pages of attention blocks to hold)."""
        raise NotImplementedError


class DeepestOwnCheckpoint(PinPolicy):
    """The study: the deepest valid checkpoint on the request's own path, whether
    it published it, adopted it, or found it already published at one of its
    grid boundaries; no attention block (it stays cached while unreferenced)."""

    def choose(self, st: RequestState) -> tuple[Entry | None, list[int]]:
        ckpt = None
        for e in [*st.published, *st.on_path]:
            if e is not None and e.valid and (ckpt is None or e.pos > ckpt.pos):
                ckpt = e
        return ckpt, []


class JointHit(PinPolicy):
    """hbench's vLLM plugin: the checkpoint of the longest joint hit a lookup of
    the request's tokens would find now, and the attention blocks before it.
    Its registered blocks are in lookup, so the edges to try are those of its
    leading registered blocks; that needs checkpoints on block edges (vLLM's
    blocks, where the grid is the block)."""

    def __init__(self, attn: AttentionIndex, ckpts: CheckpointStore, grid: int):
        assert grid == attn.block_tokens, "joint pins need checkpoints on block edges"
        super().__init__(attn, ckpts, grid)

    def choose(self, st: RequestState) -> tuple[Entry | None, list[int]]:
        key, n = self.attn.key, 0
        while n < len(st.attn) and key[st.attn[n]] is not None:
            n += 1
        for b in range(n, 0, -1):
            ckpt = self.ckpts.map.get(key[st.attn[b - 1]])    # the prefix [0, b B)'s key
            if ckpt is not None:
                return ckpt, [self.attn.map[key[page]] for page in st.attn[:b]]
        return None, []


class NoPin(PinPolicy):
    """Stock vLLM: a preemption pins nothing; the request resumes from whatever
    is still cached."""

    def choose(self, st: RequestState) -> tuple[Entry | None, list[int]]:
        return None, []


def pin_policy_for(name: str, attn: AttentionIndex, ckpts: CheckpointStore,
                   grid: int) -> PinPolicy:
    """The policy ``name`` (a key of `PIN_POLICIES`, as `OrgLayout.preempt_pin`
    holds it) over this organization's attention index and checkpoint store."""
    cls = PIN_POLICIES.get(name)
    if cls is None:
        raise ValueError(f"unknown preemption pin {name!r}; choose from {', '.join(PIN_POLICIES)}")
    return cls(attn, ckpts, grid)


#: ``OrgLayout.preempt_pin`` -> the policy it names; the one list of pin policies.
PIN_POLICIES: dict[str, type[PinPolicy]] = {
    "checkpoint": DeepestOwnCheckpoint, "joint": JointHit, "none": NoPin}


class Pins:
    """The holds preemptions left: per preempted request the checkpoint pinned
    (``checkpoints``) and the pool-0 pages of the attention blocks held with
    it (``blocks``), as ``policy`` chose them."""

    def __init__(self, policy: PinPolicy, table: EntryTable):
        self.policy, self.table = policy, table
        self.checkpoints: dict[object, Entry] = {}
        self.blocks: dict[object, list[int]] = {}

    def hold(self, rid, st: RequestState) -> None:
        """Pin what the policy chooses for the request ``rid`` about to be
        preempted (before its own references are released)."""
        ckpt, blocks = self.policy.choose(st)
        if ckpt is not None:
            self.table.pin(ckpt)
            self.checkpoints[rid] = ckpt
        pool = self.table.pools[0]
        for page in blocks:
            pool.add_hold(page)
        if blocks:
            self.blocks[rid] = blocks

    def release(self, rid) -> None:
        """Release what ``rid``'s preemption pinned, if anything."""
        ckpt = self.checkpoints.pop(rid, None)
        if ckpt is not None:
            self.table.unpin(ckpt)
        pool = self.table.pools[0]
        for page in self.blocks.pop(rid, ()):
            pool.drop_hold(page)
