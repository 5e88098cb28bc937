"""One probe request at a time against a live server, within a budget.

The probe's designed sequences (`adapters.client.probe_design`) see the
server only through `ProbeClient.send`: a prompt of token ids goes out as
one streamed completion (`adapters.client.stream`), and one `Shot` comes
back with every piece of evidence about reuse the server gave for it:

- ``cached``: ``usage.prompt_tokens_details.cached_tokens`` (None when the
  server does not report it: vLLM reports it only with
  ``--enable-prompt-tokens-details``);
- ``metrics_cached``: how far the server's prefix-cache hit counter
  (``vllm:prefix_cache_hits``, tokens) rose across the request, read from
  ``/metrics`` just before and after it (None without such a counter);
- ``ttft_s``: time to first token, for the prefill-cost fit
  (`adapters.client.probe_ttft`) when neither count is reported.

Requests are sent one after another, never concurrently, so a counter's rise
belongs to the one request in flight (unless someone else uses the server;
the report says so). `Budget` bounds requests and wall time: `send` raises
`BudgetSpent` instead of exceeding either, and the design stops cleanly.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from adapters.client.http import Endpoint, Timeouts, model_entries
from adapters.client.stream import completion_body, stream_completion
from adapters.metrics_scrape import extract, info_labels, read_metrics
from common.errors import HbenchError

#: Token ids a probe prompt is drawn from: clear of the low ids tokenizers
#: keep for special tokens, below any real vocabulary's size.
TOKEN_LOW, TOKEN_HIGH = 100, 1000


class BudgetSpent(Exception):
    """The probe's request or time budget is used up (not an error: the design stops)."""


@dataclass
class Budget:
    """At most ``max_requests`` requests and ``max_seconds`` of wall time."""

    max_requests: int
    max_seconds: float
    used: int = 0
    started: float = field(default_factory=time.monotonic)

    def take(self) -> None:
        if self.used >= self.max_requests:
            raise BudgetSpent(f"request budget of {self.max_requests} spent")
        if self.elapsed() >= self.max_seconds:
            raise BudgetSpent(f"time budget of {self.max_seconds:g}s spent")
        self.used += 1

    def elapsed(self) -> float:
        return time.monotonic() - self.started


@dataclass(frozen=True)
class Shot:
    """What one probe request showed (see the module docstring)."""

    prompt_len: int
    prompt_tokens: int | None
    cached: int | None
    metrics_cached: int | None
    ttft_s: float | None
    output_ids: tuple[int, ...] = ()
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


@dataclass(frozen=True)
class ServerFacts:
    """What the server says about itself before any probe request."""

    model: str
    max_model_len: int | None
    has_metrics: bool
    cache_config: dict          # labels of vllm:cache_config_info ({} when not published)


class ProbeClient:
    """Sends probe prompts one at a time; owns the budget and the random prompts."""

    def __init__(self, endpoint: Endpoint, facts: ServerFacts, budget: Budget, *, seed: int = 0,
                 timeouts: Timeouts | None = None):
        self.endpoint = endpoint
        self.facts = facts
        self.budget = budget
        self.seed = seed
        self.rng = random.Random(seed)
        self.timeouts = timeouts or Timeouts(first_byte_s=120.0, idle_s=60.0, total_s=300.0)
        self.shots: list[Shot] = []

    def fresh(self, n: int) -> list[int]:
        """``n`` random token ids: a prefix no earlier probe sent (a collision of
        even one block of them is below one in 10^100)."""
        return [self.rng.randrange(TOKEN_LOW, TOKEN_HIGH) for _ in range(n)]

    def send(self, prompt: list[int], output_len: int = 1) -> Shot:
        """One completion of ``prompt``; `BudgetSpent` when the budget is used up."""
        self.budget.take()
        before = self._hits() if self.facts.has_metrics else None
        body = completion_body(self.facts.model, list(prompt), output_len, None,
                               {"return_token_ids": True})
        t0 = time.perf_counter()
        out = stream_completion(self.endpoint, body, t0, self.timeouts)
        after = self._hits() if before is not None else None
        usage = out.usage or {}
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        ttft = (out.first_token_s - out.dispatch_s
                if out.first_token_s is not None and out.dispatch_s is not None else None)
        shot = Shot(
            prompt_len=len(prompt),
            prompt_tokens=usage.get("prompt_tokens"),
            cached=None if cached is None else int(cached),
            metrics_cached=None if before is None or after is None else int(after - before),
            ttft_s=ttft,
            output_ids=tuple(out.token_ids),
            error=out.error,
        )
        self.shots.append(shot)
        return shot

    def _hits(self) -> float | None:
        return prefix_hits(self.endpoint)


def prefix_hits(endpoint: Endpoint) -> float | None:
    """The server's prefix-cache hit counter (tokens) now, or None."""
    samples = read_metrics(endpoint)
    return None if samples is None else extract(samples, "vllm").get("prefix_hits")


def server_facts(endpoint: Endpoint, wanted_model: str | None) -> ServerFacts:
    """The served model, its max length, and whether ``/metrics`` has prefix-cache
    counters; a one-line HbenchError when the server cannot be reached or does
    not serve ``wanted_model``."""
    models = {m["id"]: m for m in model_entries(endpoint, timeout_s=10.0)}
    if wanted_model is not None and wanted_model not in models:
        raise HbenchError(f"{endpoint.url} does not serve {wanted_model!r} "
                          f"(it serves {', '.join(models) or 'no model'})")
    if wanted_model is None and len(models) != 1:
        raise HbenchError(f"{endpoint.url} serves {', '.join(models) or 'no model'}; "
                          "pass --model with one of them")
    model = wanted_model or next(iter(models))
    max_len = models[model].get("max_model_len")
    samples = read_metrics(endpoint)
    has = samples is not None and "prefix_hits" in extract(samples, "vllm")
    return ServerFacts(model=model, max_model_len=int(max_len) if isinstance(max_len, int) else None,
                       has_metrics=has,
                       cache_config=info_labels(samples, "vllm") if samples else {})


