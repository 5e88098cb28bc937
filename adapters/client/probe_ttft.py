"""Reuse inferred from time to first token, when the server counts nothing.

A cold prompt of L tokens (a fresh random prefix: nothing of it can be
cached) costs ``ttft = a + b x L`` to first token on an otherwise idle
server (prefill is linear in L at probe sizes; attention's quadratic part
is small against the weights' for short prompts, and the fit's residuals
say how far that holds). `PrefillFit` is that line, fitted by least squares
to cold shots. A request that reused R tokens computes only L - R, so

    R ~= (a + b x L - ttft) / b

and a hit is only claimed when the time saved exceeds `NOISE_SIGMAS`
residual standard deviations (and at least `MIN_SAVED_FRACTION` of the
cold prediction): below that, TTFT cannot tell a hit from noise, and the
probe says how sure it is from the same ratio (`separation`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

NOISE_SIGMAS = 4.0
MIN_SAVED_FRACTION = 0.15


@dataclass(frozen=True)
class PrefillFit:
    """``ttft = intercept_s + per_token_s x L`` over ``points`` cold shots."""

    intercept_s: float
    per_token_s: float
    sigma_s: float
    points: int

    def predict(self, prompt_len: int) -> float:
        return self.intercept_s + self.per_token_s * prompt_len

    def saved_s(self, prompt_len: int, ttft_s: float) -> float:
        return self.predict(prompt_len) - ttft_s

    def threshold_s(self, prompt_len: int) -> float:
        """Time saved below which a shot is not called a hit."""
        return max(NOISE_SIGMAS * self.sigma_s, MIN_SAVED_FRACTION * self.predict(prompt_len))

    def reused(self, prompt_len: int, ttft_s: float) -> int:
        """Estimated reused tokens (0 when the saving is within the noise)."""
        saved = self.saved_s(prompt_len, ttft_s)
        if saved <= self.threshold_s(prompt_len) or self.per_token_s <= 0:
            return 0
        return max(0, min(prompt_len, round(saved / self.per_token_s)))

    def separation(self, prompt_len: int, reused: int) -> float:
        """How many residual deviations a hit of ``reused`` tokens saves."""
        return self.per_token_s * reused / max(self.sigma_s, 1e-9)

    def as_dict(self) -> dict:
        return {"intercept_ms": round(self.intercept_s * 1e3, 3),
                "per_token_us": round(self.per_token_s * 1e6, 3),
                "residual_sd_ms": round(self.sigma_s * 1e3, 3), "points": self.points}


def fit_prefill(points: list[tuple[int, float]]) -> PrefillFit | None:
    """Least-squares line through (prompt length, TTFT) of cold shots; None
    with fewer than three points or fewer than two distinct lengths."""
    if len(points) < 3 or len({n for n, _ in points}) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    icpt = my - slope * mx
    ss = sum((y - icpt - slope * x) ** 2 for x, y in points)
    sigma = math.sqrt(ss / (n - 2)) if n > 2 else 0.0
    return PrefillFit(icpt, slope, sigma, n)
