"""``--scheduler-cls adapters.vllm_plugin.scheduler.PinningScheduler``.

Pinning on preemption. vLLM's ``Scheduler._preempt_request`` frees the
victim's blocks; cached ones stay in the LRU free queue, where they may be
evicted before the victim resumes. The pin keeps the victim's deepest *joint*
hit alive: the Mamba checkpoint at block ``j`` (carrier, members and slot)
AND the attention blocks ``[0, j]`` of every attention group. Pinning the
checkpoint alone is not enough: with the attention blocks evicted meanwhile
the resumed lookup finds no joint hit and restarts at 0.

A pin is one extra reference on each of those blocks, taken before vLLM
frees the victim and released once the victim runs again (its own hit holds
the blocks by then) or has finished. It never releases a reference it did
not take, so it cannot undo a running request's hold.

The scheduler also writes the plugin's counters to the log (see
`hooks.emit`), throttled, and once more when the engine goes idle.
"""

from __future__ import annotations

import time
from collections import Counter

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.core.single_type_kv_cache_manager import MambaManager

from adapters.vllm_plugin.hooks import COUNTERS_TAG, OrgMambaManager, emit
from adapters.vllm_plugin.pins import joint_depth

EMIT_INTERVAL_S = 0.5


class PinningScheduler(Scheduler):
    """vLLM's scheduler plus pins on preemption and the plugin's counters."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._pins: dict[str, list[tuple[object, list]]] = {}
        self.pin_counters: Counter = Counter()
        self._last_emit = 0.0
        self._last_payload = ""

    def _managers(self):
        managers = self.kv_cache_manager.coordinator.single_type_managers
        mamba = [m for m in managers if isinstance(m, MambaManager)]
        attention = [m for m in managers if not isinstance(m, MambaManager)]
        return mamba, attention

    def _preempt_request(self, request, *args, **kwargs):
        self._pin(request)
        return super()._preempt_request(request, *args, **kwargs)

    def _pin(self, request) -> None:
        rid = request.request_id
        mamba, attention = self._managers()
        if len(mamba) != 1 or rid in self._pins:
            return
        mblocks = mamba[0].req_to_blocks.get(rid, [])
        ablocks = [a.req_to_blocks.get(rid, []) for a in attention]
        depth = joint_depth(mblocks, ablocks)
        if depth is None:
            self.pin_counters["pins_without_checkpoint"] += 1
            return
        held = [(a.block_pool, list(blocks[:depth + 1])) for a, blocks in zip(attention, ablocks,
                                                                               strict=True)]
        held.append((mamba[0].block_pool, [mblocks[depth]]))
        for pool, blocks in held:
            pool.touch(blocks)
        self._pins[rid] = held
        self.pin_counters["pins_taken"] += 1
        self.pin_counters["pinned_tokens_total"] += (depth + 1) * mamba[0].block_size

    def _release_pins(self) -> None:
        for rid in list(self._pins):
            request = self.requests.get(rid)
            if request is not None and not request.is_finished() and \
                    request.status.name != "RUNNING":
                continue
            for pool, blocks in reversed(self._pins.pop(rid)):
                pool.free_blocks(list(reversed(blocks)))
            self.pin_counters["pins_released"] += 1

    def schedule(self, *args, **kwargs):
        out = super().schedule(*args, **kwargs)
        self._release_pins()
        self._emit(force=False)
        return out

    def update_from_output(self, *args, **kwargs):
        out = super().update_from_output(*args, **kwargs)
        self._release_pins()
        self._emit(force=not self.has_unfinished_requests())
        return out

    def _emit(self, force: bool) -> None:
        now = time.monotonic()
        if not force and now - self._last_emit < EMIT_INTERVAL_S:
            return
        mamba, _ = self._managers()
        payload = dict(self.pin_counters, pins_held=len(self._pins))
        if mamba and isinstance(mamba[0], OrgMambaManager):
            payload.update(mamba[0].counters())
        payload["preemptions"] = int(payload.get("pins_taken", 0)
                                     + payload.get("pins_without_checkpoint", 0))
        text = repr(sorted(payload.items()))
        if text != self._last_payload:
            emit(COUNTERS_TAG, payload)
            self._last_payload = text
            self._last_emit = now
