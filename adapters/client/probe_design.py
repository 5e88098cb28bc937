"""The probe's designed request sequences: what a live server really reuses.

Every measurement is a **pair** on a fresh random prefix P (no earlier probe
sent it, so nothing earlier can pollute it):

    warm:  P                      (a whole prompt, one output token)
    probe: P + [one fresh token]  -> reused(L) tokens, L = len(P)

``reused(L)`` is read from the evidence (`adapters.client.probe_evidence`);
on TTFT evidence it is the median of three pairs, each on its own prefix.
A block-aligned cache gives a staircase: reused(L) is the deepest reusable
position the warm prompt left at or below L (vLLM's hybrid ``align`` mode
keeps one state where a prompt's last chunk starts: floor((L - 1) / B) x B).
The sequences, in order (each stops cleanly when the budget is spent):

1. **cache on?** reused(L_top) at the longest probe length; > 0 means on.
2. **reuse unit.** ``step`` = reused(L_top) - reused(reused(L_top) - 1): the
   distance between the two deepest reusable positions (on TTFT the second
   length is lowered by the estimate's resolution). ``smallest`` (the
   shortest prefix the server ever reuses) and ``shortest_hit_len`` (the
   shortest warm prompt that produced a hit): first a guess from the
   staircase, checked by two pairs, else bisection over L.
3. **inside a block?** reused(smallest + step / 2 + 1): strictly between two
   grid positions means a hit can stop inside a block.
4. **shared prefix, different continuations.** warm P + tail1, probe P +
   tail2, then P + tail3 (tails longer than a step): does a prefix *inside*
   an earlier prompt hit for the second prompt to share it, and for the
   third? (vLLM's ``align`` mode keeps a state where a prompt's last chunk
   starts, so the second prompt finds none inside the first; the second ends
   a chunk where the prefix branches and caches the state there, the
   junction, so the third and later ones reuse it: docs/engines.md.)
5. **own history.** turn 1 = P with a few generated tokens, turn 2 = P +
   generated + fresh user tokens: how much of turn 1 turn 2 reused.
6. **survival under load.** warm P, then K filler requests of fresh prompts
   (F tokens each, one after another), then probe P: K = 0, 1, 2, 4, ...
   until a miss or the budget ends.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from adapters.client.probe_evidence import Evidence, choose_source
from adapters.client.probe_ttft import fit_prefill
from adapters.client.probe_wire import BudgetSpent, ProbeClient, Shot

#: Longest probe prompt: two of the largest blocks vLLM reports for hybrids (8,320).
MAX_PROBE_LEN = 16_640
#: Tokens a probe's max model length keeps free for the probe token and the output.
LEN_MARGIN = 16
HISTORY_OUTPUT = 8
HISTORY_USER = 4
SURVIVAL_MAX_K = 1 << 12
TTFT_REPEATS = 3


class ProbeFailed(Exception):
    """The server answered a probe request with an error."""


@dataclass
class Findings:
    """What the probe found; None where it could not tell (see ``notes``)."""

    model: str
    probe_len: int                      # L_top
    seed: int = 0                       # of the random prefixes
    evidence: str = ""
    confidence: str = ""
    confidence_why: str = ""
    cache_on: bool | None = None
    cache_off_reason: str = ""
    reused_at_top: int | None = None
    step: int | None = None
    smallest: int | None = None
    shortest_hit_len: int | None = None
    stops_inside_block: bool | None = None
    branch_prefix: int | None = None
    branch_reused: int | None = None         # by the second prompt to share the prefix
    branch_reused_third: int | None = None   # by the third
    branch_meaning: str = ""                 # what the two say (`branch_meaning`)
    history_prompt: int | None = None
    history_generated: int | None = None
    history_reused: int | None = None
    filler_tokens: int | None = None
    survived_fillers: int | None = None
    evicted_by_fillers: int | None = None
    server_block_size: int | None = None
    server_config: dict = field(default_factory=dict)
    prefill_fit: dict | None = None
    pairs: list[dict] = field(default_factory=list)
    requests: int = 0
    seconds: float = 0.0
    budget_spent: str = ""
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


class Probe:
    """Runs the sequences of the module docstring against one `ProbeClient`."""

    def __init__(self, client: ProbeClient):
        self.c = client
        facts = client.facts
        top = MAX_PROBE_LEN if facts.max_model_len is None else facts.max_model_len - LEN_MARGIN
        self.top = max(2, min(MAX_PROBE_LEN, top))
        self.f = Findings(model=facts.model, probe_len=self.top, seed=client.seed)
        self.ev: Evidence | None = None
        cfg = facts.cache_config
        keep = ("block_size", "mamba_block_size", "mamba_cache_mode", "enable_prefix_caching",
                "num_gpu_blocks", "kv_cache_size_tokens", "prefix_cache_retention_interval")
        self.f.server_config = {k: cfg[k] for k in keep if k in cfg}
        if str(cfg.get("block_size", "")).isdigit():
            self.f.server_block_size = int(cfg["block_size"])

    # -- primitives ------------------------------------------------------------------------
    def _send(self, prompt: list[int], output_len: int = 1) -> Shot:
        shot = self.c.send(prompt, output_len)
        if not shot.ok:
            raise ProbeFailed(f"the server failed a {len(prompt)}-token probe request: "
                              f"{shot.error}")
        if self.ev is None:
            self.ev = Evidence(choose_source(shot))
            if self.ev.source == "ttft":
                self._fit()
        return shot

    def _fit(self) -> None:
        """Cold shots at three lengths (each a fresh prompt) for the prefill fit."""
        points = [(s.prompt_len, s.ttft_s) for s in self.c.shots if s.ttft_s is not None]
        for n in (self.top // 4, self.top // 2, self.top, self.top // 4, self.top // 2, self.top):
            s = self.c.send(self.c.fresh(max(1, n)))
            if s.ok and s.ttft_s is not None:
                points.append((s.prompt_len, s.ttft_s))
        self.ev.fit = fit_prefill(points)
        if self.ev.fit is None:
            raise ProbeFailed("the server reports no cached tokens and its times to first "
                              "token could not be fitted")
        self.f.prefill_fit = self.ev.fit.as_dict()

    def pair(self, length: int, what: str, warm_tail: int = 0, probe_tail: int = 1,
             fillers: int = 0, filler_len: int = 0) -> int:
        """Warm ``P (+ warm_tail fresh)``, send ``fillers``, probe ``P + probe_tail fresh``;
        the reuse the probe showed."""
        p = self.c.fresh(length)
        self._send(p + self.c.fresh(warm_tail))
        for _ in range(fillers):
            self._send(self.c.fresh(filler_len))
        shot = self._send(p + self.c.fresh(probe_tail))
        r = self.ev.reused(shot)
        self.f.pairs.append({"what": what, "prefix": length, "warm_tail": warm_tail,
                             "fillers": fillers, "prompt": shot.prompt_len, "reused": r,
                             "ttft_ms": None if shot.ttft_s is None else round(shot.ttft_s * 1e3, 2)})
        return r

    def measure(self, length: int, what: str) -> int:
        """reused(``length``): one pair on exact evidence; the median of
        `TTFT_REPEATS` pairs (each on its own fresh prefix) on TTFT, so one
        delayed first token cannot move a step or flip a hit."""
        if self.ev is None or self.ev.source != "ttft":
            return self.pair(length, what)
        got = sorted(self.pair(length, what) for _ in range(TTFT_REPEATS))
        if got[-1] > 0:
            self.ev.spreads.append(got[-1] - got[0])
        return got[TTFT_REPEATS // 2]

    # -- the sequences ---------------------------------------------------------------------
    def run(self) -> Findings:
        try:
            self._start()
            if self._cache_on():
                self._unit()
                self._inside()
                self._branch()
                self._history()
                self._survival()
        except BudgetSpent as exc:
            self.f.budget_spent = str(exc)
        finally:
            self.f.requests = self.c.budget.used
            self.f.seconds = round(self.c.budget.elapsed(), 2)
            if self.ev is not None:
                self.f.evidence = self.ev.source
                unit = self.f.step or self.f.smallest
                self.f.confidence, self.f.confidence_why = self.ev.confidence(unit)
        return self.f

    def _start(self) -> None:
        """One short fresh prompt: which evidence the server offers (and the fit if TTFT)."""
        self._send(self.c.fresh(min(16, self.top)))

    def _cache_on(self) -> bool:
        r = self.measure(self.top, "cache on?")
        self.f.reused_at_top = r
        self.f.cache_on = r > 0
        if not self.f.cache_on:
            flag = self.f.server_config.get("enable_prefix_caching")
            if flag == "False":
                self.f.cache_off_reason = "the server's cache_config_info says enable_prefix_caching=False"
            else:
                self.f.cache_off_reason = (f"no prefix of up to {self.top} tokens was reused: prefix "
                                           f"caching is off, or its unit is longer than {self.top}")
        return self.f.cache_on

    def _unit(self) -> None:
        c1 = self.f.reused_at_top
        hit_at = {self.top: c1}      # L -> reused(L)
        # one token below the deepest position (less the estimate's resolution on TTFT,
        # where a count is known only within a few tokens)
        below = c1 - 1 - self.ev.resolution()
        c2 = self.measure(below, "step") if below >= 1 else 0
        if below >= 1:
            hit_at[below] = c2
        if c2 > 0 and c1 > c2:
            self.f.step = c1 - c2
        elif c1 == 1:
            self.f.step = 1
        # the shortest reusing L: known miss below lo, known hit at hi
        lo = max([L for L, r in hit_at.items() if r == 0], default=0)
        hi = min(L for L, r in hit_at.items() if r > 0)
        if self.f.step:
            # the staircase's lowest step: c2 less whole steps (c1 when c2 found nothing)
            guess = (c2 % self.f.step or self.f.step) if c2 else c1
            for L in (guess, guess + 1):   # a staircase hits at r (or r + 1, warm prompt past it)
                if lo < L < hi:
                    r = self.measure(L, "smallest")
                    hit_at[L] = r
                    if r > 0:
                        hi = L
                        break
                    lo = L
        while hi - lo > 1:
            mid = (lo + hi) // 2
            r = self.measure(mid, "smallest")
            hit_at[mid] = r
            lo, hi = (lo, mid) if r > 0 else (mid, hi)
        self.f.shortest_hit_len = hi
        self.f.smallest = min(r for r in hit_at.values() if r > 0)
        if self.f.step is None and c1 == self.f.smallest and 2 * c1 + 1 <= self.top:
            self.f.notes.append("only one reusable position lies below the longest probe; "
                                "the step between reusable lengths is not known")

    def _inside(self) -> None:
        step, m = self.f.step, self.f.smallest
        if not step or step < 2:
            self.f.stops_inside_block = True if step == 1 else None
            return
        L = m + step // 2 + 1
        if L >= self.top:
            return
        r = self.measure(L, "inside a block?")
        on_grid = r == 0 or (r >= m and (r - m) % step == 0)
        self.f.stops_inside_block = not on_grid

    def _branch(self) -> None:
        """P + tail1, P + tail2, P + tail3: the second prompt's reuse of P, then
        the third's (a state the second cached where P branched)."""
        step = self.f.step or self.f.smallest
        tail = min(2 * step + 3, self.top // 3)
        length = min(max(2 * step, self.f.shortest_hit_len or 0), self.top - tail)
        length = length // step * step if length >= step else length
        if length < 1:
            return
        self.f.branch_prefix = length
        p = self.c.fresh(length)
        self._send(p + self.c.fresh(tail))
        self.f.branch_reused = self._record(p, tail, "shared prefix, other continuation")
        self.f.branch_reused_third = self._record(p, tail, "shared prefix, third continuation")
        self.f.branch_meaning = branch_meaning(self.f.branch_reused, self.f.branch_reused_third,
                                               length)

    def _record(self, prefix: list[int], tail: int, what: str) -> int:
        """Send ``prefix`` + ``tail`` fresh tokens and record its reuse as a pair row."""
        shot = self._send(prefix + self.c.fresh(tail))
        r = self.ev.reused(shot)
        self.f.pairs.append({"what": what, "prefix": len(prefix), "warm_tail": tail,
                             "fillers": 0, "prompt": shot.prompt_len, "reused": r,
                             "ttft_ms": None if shot.ttft_s is None else round(shot.ttft_s * 1e3, 2)})
        return r

    def _history(self) -> None:
        step = self.f.step or self.f.smallest
        h = min(2 * step + step // 2 + 1, self.top - HISTORY_OUTPUT - HISTORY_USER)
        if h < 1:
            return
        p = self.c.fresh(h)
        turn1 = self._send(p, HISTORY_OUTPUT)
        gen = list(turn1.output_ids)
        if len(gen) != HISTORY_OUTPUT:
            gen = []
            self.f.notes.append("the server returned no token ids: turn 2 carried turn 1's "
                                "prompt only")
        turn2 = self._send(p + gen + self.c.fresh(HISTORY_USER))
        self.f.history_prompt, self.f.history_generated = h, len(gen)
        self.f.history_reused = self.ev.reused(turn2)
        self.f.pairs.append({"what": "own history (turn 2)", "prefix": h + len(gen), "warm_tail": 0,
                             "fillers": 0, "prompt": turn2.prompt_len,
                             "reused": self.f.history_reused,
                             "ttft_ms": None if turn2.ttft_s is None else round(turn2.ttft_s * 1e3, 2)})

    def _survival(self) -> None:
        length = self.f.shortest_hit_len
        filler = self.top
        self.f.filler_tokens = filler
        k = 0
        while k <= SURVIVAL_MAX_K:
            if self.c.budget.used + k + 2 > self.c.budget.max_requests:
                self.f.notes.append("survival stopped by the request budget: the prefix "
                                    f"survived {self.f.survived_fillers or 0} fillers")
                return
            r = self.pair(length, "survival", fillers=k, filler_len=filler)
            if r == 0:
                self.f.evicted_by_fillers = k
                return
            self.f.survived_fillers = k
            k = 1 if k == 0 else 2 * k


def branch_meaning(second: int, third: int, prefix: int) -> str:
    """What the second and third prompts' reuse of a ``prefix``-token prefix
    inside an earlier prompt says about where the server keeps states."""
    if third > second:
        return ("a prefix inside an earlier prompt is reused from the third prompt to share it "
                "on: the second cached a state at the junction, where the prefix branched")
    if second >= prefix:
        return "a prefix inside an earlier prompt is reused by the second prompt to share it"
    if third == 0:
        return ("a prefix inside an earlier prompt is not reused by a second or a third prompt: "
                "no state is kept inside prompts or where a prefix branches")
    return (f"the second and third prompts to share the prefix reused {second} and {third} "
            f"of its {prefix} tokens")
