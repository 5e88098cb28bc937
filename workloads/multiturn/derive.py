"""Derive a multi-turn workload (sessions) from chat conversations.

Each session replays one conversation: turn k's user message is the k-th
human turn, its output length the paired assistant reply's token count
(capped at ``max_output``). Turn 0 is an ordinary request at the session's
arrival; sessions arrive open-loop (poisson / constant / gamma at ``rate``
sessions per second). Turn k >= 1 is sent a think time after turn k-1
finished (exponential / constant / gamma with mean ``think_time_s``) with
prompt = turn k-1 prompt + its answer + ``"\\n\\n"`` + user message k
(`workloads.multiturn.session`).

Caps: a session stops before the turn that would exceed ``max_turns`` or
whose prompt plus output would exceed ``max_history`` (default: the max model
length), assuming each earlier turn generates exactly its output length (every
engine here ignores end-of-sequence). A conversation whose first user turn
has fewer than `MIN_TURN_TOKENS` tokens or does not fit is skipped.

Randomness: named streams as in `workloads.sharegpt.derive`; stream ids of
this module are its own and never renumbered. Request ids: the first turns
are 0..S-1 in arrival order, later turns S.. session by session.
"""

from __future__ import annotations

import numpy as np

from common.errors import HbenchError
from workloads.bounds import MIN_TURN_TOKENS
from workloads.multiturn.session import Session, Turn
from workloads.sharegpt.arrivals import THINK_TIMES, arrival_times
from workloads.sharegpt.loader import ShareGPTPairs
from workloads.sharegpt.tokenizer import Tokenizer
from workloads.spec import WorkloadSpec
from workloads.workload import Workload, WorkloadRequest

STREAMS = {
    "conversations": 11,  # which conversation each session replays
    "arrivals": 12,       # session inter-arrival gaps
    "think": 13,          # think times, drawn per session in turn order
}
SEPARATOR = "\n\n"


def stream(seed: int, name: str) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, STREAMS[name]])))


def think_times(spec: WorkloadSpec, rng: np.random.Generator, n: int) -> np.ndarray:
    """n think times (s) with mean ``spec.think_time_s`` (all zero when it is 0)."""
    if n == 0 or spec.think_time_s == 0:
        return np.zeros(n)
    return THINK_TIMES[spec.think](rng, 1.0 / spec.think_time_s, n, spec.burstiness)


def conversation_rows(pairs: ShareGPTPairs) -> list[np.ndarray]:
    """Pair indices of each conversation that has pairs, in file order."""
    starts = np.flatnonzero(np.diff(pairs.conv, prepend=-1))
    ends = np.append(starts[1:], len(pairs.conv))
    return [np.arange(a, b) for a, b in zip(starts, ends, strict=True)]


