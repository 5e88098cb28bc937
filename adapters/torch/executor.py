"""One engine step with real tensors: the batch the scheduler built, computed.

For each item of a `StepBatch` the executor reads the request's state where
the organization placed it and computes its tokens:

* A prefill chunk ``[start, end)`` starts from the zero state at position 0,
  or else from the request's live state, gathered from its pages (after
  admission with a prefix hit, the adopt copy has already filled it). The
  chunk runs in segments split at the checkpoint grid, so the state at each
  boundary is known exactly; its K/V go into the request's blocks through
  the block table.
* Decode items run as one batch, one token each (attention through the
  block tables with the online softmax of
  `adapters.torch.attention.paged_decode_attention`). With ``kernels`` (the
  default on a GPU, `adapters.torch.engine`) the recurrent states stay in
  their pages: the Triton state kernels read and update them there through
  the batch's page tables (`FalconH1.decode_paged`), and nothing is left to
  place afterwards. Without, each request's live state is gathered into a
  batch, computed on, and placed back on commit.

Where the state goes afterwards depends on what `commit` publishes, so the
executor keeps it `Pending` and `write_back` places it once the
organization's copies are known:

    live state before the step: L0;  boundaries b1 < b2 <= end
    publish b1: L0 -> L1   state(b1) into L0, copy L0 -> L1 (L0 is now the checkpoint)
    publish b2: L1 -> L2   state(b2) into L1, copy L1 -> L2
    end state              into the current live object, unless the copy at
                           b == end already put it there

A boundary someone else already published has no copy: the request keeps its
live object. Token ids of the workload are folded into the model's
vocabulary (``id mod vocab``); generated ids are the model's own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from adapters.torch.model import FalconH1
from adapters.torch.pools import Pools
from common.errors import HbenchError
from harness.orgs.protocol import OrganizationProtocol


@dataclass
class Pending:
    """A request's state after the step, not yet placed (see the module docstring)."""

    live: object                       # the org's StatePlacement of the live state before
    end: int
    final: tuple[torch.Tensor, torch.Tensor] | None    # None: already in place (kernels)
    boundaries: list[tuple[int, torch.Tensor, torch.Tensor]] = field(default_factory=list)


@dataclass
class StepTiming:
    """Wall-clock seconds of one step's parts."""

    compute_s: float = 0.0       # model forward passes
    state_io_s: float = 0.0      # gathers, scatters and page copies


