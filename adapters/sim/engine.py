"""The embedded default engine: a discrete-event simulation in virtual time.

One event order, defined once: events are ``(time, kind, seq)`` tuples on a
heap, a step completing at t is handled before an arrival at t, and only this
loop advances the clock. Each step's duration comes from the roofline cost
model (`adapters.sim.cost`) applied to the batch the scheduler built, so the
simulator needs no GPU and is deterministic: the same workload and config give
identical results, bit for bit.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import heapq
import math
from array import array
from pathlib import Path

from adapters.sim.cost import CostModel, StepShape
from adapters.sim.fastpath import fast_forward, fast_path_enabled
from adapters.sim.profile import hardware_for
from harness import __version__
from harness.config import ORG_NAMES
from harness.engine.recorder import StepRecorder
from harness.errors import HbenchError
from harness.layout import PAGINGS
from harness.orgs import build_organization
from harness.orgs.keys import SharedPrefixKeys
from harness.records import EngineRun
from harness.scheduler import Scheduler, SchedulerPolicy, generated_token
from workloads.multiturn.session import SessionLoop

STEP_DONE, ARRIVAL = 0, 1   # at equal times a finishing step is handled first
#: The benchmark notices completions by polling at this interval (assumed, like a
#: serving benchmark's client loop); the ledger window ends at the next poll.
POLL_INTERVAL_S = 0.05

#: Modules whose code decides a simulated run's numbers: the simulator, the
#: summary metrics and the workload builder. The simulator version hashes these
#: and every module of ours they import (found by `_source_files`), so no list
#: of files has to be kept by hand.
_ROOTS = ("adapters.sim.engine", "harness.metrics", "harness.runner", "workloads.build",
          "workloads.io")
_PACKAGES = ("adapters", "harness", "workloads")


def _module_file(root: Path, name: str) -> Path | None:
    base = root.joinpath(*name.split("."))
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None


def _imports(path: Path, name: str) -> set[str]:
    """Our modules that ``path`` (module ``name``) imports anywhere in its body,
    with every package on the way (their ``__init__`` runs too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    ours = {m for m in found if m.split(".")[0] in _PACKAGES}
    return {".".join(m.split(".")[:i]) for m in ours for i in range(1, m.count(".") + 2)}


def _source_files(root: Path) -> list[Path]:
    """Every source file of ours reachable by imports from `_ROOTS`, sorted."""
    seen: dict[str, Path] = {}
    todo = list(_ROOTS)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _module_file(root, name)
        if path is None:   # an imported name that is not a module (a function, a class)
            continue
        seen[name] = path
        todo.extend(_imports(path, name) - seen.keys())
    return sorted(set(seen.values()))


@functools.cache
def _source_digest(root: Path | None = None) -> str:
    root = root or Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for f in _source_files(root):
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


class SimEngine:
    """The simulator. ``fast`` switches the quiet-stretch fast path
    (`adapters.sim.fastpath`) on or off; None (the default) follows
    ``HBENCH_SIM_FAST`` (on unless ``0``). Both give identical results."""

    name = "sim"
    supported_orgs = ORG_NAMES   # the simulator expresses every registered organization
    supported_pagings = PAGINGS  # the study's pages, or vLLM's blocks to mirror a vLLM run

    def __init__(self, fast: bool | None = None):
        self.fast = fast

    def version(self) -> str:
        """Changes whenever the simulator's code (hence possibly its outputs) changes."""
        return f"sim-{__version__}-{_source_digest()}"

    def build(self, setup):
        """The organization a resolved run serves with (its pools from the budget)."""
        return build_organization(setup.config.org, setup.geometry,
                                  tuple(p.pages for p in setup.budget.pools),
                                  setup.config.resolved_paging)

    def run(self, workload, setup, progress=None) -> EngineRun:
        config, geom, budget = setup.config, setup.geometry, setup.budget
        org = self.build(setup)
        check_fits(org, workload, config, budget.label)
        hardware = hardware_for(config.gpu)
        cost_model = CostModel(geom, hardware)
        sched = Scheduler(org, SchedulerPolicy.from_config(config))
        recorder = StepRecorder(org, geom.pool_layers)
        warmup = config.warmup_requests
        warm_ids = workload.warmup_ids(warmup)
        # Multi-turn sessions: a finished turn makes the next one (closed loop).
        loop = SessionLoop(workload) if workload.sessions else None
        sent: dict[int, object] = {}
        events: list[tuple] = []
        seq = 0
        for wr in workload.requests:
            events.append((wr.arrival_s, ARRIVAL, seq, wr))
            seq += 1
        heapq.heapify(events)
        batch = None        # the batch of the step in flight
        fast = self.fast if self.fast is not None else fast_path_enabled()
        check = org.check_invariants if config.debug_invariants else None
        done = 0

        shared_keys = SharedPrefixKeys()

        def add(wr) -> None:
            ids = wr.prompt_token_ids
            keys = shared_keys.chain(ids, wr.salt, wr.prefix_group, wr.prefix_tokens)
            added = sched.add(wr.request_id, wr.arrival_s, ids, wr.output_len, wr.salt,
                              wr.prefix_group, warmup=wr.request_id in warm_ids, keys=keys)
            if loop:
                sent[wr.request_id] = wr
                added.record.session, added.record.turn = loop.turn_of[wr.request_id]

        def arrive(until: float) -> int:
            """Hand over the arrivals before ``until`` (only arrivals are queued
            while a step is being fast-forwarded)."""
            n = 0
            while events and events[0][0] < until:
                _, kind, _, wr = heapq.heappop(events)
                assert kind == ARRIVAL, kind
                add(wr)
                n += 1
            return n

        def on_finish(finished, now: float) -> None:
            """Requests that finished in the step completed at ``now``."""
            nonlocal done, seq
            done += len(finished)
            for r in finished:
                if loop:
                    nxt = loop.next_turn(sent.pop(r.rid), generated_ids(r), now)
                    if nxt is not None:
                        heapq.heappush(events, (nxt.arrival_s, ARRIVAL, seq, nxt))
                        seq += 1
                # nothing reads a finished request's token ids, prefix keys and
                # token times again (its record keeps what the results need): a
                # long run holds only the unfinished requests'
                r.tokens, r.keys, r.token_times = array("i"), [], array("d")
            if finished and progress:
                progress(done)

        while events:
            now, kind, _, payload = heapq.heappop(events)
            if kind == ARRIVAL:
                add(payload)
            else:
                finished = sched.complete(batch, now)
                recorder.step_finished(now)
                batch = None
                on_finish(finished, now)
                if check is not None:
                    check()
            while batch is None and sched.has_work:
                batch = sched.schedule()
                if batch.failed and progress:
                    done += len(batch.failed)
                    progress(done)
                if not batch.items:
                    batch = None
                    break
                cost = cost_model.step(StepShape.of_batch(batch))
                recorder.step_started(now, batch, cost, len(sched.running), len(sched.waiting))
                if fast:
                    end = fast_forward(sched, batch, now, cost, arrive, cost_model, recorder,
                                       on_finish, check)
                    if end is not None:     # completed through `end.now`: plan anew
                        now, batch = end.now, None
                        continue
                heapq.heappush(events, (now + cost.total_s, STEP_DONE, seq, None))
                seq += 1
        sched.check_drained()
        records = [r.record for r in sorted(sched.requests.values(), key=lambda r: r.rid)]
        last = max((r.finish_s for r in records if r.finish_s is not None), default=0.0)
        window_end = math.ceil(last / POLL_INTERVAL_S - 1e-9) * POLL_INTERVAL_S
        info = {
            "engine": self.name, "pool_layers": geom.pool_layers,
            "pools": [{"name": p.name, "pages": p.pages, "page_bytes": p.page_bytes}
                      for p in budget.pools],
            "attn_block_tokens": org.capacity().attn_block_tokens,
            "grid_tokens": org.capacity().grid_tokens,
            "hardware": config.gpu, "poll_interval_s": POLL_INTERVAL_S,
            "cache_state": "cold", "warmup_requests": warmup,
        }
        if hasattr(hardware, "describe"):      # a measured cost profile (hbench calibrate)
            info["cost_profile"] = hardware.describe()
        return EngineRun(requests=records, steps=recorder.table(), window_start_s=0.0,
                         window_end_s=window_end, engine_info=info, peak_memory=recorder.peak,
                         counters=recorder.counters(sched.preemptions,
                                                    budget.rounding_loss_bytes))


def check_fits(org, workload, config, label: str) -> None:
    """Refuse a budget that cannot serve the longest request even alone
    (HbenchError before any simulated time passes): its first chunk, sized by
    the token budget as the scheduler sizes it, must fit with the admission
    headroom, and its attention for prompt + output, its live state and a spare
    for one checkpoint publication must fit (later chunks can shrink to one
    grid boundary)."""
    if not workload.requests:
        raise HbenchError("the workload has no requests")
    prompt, output = workload.longest_request()
    total = prompt + output
    first = (prompt if prompt <= config.token_budget
             else config.token_budget // org.grid * org.grid)
    if not org.can_allocate(org.pages_needed(-1, first, prompt), config.headroom):
        raise HbenchError(
            f"budget {label} cannot admit the longest request's first {first}-token chunk "
            f"for {org.name} with headroom {config.headroom} even alone: raise the budget, "
            "lower the headroom or lower --token-budget")
    one_boundary = min(prompt, org.grid)
    need = org.pages_needed(-1, total, one_boundary).pages
    for pool, n in zip(org.capacity().pools, need, strict=True):
        if n > pool.pages:
            raise HbenchError(
                f"budget {label} gives {org.name} {pool.pages} {pool.name} pages, but the "
                f"longest request ({total} tokens) alone needs {n}: raise the budget")


def generated_ids(r) -> list[int]:
    """Every token id a finished request generated: those the scheduler fed
    back into its sequence, plus the last one (emitted, never fed back)."""
    return [*r.tokens[r.prompt_len:], generated_token(r.rid, r.generated)]
