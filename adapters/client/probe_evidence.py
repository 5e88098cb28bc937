"""Which of a server's signals says how many prompt tokens it reused, and how sure that is.

Three sources, best first, chosen once from the probe's first shots:

``usage``    the completion's ``usage.prompt_tokens_details.cached_tokens``:
             the server's own count for this request (sure).
``metrics``  the rise of ``/metrics``' prefix-cache hit counter (tokens)
             across the request: sure while nobody else uses the server
             (the probe sends one request at a time).
``ttft``     time to first token against a line fitted to cold prompts
             (`adapters.client.probe_ttft`): an estimate, as sure as the
             time a hit saves is large against the fit's residuals.

`Evidence.reused(shot)` is the one number the probe's design reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from adapters.client.probe_ttft import PrefillFit
from adapters.client.probe_wire import Shot

SOURCES = {
    "usage": "usage.prompt_tokens_details.cached_tokens in each completion",
    "metrics": "the rise of /metrics' prefix-cache hit counter across each request",
    "ttft": "time to first token against a prefill cost fitted to cold prompts",
}


@dataclass
class Evidence:
    """The chosen source; for ``ttft`` its fit and the separations of the hits seen."""

    source: str
    fit: PrefillFit | None = None
    separations: list[float] = field(default_factory=list)
    spreads: list[int] = field(default_factory=list)   # max - min of repeated estimates

    def reused(self, shot: Shot) -> int:
        if self.source == "usage" and shot.cached is not None:
            return shot.cached
        if self.source == "metrics" and shot.metrics_cached is not None:
            return max(0, shot.metrics_cached)
        if self.fit is None or shot.ttft_s is None:
            return 0
        r = self.fit.reused(shot.prompt_len, shot.ttft_s)
        if r:
            self.separations.append(self.fit.separation(shot.prompt_len, r))
        return r

    def resolution(self) -> int:
        """Tokens within which a reuse count is known: 0 for a count the server
        gives; on TTFT, three residual deviations of the fit in tokens."""
        if self.source != "ttft" or self.fit is None or self.fit.per_token_s <= 0:
            return 0
        return math.ceil(3 * self.fit.sigma_s / self.fit.per_token_s)

    def confidence(self, unit: int | None = None) -> tuple[str, str]:
        """(``high``/``medium``/``low``, why); on TTFT, ``low`` too when repeated
        pairs at one length disagreed by more than a quarter of ``unit``."""
        if self.source == "usage":
            return "high", "the server counts the tokens it reused in every response"
        if self.source == "metrics":
            return "high", ("the counter rose by the hit of the one request in flight; other "
                            "traffic on the server during the probe would inflate it")
        if not self.separations:
            return "low", "no shot saved more time than the fit's noise allows calling a hit"
        worst = min(self.separations)
        spread = max(self.spreads, default=0)
        if unit and spread > unit / 4:
            return "low", (f"three pairs at one length disagreed by {spread} tokens, more than "
                           f"a quarter of the {unit}-token unit: the step and the reuse counts "
                           "are uncertain (the server's timing is noisy)")
        level = "medium" if worst >= 8 else "low"
        return level, (f"the smallest hit called saved {worst:.1f} residual deviations of "
                       f"the prefill fit; repeated pairs agreed within {spread} tokens")


def choose_source(shot: Shot) -> str:
    """The best source the server offers, judged from one completed shot."""
    if shot.cached is not None:
        return "usage"
    if shot.metrics_cached is not None:
        return "metrics"
    return "ttft"