class Executor:
    def __init__(self, model: FalconH1, pools: Pools, org: OrganizationProtocol,
                 keep_logits: bool = False, kernels: bool = False):
        self.model = model
        self.kernels = kernels               # decode through the paged state kernels
        self.pools = pools
        self.org = org                       # read-only placement queries
        self.vocab = model.cfg.vocab_size
        self.device = model.device
        self.pending: dict[object, Pending] = {}
        self.timing = StepTiming()
        self.copies = {"adopt": 0, "publish": 0}
        # rid -> logits of every token it emitted (kept only when asked: `hbench verify`)
        self.logits: dict[object, list[torch.Tensor]] | None = {} if keep_logits else None

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _tokens(self, ids) -> torch.Tensor:
        return torch.tensor([int(t) % self.vocab for t in ids], dtype=torch.long,
                            device=self.device)

    def _table(self, rid) -> list[int]:
        return self.pools.rows(0, [ref.page for ref in self.org.block_table(rid)])

    # ---- copies the organization asks for ---------------------------------------------
    def on_admit(self, rid, copies) -> None:
        t = time.perf_counter()
        for c in copies:
            if c.reason == "adopt":
                self.pools.copy(c.src, c.dst)
                self.copies["adopt"] += 1
        self._sync()
        self.timing.state_io_s += time.perf_counter() - t

    def on_commit(self, rid, copies) -> None:
        """Place the request's pending state (see the module docstring)."""
        pend = self.pending.pop(rid, None)
        if pend is None:
            return
        t = time.perf_counter()
        by_pos = {c.position: c for c in copies if c.reason == "publish"}
        cur, placed = pend.live, False
        for j, ssm, conv in pend.boundaries:
            c = by_pos.get(j)
            placed = False
            if c is None:
                continue            # published by someone else: keep the live object
            self.pools.scatter(c.src, ssm, conv)
            self.pools.copy(c.src, c.dst)
            self.copies["publish"] += 1
            cur, placed = c.dst, j == pend.end
        if not placed and pend.final is not None:
            self.pools.scatter(cur, *pend.final)
        self._sync()
        self.timing.state_io_s += time.perf_counter() - t

    # ---- one step -----------------------------------------------------------------
    def begin_step(self) -> None:
        """A new step starts (before scheduling: adopt copies happen while it plans)."""
        self.timing = StepTiming()
        self.pending.clear()

    def run(self, batch) -> dict:
        """Compute every item; returns rid -> the token id each emitting item generated."""
        out: dict = {}
        decodes = []
        for item in batch.items:
            if item.prefill:
                self._prefill(item, out)
            else:
                decodes.append(item)
        if decodes:
            self._decode(decodes, out)
        return out

    def _emit(self, rids: list, logits: torch.Tensor, out: dict, emits: bool = True) -> None:
        """Greedy tokens of ``logits [len(rids), vocab]``: one check, one argmax and
        one transfer for the whole batch."""
        finite = torch.isfinite(logits).all(dim=1).tolist()
        if not all(finite):
            rid = rids[finite.index(False)]
            raise HbenchError(
                f"request {rid}: non-finite logits; the step read state that was never "
                "written or whose page was freed (an organization bookkeeping error)")
        if not emits:
            return
        ids = logits.argmax(dim=1).tolist()
        host = logits.float().cpu() if self.logits is not None else None
        for k, rid in enumerate(rids):
            out[rid] = ids[k]
            if host is not None:
                self.logits.setdefault(rid, []).append(host[k])

    def _prefill(self, item, out: dict) -> None:
        r, m, pools = item.req, self.model, self.pools
        start, end = item.start, item.end
        live = self.org.live_state(r.rid)
        t = time.perf_counter()
        if start == 0:
            ssm, conv = m.shapes.zero_state()
            ssm, conv = ssm.to(self.device, m.dtype), conv.to(self.device, m.dtype)
        else:
            ssm, conv = pools.gather(live)
        self._sync()
        t1 = time.perf_counter()
        self.timing.state_io_s += t1 - t
        grid = item.grid
        last = min(end, r.prefill_until)
        cuts = list(range((start // grid + 1) * grid, last + 1, grid))
        table = self._table(r.rid)
        pend = Pending(live, end, (ssm, conv))
        pos, logits = start, None
        for stop in [*cuts, end]:
            if stop <= pos:
                continue
            logits = m.prefill_chunk(self._tokens(r.tokens[pos:stop]), pos, pools.kv, table,
                                     ssm, conv, last_only=True)
            pos = stop
            if stop in cuts:
                pend.boundaries.append((stop, ssm.clone(), conv.clone()))
        self._sync()
        self.timing.compute_s += time.perf_counter() - t1
        self.pending[r.rid] = pend
        self._emit([r.rid], logits, out, end >= len(r.tokens))

    def _decode(self, items, out: dict) -> None:
        m, pools = self.model, self.pools
        t = time.perf_counter()
        lives = [self.org.live_state(i.req.rid) for i in items]
        tokens = self._tokens([i.req.tokens[i.start] for i in items])
        positions = torch.tensor([i.start for i in items], dtype=torch.long, device=self.device)
        tables = [self._table(i.req.rid) for i in items]
        if self.kernels:
            pool, state_tables = pools.tables(lives)
            finals = [None] * len(items)
        else:
            states = [pools.gather(p) for p in lives]
            ssm = torch.stack([s for s, _ in states])
            conv = torch.stack([c for _, c in states])
            finals = [(ssm[k], conv[k]) for k in range(len(items))]
        self._sync()
        t1 = time.perf_counter()
        self.timing.state_io_s += t1 - t
        if self.kernels:
            logits = m.decode_paged(tokens, positions, pools.kv, tables, pool, state_tables)
        else:
            logits = m.decode(tokens, positions, pools.kv, tables, ssm, conv)
        self._sync()
        self.timing.compute_s += time.perf_counter() - t1
        for item, live, final in zip(items, lives, finals, strict=True):
            self.pending[item.req.rid] = Pending(live, item.end, final)
        self._emit([i.req.rid for i in items], logits, out)
