"""Sessions of a multi-turn workload and the closed loop that serves them.

A multi-turn `Workload` carries, beside its open-loop ``requests`` (the first
turn of every session, at the session's arrival time), one `Session` per
session holding the later turns. A later turn cannot be a fixed request: it
is sent ``think_s`` after the previous turn finished, and its prompt is the
previous prompt + the tokens the engine generated for it + the new user
message, token for token::

    turn k-1 prompt                    | generated (k-1) | user message k
    [=========== reusable from cache ==================]
    turn k   prompt ------------------------------------------------------>

`SessionLoop` is the engine-neutral closed loop: an engine (the simulator,
the streaming client, an in-process PyTorch engine) calls
``next_turn(finished, generated_token_ids, finish_s)`` whenever a request
finishes and serves what it returns (None: the session is over). With
``replay_answers`` the dataset's answer tokens take the place of the
generated ones, so every prompt is known in advance.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workloads.workload import WorkloadRequest


@dataclass(frozen=True)
class Turn:
    """A later turn (index >= 1) of a session.

    ``user_token_ids``/``user_text`` are the new user message (with its
    separator); ``answer_token_ids`` the dataset's answer to the previous
    turn (used only under replay); ``prompt_len`` what the prompt will be
    when every earlier turn generates exactly its ``output_len``.
    """

    request_id: int
    user_token_ids: np.ndarray
    user_text: str
    answer_token_ids: np.ndarray
    answer_text: str
    output_len: int
    think_s: float
    prompt_len: int


@dataclass(frozen=True)
class Session:
    """One conversation: its first turn is ``workload.requests[first_request]``."""

    session_id: int
    first_request: int
    turns: tuple[Turn, ...]

    @property
    def request_ids(self) -> tuple[int, ...]:
        return (self.first_request, *(t.request_id for t in self.turns))


class SessionLoop:
    """The closed loop over a workload's sessions (see module docstring).

    Holds the prompt of every request it has issued, so ``next_turn`` needs
    only what every engine has when a request ends: the request, the token
    ids it generated and the finish time.
    """

    def __init__(self, workload, *, replay_answers: bool | None = None):
        self.replay = (bool(workload.meta.get("replay_answers", False))
                       if replay_answers is None else replay_answers)
        self.max_model_len = int(workload.meta.get("max_model_len", 1 << 62))
        self._next: dict[int, tuple[Session, int]] = {}   # request id -> (session, turn index)
        self.turn_of: dict[int, tuple[int, int]] = {}     # request id -> (session id, turn)
        for s in workload.sessions:
            for k, rid in enumerate(s.request_ids):
                self._next[rid] = (s, k)
                self.turn_of[rid] = (s.session_id, k)

    def next_turn(self, finished: WorkloadRequest, generated_token_ids, finish_s: float,
                  generated_text: str = "") -> WorkloadRequest | None:
        """The session's next request after ``finished`` ended at ``finish_s``
        having generated ``generated_token_ids`` (and, for engines that send
        text, ``generated_text``); None when the session is over (no turn
        left, or the next prompt would not fit the max model length)."""
        hit = self._next.get(finished.request_id)
        if hit is None:
            return None
        session, k = hit
        if k >= len(session.turns):
            return None
        turn = session.turns[k]
        answer = (turn.answer_token_ids if self.replay
                  else np.asarray(generated_token_ids, dtype=np.int64))
        ids = np.concatenate([np.asarray(finished.prompt_token_ids, dtype=np.int64),
                              answer, turn.user_token_ids])
        if len(ids) + turn.output_len > self.max_model_len:
            return None
        answer_text = turn.answer_text if self.replay else generated_text
        return WorkloadRequest(
            request_id=turn.request_id,
            arrival_s=float(finish_s) + turn.think_s,
            prompt_text=finished.prompt_text + answer_text + turn.user_text,
            prompt_token_ids=ids,
            output_len=turn.output_len,
            prefix_group=finished.prefix_group,
            prefix_tokens=len(finished.prompt_token_ids) + len(answer),
            salt=finished.salt,
        )