def derive_multiturn(pairs: ShareGPTPairs, tok: Tokenizer, spec: WorkloadSpec) -> Workload:
    """The multi-turn workload of ``spec`` from the conversations of ``pairs``."""
    convs = conversation_rows(pairs)
    if not convs:
        raise HbenchError(f"{pairs.name} has no conversation with a user turn and a reply")
    history = spec.max_history or spec.max_model_len
    times = arrival_times(spec.arrival, stream(spec.seed, "arrivals"), spec.rate,
                          requests=spec.requests, duration_s=spec.duration_s,
                          burstiness=spec.burstiness)
    order = stream(spec.seed, "conversations").permutation(len(convs))
    think_rng = stream(spec.seed, "think")
    salt_of = (lambda s: f"session-{spec.seed}-{s}") if spec.isolate else (lambda s: None)

    firsts: list[WorkloadRequest] = []
    plans: list[list[tuple]] = []
    skipped = {"first turn too short": 0, "first turn too long": 0}
    pos = 0
    for _ in range(len(times)):
        plan = None
        while plan is None:
            if pos >= len(order):
                raise HbenchError(f"{pairs.name}: too few usable conversations for "
                                  f"{len(times)} sessions ({len(order)} in the corpus)")
            plan = _plan(pairs, tok, convs[int(order[pos])], spec, history, skipped)
            pos += 1
        plans.append(plan)
    next_id = len(times)
    sessions = []
    for s, (t, plan) in enumerate(zip(times, plans, strict=True)):
        (ids0, text0, out0, _, _), *later = plan
        firsts.append(WorkloadRequest(request_id=s, arrival_s=float(t), prompt_text=text0,
                                      prompt_token_ids=ids0, output_len=out0,
                                      prefix_group=-1, prefix_tokens=0, salt=salt_of(s)))
        thinks = think_times(spec, think_rng, len(later))
        turns = []
        prompt_len, prev_out = len(ids0), out0
        for (ids, text, out, ans_ids, ans_text), th in zip(later, thinks, strict=True):
            prompt_len += prev_out + len(ids)
            turns.append(Turn(request_id=next_id, user_token_ids=ids, user_text=text,
                              answer_token_ids=ans_ids, answer_text=ans_text, output_len=out,
                              think_s=float(th), prompt_len=prompt_len))
            next_id += 1
            prev_out = out
        sessions.append(Session(session_id=s, first_request=s, turns=tuple(turns)))
    meta = {
        "generator": "multiturn", "dataset": pairs.name, "dataset_source": pairs.source,
        "records_read": pairs.records_read, "truncated": pairs.truncated,
        "tokenizer": tok.name, "seed": spec.seed, "rate": spec.rate, "arrival": spec.arrival,
        "burstiness": spec.burstiness, "requests": len(times), "duration_s": spec.duration_s,
        "sessions": len(sessions), "turns": next_id, "max_turns": spec.max_turns,
        "max_history": history, "think": spec.think, "think_time_s": spec.think_time_s,
        "replay_answers": spec.replay_answers, "isolate": spec.isolate,
        "max_model_len": spec.max_model_len, "max_output": spec.max_output,
        "conversations_skipped": skipped, "q": spec.q, "contexts": spec.contexts,
        "mean_input_target": spec.mean_input_tokens, "workload_kind": "multiturn",
        "paired_streams": (
            "replayed answers: every organization is sent the same prompts" if spec.replay_answers
            else "a turn's prompt holds the previous turn's generated tokens; with greedy "
                 "decoding (the simulator's generated tokens are a function of request id and "
                 "position) every organization is sent the same prompts; later turns' arrival "
                 "times follow each engine's finish times"),
    }
    return Workload(requests=tuple(firsts), meta=meta, sessions=tuple(sessions))


def _plan(pairs, tok, rows, spec, history, skipped) -> list[tuple] | None:
    """[(user ids, user text, output len, answer ids, answer text)] per turn of
    one conversation, within the caps; None (counted in ``skipped``) if even
    its first turn is unusable."""
    out = []
    prompt_len = prev_out = 0
    for k, r in enumerate(rows[: spec.max_turns]):
        text = (SEPARATOR if k else "") + pairs.turn(int(r))
        ids = tok.encode(text)[0]
        reply = pairs.reply(int(r))
        ans_ids, ans_ends = tok.encode(reply)
        n_out = max(1, min(len(ans_ids), spec.max_output))
        new_len = prompt_len + prev_out + len(ids)
        if k == 0 and len(ids) < MIN_TURN_TOKENS:
            skipped["first turn too short"] += 1
            return None
        if new_len + n_out > history:
            if k == 0:
                skipped["first turn too long"] += 1
                return None
            break
        if len(ans_ids) >= n_out:
            ans_ids = ans_ids[:n_out]
            ans_text = reply[: int(ans_ends[n_out - 1])]
        else:   # an answer that tokenizes to nothing still counts as one output token
            ans_ids, ans_text = np.zeros(1, dtype=np.int64), reply
        out.append((ids, text, n_out, ans_ids, ans_text))
        prompt_len, prev_out = new_len, n_out
    # turn k's answer is replayed into turn k+1's prompt: shift answers by one
    return [(ids, text, n, prev[3], prev[4]) if k else (ids, text, n, None, None)
            for k, ((ids, text, n, _, _), prev) in enumerate(zip(out, [None, *out], strict=False))]
