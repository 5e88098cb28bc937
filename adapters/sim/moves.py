"""Pricing capacity moves and compaction: the step that moves pages pays for it.

An organization whose pools trade capacity while serving (e0,
`harness.orgs.e0`) moves free pages from one pool's virtual range to the
other's while the scheduler plans a step (an allocation that one pool cannot
serve). No state is copied; the cost is the remapping, host-side driver
calls the step waits for (`CostModel.move_s`). `MovePricing` stands where
the cost model stands (``step``, ``decode_step``, ``decode_values``: what
the executor and a stretch of decode steps price with) and adds to each
step the remapping of the bytes moved since the step priced before it:

    plan step j (allocations; e0 may move capacity)   moved_capacity_bytes grows
    price step j: cost model's price                  + move_s(bytes moved x layers)
                  (into overhead_s and total_s)

Every step is priced right after its planning, so the bytes are charged to
the step whose planning moved them. A step that moved nothing is priced
exactly as the cost model prices it (the same object or tuple), so an
organization that never moves capacity runs bit-identical with or without it.
U0 (`harness.orgs.u0`) instead moves pages with content within its side
when it compacts; those are device copies (`CostModel.copy_s`), charged the
same way from ``compacted_bytes``. ``move_s_total``, ``copy_s_total`` and
``priced_moves`` (steps charged) are the run's counters.
"""

from __future__ import annotations

from dataclasses import replace


class MovePricing:
    """The cost model of ``model`` plus ``org``'s capacity moves (module docstring);
    ``layers`` turns the organization's per-pool-layer bytes into whole-model bytes."""

    def __init__(self, model, org, layers: int):
        self.model, self.org, self.layers = model, org, layers
        self._seen = org.moved_capacity_bytes
        self._seen_copied = org.compacted_bytes
        self.move_s_total = 0.0
        self.copy_s_total = 0.0
        self.priced_moves = 0

    def _pending_s(self) -> float:
        """Seconds of the moves and copies since the last priced step (0.0 if
        none); marks them charged."""
        moved, copied = self.org.moved_capacity_bytes, self.org.compacted_bytes
        if moved == self._seen and copied == self._seen_copied:
            return 0.0
        s = 0.0
        if moved != self._seen:
            delta, self._seen = moved - self._seen, moved
            s = self.model.move_s(delta * self.layers)
            self.move_s_total += s
        if copied != self._seen_copied:
            delta, self._seen_copied = copied - self._seen_copied, copied
            c = self.model.copy_s(delta * self.layers)
            self.copy_s_total += c
            s += c
        self.priced_moves += 1
        return s

    def step(self, shape):
        cost = self.model.step(shape)
        s = self._pending_s()
        if not s:
            return cost
        return replace(cost, overhead_s=cost.overhead_s + s, total_s=cost.total_s + s)

    def decode_step(self, requests: int, context_tokens: int):
        cost = self.model.decode_step(requests, context_tokens)
        s = self._pending_s()
        if not s:
            return cost
        return replace(cost, overhead_s=cost.overhead_s + s, total_s=cost.total_s + s)

    def decode_values(self, requests: int, context_tokens: int) -> tuple:
        values = self.model.decode_values(requests, context_tokens)
        s = self._pending_s()
        if not s:
            return values
        return (*values[:4], values[4] + s, values[5] + s, *values[6:])

    def counters(self) -> dict:
        """The run's pricing: seconds charged for remapping (``capacity_move_s``)
        and for compaction's copies (``compaction_copy_s``)."""
        return {"capacity_move_s": self.move_s_total, "compaction_copy_s": self.copy_s_total}
