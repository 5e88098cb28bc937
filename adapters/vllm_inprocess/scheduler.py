"""vLLM's own V1 `Scheduler` behind hbench's scheduler surface.

Runs inside the vLLM venv. `VllmScheduler` is what hbench's engine loop
(`harness.engine.loop.EngineLoop`) calls ``add``, ``schedule`` and
``complete`` on; each call is passed to vLLM's scheduler, and everything
that decides memory and batching is vLLM's: which waiting request is
admitted and how many of its tokens come from the prefix cache
(`KVCacheManager.get_computed_blocks`, Mamba ``align`` mode's joint hit),
how a prefill is chunked (the token budget and `_mamba_block_aligned_split`),
which request is preempted when `allocate_slots` finds no block, and which
cached block is evicted (the block pool's free queue). As in vLLM's unit
tests, no model runs: ``complete`` hands vLLM a fabricated
`ModelRunnerOutput` with one sampled token (`generated_token`) for each
request whose scheduled tokens reached its end, and vLLM's
``update_from_output`` stops a request at ``max_tokens`` (its output length,
``ignore_eos``).

hbench's side only reads: each scheduled request's tokens become a
`BatchItem` (``start`` = its computed tokens before the step, ``end`` after),
priced by the cost model; its record gets the token times, the prefix vLLM
reused at admission (``num_computed_tokens`` when first scheduled), how deep
attention and the Mamba states alone reached at its first lookup, and the
preemptions vLLM made. One rule is hbench's, because vLLM has none: a
request that cannot be admitted while nothing runs (vLLM would wait for it
forever) fails with the reason.
"""

from __future__ import annotations

from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import MambaSpec
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from harness.records import FAILED, FINISHED
from harness.scheduler.batch import (
    DONE,
    RUNNING,
    WAIT_BUDGET,
    WAIT_CAP,
    WAIT_MEMORY,
    WAITING,
    BatchItem,
    SchedRequest,
    StepBatch,
    generated_token,
    token_array,
)


