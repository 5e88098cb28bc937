"""Derive the study's working point from ShareGPT pairs.

Each request is ``context + "\\n\\n" + user turn``. A context is exactly L
tokens of concatenated ShareGPT conversation text; with probability q it is
one of K shared contexts (identical leading token ids across the requests
that use it), otherwise a private context of the same L tokens that shares
no prefix with any other. L is chosen once per (dataset, tokenizer, target
mean input, max_model_len), so q only changes *which* context a request gets,
never its input or output length: q = 0 is the no-share control with the
same token work as q = 1.

Randomness: every draw comes from its own named stream,
``Generator(PCG64(SeedSequence([seed, STREAMS[name]])))``. Changing q touches
only how the share coin is read, changing the rate only the arrival stream,
so the rest of the workload stays byte-identical.

Caps (documented in docs/workloads.md): a user turn is eligible if it has at
least `MIN_TURN_TOKENS` tokens and ``L + turn + 1 <= max_model_len``
(ineligible draws are skipped, i.e. dropped, not truncated); the output is
the paired reply's token count, capped at ``max_output`` and at
``max_model_len - prompt_len``, and at least 1.
"""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc

from common.errors import HbenchError
from workloads.bounds import MIN_TURN_TOKENS
from workloads.request_seq import MADE_AT_ONCE, MadeOnRead
from workloads.sharegpt.arrivals import arrival_times
from workloads.sharegpt.loader import ShareGPTPairs
from workloads.sharegpt.tokenizer import Tokenizer
from workloads.spec import WorkloadSpec
from workloads.workload import Workload, WorkloadRequest, token_ids

# Stream ids are part of the workload definition: never renumber them.
STREAMS = {
    "pairs": 1,  # which (turn, reply) pair each request uses
    "share": 2,  # the share coin: u < q -> shared context
    "context_choice": 3,  # which of the K shared contexts
    "arrivals": 4,  # inter-arrival gaps
    "contexts": 5,  # order of conversations that context text is cut from
    "calibration": 6,  # sample that fixes L (drawn with seed 0, see context_length)
}
CALIBRATION_SAMPLE = 2048
PAIR_BLOCK = 256
CONTEXT_KEY_CHARS = 200  # conversations whose opening text repeats are not context sources
POOL_BLOCK = 4096  # conversations whose opening text is read at once


