"""The limits of a workload recipe, each defined once.

`workloads.spec.WorkloadSpec` refuses a recipe outside these limits, and
`harness.config.RunConfig` checks its workload recipe by building that spec
(`WorkloadSpec.from_config`), so a run configuration and a workload are
refused at the same values with the same message. Each limit is what the
workload code downstream needs:

    MIN_TURN_TOKENS   the derivers skip a user turn shorter than this
                      (docs/workloads.md), so a prompt holds at least this
                      many tokens plus one: the mean input and a session's
                      history (``max_history``) must exceed it
    mean input        below the max model length: a request's prompt plus at
                      least one output token fits it
    MIN_MODEL_LEN     the smallest max model length accepted
    MAX_REQUESTS      most requests one run may ask for, directly or as
                      duration x rate, times the turns of a session; far
                      above any study run (240) and far below what would
                      exhaust memory on the way
    MAX_DURATION_S    largest arrival window: a week of virtual time
"""

from __future__ import annotations

MIN_TURN_TOKENS = 4
MIN_MODEL_LEN = 32
MAX_REQUESTS = 1_000_000
MAX_DURATION_S = 7 * 24 * 3600.0


def expected_requests(requests: int, duration_s: float | None, rate: float,
                      workload_kind: str, max_turns: int) -> float:
    """Requests a recipe asks for: ``requests``, or the expected arrivals of a
    ``duration_s`` window at ``rate``; a multi-turn recipe's count is of
    sessions, each at most ``max_turns`` requests."""
    n = requests if duration_s is None else duration_s * rate
    return n * max_turns if workload_kind == "multiturn" else n