class VllmScheduler:
    """hbench's scheduler surface over vLLM's `Scheduler` (module docstring).
    ``grid`` is the interval the step shape counts state copies on: vLLM's
    block, where ``align`` mode keeps a Mamba state."""

    def __init__(self, vllm_config, kv_cache_config, block_size: int, hash_block_size: int,
                 scheduler_cls=Scheduler):
        self.core = scheduler_cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                                  structured_output_manager=StructuredOutputManager(vllm_config),
                                  block_size=block_size, hash_block_size=hash_block_size,
                                  log_stats=True)
        hash_fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(hash_block_size, hash_fn)
        self.grid = block_size
        self.cap = vllm_config.scheduler_config.max_num_seqs
        self.token_budget = self.core.max_num_scheduled_tokens
        self.requests: dict[int, SchedRequest] = {}
        self.vllm: dict[int, Request] = {}      # live requests' vLLM objects
        self.preemptions = 0
        self.failed = 0
        # vLLM's prefix-cache counters (PrefixCacheStats), summed over steps
        self.prefix = dict.fromkeys(("requests", "queries", "hits", "preempted_requests",
                                     "preempted_queries", "preempted_hits"), 0)
        # rid -> (attention depth, deepest Mamba state) at its first lookup
        self.depths: dict[int, tuple[int, int]] = {}
        self._watch_first_lookups()

    # ---- the engine loop's surface ------------------------------------------------
    def add(self, rid, arrival_s, token_ids, output_len, salt, prefix_group=-1, warmup=False,
            keys=None) -> SchedRequest:
        r = SchedRequest.arriving(rid, arrival_s, token_array(token_ids), output_len, salt, [],
                                  prefix_group, warmup)
        self.requests[rid] = r
        v = Request(request_id=str(rid), prompt_token_ids=list(r.tokens),
                    sampling_params=SamplingParams(max_tokens=output_len, ignore_eos=True,
                                                   temperature=0.0),
                    pooling_params=None, arrival_time=arrival_s, cache_salt=salt,
                    block_hasher=self.hasher)
        self.vllm[rid] = v
        self.core.add_request(v)
        return r

    @property
    def has_work(self) -> bool:
        return self.core.get_num_unfinished_requests() > 0

    def check_drained(self) -> None:
        open_reqs = [r.rid for r in self.requests.values() if r.state != DONE]
        if open_reqs:
            raise AssertionError(f"requests neither finished nor failed: {open_reqs[:10]}")
        if self.core.requests:
            raise AssertionError(f"vLLM still holds requests {sorted(self.core.requests)[:10]}")
        for m in self.core.kv_cache_manager.coordinator.single_type_managers:
            if m.req_to_blocks:
                raise AssertionError(f"{type(m).__name__} still holds blocks for "
                                     f"{sorted(m.req_to_blocks)[:10]}")

    def schedule(self) -> StepBatch:
        """One `Scheduler.schedule()` as a `StepBatch`; the `SchedulerOutput`
        rides along as ``batch.vllm_output`` for `complete`."""
        batch = StepBatch()
        out = self._schedule()
        while not out.num_scheduled_tokens and not self.core.running and self.core.waiting:
            self._fail_head(batch)
            out = self._schedule()
        if not out.num_scheduled_tokens and self.core.running:
            raise AssertionError(f"vLLM scheduled nothing while {len(self.core.running)} "
                                 "requests run")
        batch.vllm_output = out
        for req_id in out.preempted_req_ids:
            self._preempted(self.requests[int(req_id)], batch)
        for req_id, n in out.num_scheduled_tokens.items():
            r = self.requests[int(req_id)]
            end = self.vllm[r.rid].num_computed_tokens
            start = end - n
            admitted = r.state != RUNNING
            if admitted:
                self._on_admit(r, start)
                batch.admitted.append(r.rid)
            batch.items.append(BatchItem(r, start, end, start < r.prefill_until, self.grid,
                                         adopted=admitted and start > 0))
        batch.wait_reason = self._wait_reason(out)
        self._collect_stats()
        return batch

    def complete(self, batch: StepBatch, now: float) -> list[SchedRequest]:
        """The step's fabricated output into vLLM (module docstring); the
        requests vLLM finished."""
        out = batch.vllm_output
        ids = list(out.num_scheduled_tokens)
        sampled = []
        for req_id in ids:
            r = self.requests[int(req_id)]
            v = self.vllm[r.rid]
            r.computed = v.num_computed_tokens
            if v.num_computed_tokens < v.num_tokens:    # a prefill chunk short of the end
                sampled.append([])
                continue
            r.generated += 1
            r.token_times.append(now)
            if r.record.first_token_s is None:
                r.record.first_token_s = now
            token = generated_token(r.rid, r.generated)
            r.tokens.append(token)
            sampled.append([token])
        self.core.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={req_id: i for i, req_id in enumerate(ids)},
            sampled_token_ids=sampled))
        finished = []
        for req_id in ids:
            r = self.requests[int(req_id)]
            if self.vllm[r.rid].is_finished():
                self._finish(r, now)
                finished.append(r)
        return finished


    # ---- reading vLLM's decisions -------------------------------------------------
    def _watch_first_lookups(self) -> None:
        """Record, at a request's first prefix-cache lookup, how deep each
        kind of state alone would reach: attention (``attn_depth``) and the
        deepest Mamba state on its path (``r_max``), each group looked up on
        its own (`find_longest_cache_hit_per_group`, read-only) beside the
        joint hit vLLM then takes (``j_adopt``)."""
        manager = self.core.kv_cache_manager
        coordinator = manager.coordinator
        mamba = [isinstance(g.kv_cache_spec, MambaSpec)
                 for g in manager.kv_cache_config.kv_cache_groups]
        lookup = manager.get_computed_blocks

        def get_computed_blocks(request):
            rid = int(request.request_id)
            if rid not in self.depths:
                _, lengths = coordinator.find_longest_cache_hit_per_group(
                    request.block_hashes, request.num_tokens - 1)
                attention = [n for n, m in zip(lengths, mamba, strict=True) if not m]
                state = [n for n, m in zip(lengths, mamba, strict=True) if m]
                self.depths[rid] = (min(attention, default=0), min(state, default=0))
            return lookup(request)

        manager.get_computed_blocks = get_computed_blocks

    def _schedule(self):
        out = self.core.schedule()
        if not out.num_scheduled_tokens:
            # as the engine core does with an empty step: nothing ran
            self.core.update_from_output(out, EMPTY_MODEL_RUNNER_OUTPUT)
        return out

    def _on_admit(self, r: SchedRequest, matched: int) -> None:
        """``r`` scheduled from waiting, ``matched`` tokens computed from
        vLLM's prefix cache (its ``num_computed_tokens`` at admission)."""
        r.state = RUNNING
        rec = r.record
        if r.first_admission:
            r.first_admission = False
            rec.j_adopt = rec.reused_tokens = matched
            rec.attn_depth, rec.r_max = self.depths[r.rid]
            rec.initial_input_tokens = r.prompt_len - matched
        else:
            rec.recomputed_tokens += len(r.tokens) - matched

    def _preempted(self, r: SchedRequest, batch: StepBatch) -> None:
        r.state = WAITING
        r.computed = 0
        r.prefill_until = len(r.tokens)     # vLLM recomputes prompt and output
        r.record.preemptions += 1
        self.preemptions += 1
        batch.preempted.append(r.rid)

    def _wait_reason(self, out) -> str:
        """Why requests still wait, read from vLLM's state after the step was
        planned (vLLM does not say): the cap, the token budget, else memory."""
        if not self.core.waiting:
            return ""
        if len(self.core.running) >= self.cap:
            return WAIT_CAP
        if out.total_num_scheduled_tokens >= self.token_budget:
            return WAIT_BUDGET
        return WAIT_MEMORY

    def _collect_stats(self) -> None:
        stats = self.core.kv_cache_manager.make_prefix_cache_stats()
        for k in self.prefix:
            self.prefix[k] += getattr(stats, k)

    def _fail_head(self, batch: StepBatch) -> None:
        """The waiting head cannot be admitted with nothing running: vLLM's
        blocks cannot hold it. hbench aborts it in vLLM and fails it."""
        v = self.core.waiting.peek_request()
        self.core.finish_requests(v.request_id, RequestStatus.FINISHED_ABORTED)
        r = self.requests[int(v.request_id)]
        self.vllm.pop(r.rid)
        r.close(FAILED, "does not fit in vLLM's blocks")
        self.failed += 1
        batch.failed.append(r.rid)

    def _finish(self, r: SchedRequest, now: float) -> None:
        v = self.vllm.pop(r.rid)
        if v.num_output_tokens != r.generated or r.generated != r.output_len:
            raise AssertionError(f"request {r.rid}: vLLM stopped at {v.num_output_tokens} "
                                 f"tokens, hbench counted {r.generated} of {r.output_len}")
        r.record.finish_s = now
        r.close(FINISHED)