def stream(seed: int, name: str) -> np.random.Generator:
    """The generator for one purpose; the same (seed, name) always draws the same."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, STREAMS[name]])))


class TokenMemo:
    """Token ids of turns, replies and conversations of one (dataset, tokenizer).

    A sweep derives many workloads from the same pairs; encoding each text
    once per process is what keeps that cheap. Bounded: cleared when full.
    """

    LIMIT = 50_000

    def __init__(self, pairs: ShareGPTPairs, tok: Tokenizer):
        self.pairs, self.tok = pairs, tok
        self._turn: dict[int, np.ndarray] = {}
        self._reply: dict[int, int] = {}
        self._conv: dict[int, tuple[np.ndarray, np.ndarray, str]] = {}
        first = np.unique(pairs.conv, return_index=True)[1]
        self._conv_rows = np.append(first, len(pairs.conv))  # conv c -> rows [a, b)
        self._conv_ids = pairs.conv[first]
        self._pool: np.ndarray | None = None

    def _room(self, d: dict) -> None:
        if len(d) >= self.LIMIT:
            d.clear()

    def turn(self, i: int) -> np.ndarray:
        ids = self._turn.get(i)
        if ids is None:
            self._room(self._turn)
            ids = self._turn[i] = self.tok.encode(self.pairs.turn(i))[0]
        return ids

    def reply_len(self, i: int) -> int:
        n = self._reply.get(i)
        if n is None:
            self._room(self._reply)
            n = self._reply[i] = self.tok.count(self.pairs.reply(i))
        return n

    def conversation(self, c: int) -> tuple[np.ndarray, np.ndarray, str]:
        """(ids, token end offsets, text) of the c-th conversation that has pairs.

        Text is its paired turns and replies, stripped, joined by blank lines
        and ended by one newline. A single trailing newline tokenizes the same
        whether or not text follows (a longer whitespace run would not), so a
        context's ids are exactly the ids of its text.
        """
        hit = self._conv.get(c)
        if hit is None:
            a, b = int(self._conv_rows[c]), int(self._conv_rows[c + 1])
            parts = []
            for r in range(a, b):
                parts += [self.pairs.turn(r).strip(), self.pairs.reply(r).strip()]
            text = "\n\n".join(parts) + "\n"
            ids, ends = self.tok.encode(text)
            self._room(self._conv)
            # int32 halves the memo; a sweep at q = 0 may touch every conversation.
            hit = self._conv[c] = (ids.astype(np.int32), ends.astype(np.int32), text)
        return hit

    def context_pool(self) -> np.ndarray:
        """Conversations usable as context sources: those whose opening
        `CONTEXT_KEY_CHARS` characters are unique, so no two contexts that
        start at different conversations can share a leading prefix."""
        if self._pool is None:
            seen: set[str] = set()
            pool = []
            rows = self._conv_rows[:-1]
            # a block of conversations at a time: taking every first turn at once
            # copies tens of MB of text only to keep 200 characters of each
            for a in range(0, len(rows), POOL_BLOCK):
                first_turns = self.pairs.human.take(rows[a:a + POOL_BLOCK])
                keys = pc.utf8_slice_codeunits(first_turns, 0, CONTEXT_KEY_CHARS).to_pylist()
                for c, k in enumerate(keys, start=a):
                    if k not in seen:
                        seen.add(k)
                        pool.append(c)
            self._pool = np.asarray(pool, dtype=np.int64)
        return self._pool


_MEMOS: dict[tuple[str, str], TokenMemo] = {}
_LENGTHS: dict[tuple, int] = {}


def token_memo(pairs: ShareGPTPairs, tok: Tokenizer) -> TokenMemo:
    key = (pairs.key, tok.name)
    memo = _MEMOS.get(key)
    if memo is None or memo.pairs is not pairs:
        memo = _MEMOS[key] = TokenMemo(pairs, tok)
    return memo


def context_length(memo: TokenMemo, mean_input: int, max_model_len: int) -> int:
    """L such that L + E[eligible turn tokens] ~= mean_input.

    The expectation is taken over a fixed calibration sample (seed 0, stream
    "calibration"), so L is a property of the working point, not of the run
    seed. Eligibility depends on L, hence the fixed-point iteration.
    """
    key = (memo.pairs.key, memo.tok.name, mean_input, max_model_len)
    if key in _LENGTHS:
        return _LENGTHS[key]
    n = len(memo.pairs)
    idx = stream(0, "calibration").choice(n, size=min(CALIBRATION_SAMPLE, n), replace=False)
    turns = np.array([len(memo.turn(int(i))) for i in idx])
    turns = turns[turns >= MIN_TURN_TOKENS]
    if len(turns) == 0:
        raise HbenchError(f"no user turn in {memo.pairs.name} has >= {MIN_TURN_TOKENS} tokens")
    length = round(mean_input - turns.mean())
    for _ in range(50):
        eligible = turns[length + turns + 1 <= max_model_len]
        if len(eligible) == 0:
            break
        new = round(mean_input - eligible.mean())
        if new == length:
            break
        length = new
    if length < 1 or length + MIN_TURN_TOKENS + 1 > max_model_len:
        raise HbenchError(
            f"mean input {mean_input} cannot be reached: the mean ShareGPT user turn is "
            f"{turns.mean():.0f} tokens and max model len is {max_model_len}"
        )
    _LENGTHS[key] = length
    return length


def _sample_pairs(memo: TokenMemo, seed: int, n: int, length: int, max_model_len: int) -> list[int]:
    """n eligible pair indices, drawn in fixed blocks (so n+1 extends n)."""
    rng = stream(seed, "pairs")
    chosen: list[int] = []
    tries = 0
    while len(chosen) < n:
        for i in rng.integers(len(memo.pairs), size=PAIR_BLOCK):
            t = len(memo.turn(int(i)))
            if t >= MIN_TURN_TOKENS and length + t + 1 <= max_model_len:
                chosen.append(int(i))
                if len(chosen) == n:
                    break
        tries += PAIR_BLOCK
        if len(chosen) < n and tries > 50 * (n + PAIR_BLOCK):
            raise HbenchError("too few ShareGPT turns fit the max model len; raise --max-model-len")
    return chosen


def _build_context(memo: TokenMemo, order: np.ndarray, start: int, length: int):
    """Exactly `length` tokens of conversation text starting at order[start]."""
    ids_parts, text_parts, have = [], [], 0
    for j in range(start, start + len(order)):
        ids, ends, text = memo.conversation(int(order[j % len(order)]))
        need = length - have
        if len(ids) >= need:
            ids_parts.append(ids[:need])
            text_parts.append(text[: int(ends[need - 1])])
            return np.concatenate(ids_parts), "".join(text_parts)
        ids_parts.append(ids)
        text_parts.append(text)
        have += len(ids)
    raise HbenchError(f"the dataset holds fewer than {length} tokens of context text")


def derive_workload(pairs: ShareGPTPairs, tok: Tokenizer, spec: WorkloadSpec) -> Workload:
    """The workload for ``spec`` (see module docstring for every rule)."""
    memo = token_memo(pairs, tok)
    length = context_length(memo, spec.mean_input_tokens, spec.max_model_len)
    arrivals = arrival_times(spec.arrival, stream(spec.seed, "arrivals"), spec.rate,
                             requests=spec.requests, duration_s=spec.duration_s,
                             burstiness=spec.burstiness)
    n = len(arrivals)
    chosen = np.asarray(_sample_pairs(memo, spec.seed, n, length, spec.max_model_len),
                        dtype=np.int64)
    shared = stream(spec.seed, "share").random(n) < spec.q
    group = stream(spec.seed, "context_choice").integers(spec.contexts, size=n)
    order = stream(spec.seed, "contexts").permutation(memo.context_pool())
    if len(order) < spec.contexts + 1:
        raise HbenchError(f"{pairs.name} has too few conversations for {spec.contexts} contexts")
    shared_ctx = [_build_context(memo, order, k, length) for k in range(spec.contexts)]
    prompt_len = length + np.array([len(memo.turn(int(p))) for p in chosen], dtype=np.int64)
    output_len = np.array([max(1, min(memo.reply_len(int(p)), spec.max_output,
                                      spec.max_model_len - int(n_in)))
                           for p, n_in in zip(chosen, prompt_len, strict=True)], dtype=np.int64)

    def make(rid: int) -> WorkloadRequest:
        """Request ``rid``: its context (a shared one, or a private one that
        starts at its own conversation, after the K shared ones), then its turn."""
        if shared[rid]:
            ctx_ids, ctx_text = shared_ctx[group[rid]]
        else:
            start = spec.contexts + rid % (len(order) - spec.contexts)
            ctx_ids, ctx_text = _build_context(memo, order, start, length)
        pair = int(chosen[rid])
        return WorkloadRequest(
            request_id=rid,
            arrival_s=float(arrivals[rid]),
            prompt_text=ctx_text + "\n\n" + pairs.turn(pair),
            prompt_token_ids=token_ids(np.concatenate([ctx_ids, memo.turn(pair)])),
            output_len=int(output_len[rid]),
            prefix_group=int(group[rid]) if shared[rid] else -1,
            prefix_tokens=length if shared[rid] else 0,
            salt=f"iso-{spec.seed}-{rid}" if spec.isolate else None,
        )

    lazy = MadeOnRead(make, arrival_s=arrivals, prompt_len=prompt_len, output_len=output_len)
    requests = tuple(lazy) if n <= MADE_AT_ONCE else lazy
    inputs, outputs = prompt_len, output_len
    meta = {
        "generator": "sharegpt",
        "seed": int(spec.seed), "q": float(spec.q), "rate": float(spec.rate),
        "arrival": spec.arrival, "burstiness": float(spec.burstiness), "requests": n,
        "duration_s": None if spec.duration_s is None else float(spec.duration_s),
        "contexts": spec.contexts, "context_tokens": length,
        "max_model_len": spec.max_model_len, "max_output": spec.max_output,
        "isolate": spec.isolate,
        "dataset": pairs.name, "dataset_path": pairs.source,
        "records_read": pairs.records_read, "truncated": pairs.truncated,
        "pairs": len(pairs), "tokenizer": tok.name,
        "mean_input_target": spec.mean_input_tokens,
        "mean_input_tokens": round(float(inputs.mean()), 3),
        "mean_output_tokens": round(float(outputs.mean()), 3),
        "shared_requests": int(shared.sum()),
    }
    return Workload(requests=requests, meta=meta)
