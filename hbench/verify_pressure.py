"""``hbench verify --launch`` on vLLM: every organization against stock vLLM, memory bound.

One check that can fail, on one designed traffic (`PressureDesign`, sized
from the model's vLLM block, so any tiny model works):

    1. stock vLLM and the plugin as each organization serve the same greedy,
       concurrent prompts at a budget where ``cap - 1`` requests at their
       peak fit and ``cap`` do not (`binding_blocks`); every organization's
       outputs must equal stock's, token for token;
    2. the pressure is asserted, never assumed (`shortfalls`): preemptions,
       S1/S2's checkpoint invalidations and a pinned resume, read from the
       server's counters; a run where memory did not bind proved nothing;
    3. each organization's negative control (`adapters.vllm_plugin.plan.ALIAS_ENV`)
       must change some output, or the comparison cannot fail for it.

    block:    |<------------- B tokens ------------->|<---- next block
    request:  [======= prompt 0.9 B =======][== output 0.18 B ==]
                                                     ^ every request needs
                                                       a new block here

A last phase gives a preempted request a joint hit to pin (a warmed block W,
then ``cap - 1`` prompts starting with it); it binds only where a state
takes at most ``cap - 2`` pages (`pin_phase_binds`). The traffic and the
measured runs: docs/engines.md, "hbench verify".
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import threading
from dataclasses import dataclass
from pathlib import Path

from common.errors import HbenchError
from hbench.verify import PromptCheck, complete, verify_endpoint

#: Requests served at once: the binding budget holds CAP - 1 of them at their peak.
CAP = 4
#: Organizations whose servers run the pinning scheduler with a shared pool:
#: their pin phase must preempt a request holding a joint hit.
PINNED_ORGS = ("s1", "s2")


@dataclass(frozen=True, kw_only=True)
class PressureDesign:
    """Traffic sized from vLLM's block of ``block_tokens`` tokens."""

    block_tokens: int
    vocab_size: int
    cap: int = CAP
    n_prompts: int = 6
    n_hit_prompts: int = 4
    hit_output_len: int = 16
    seed: int = 5

    def __post_init__(self):
        if self.block_tokens < 20 or self.vocab_size < 20:
            raise HbenchError(f"a pressure verify needs a block of at least 20 tokens and a "
                              f"vocabulary of at least 20 ids; got {self.block_tokens} and "
                              f"{self.vocab_size}")

    @property
    def prompt_tokens(self) -> int:
        return self.block_tokens * 9 // 10

    @property
    def output_tokens(self) -> int:
        """Enough to cross the first block edge (prompt + output > one block)."""
        return max(self.block_tokens * 9 // 50, self.block_tokens - self.prompt_tokens + 2)

    @property
    def peak_attention_blocks(self) -> int:
        """Attention blocks one request holds at its end."""
        return math.ceil((self.prompt_tokens + self.output_tokens) / self.block_tokens)

    @property
    def hit_prompt_tokens(self) -> int:
        """One and a half blocks: a hit reuses one whole block."""
        return self.block_tokens + self.block_tokens // 2

    @property
    def max_model_len(self) -> int:
        longest = max(self.prompt_tokens + self.output_tokens,
                      self.hit_prompt_tokens + self.hit_output_len,
                      self.sharer_prompt_tokens + self.output_tokens)
        return math.ceil(longest / self.block_tokens) * self.block_tokens

    def _ids(self, rng: random.Random, n: int) -> list[int]:
        return [rng.randrange(10, min(self.vocab_size, 2000)) for _ in range(n)]

    def prompts(self) -> list[list[int]]:
        """Token-id prompts; the even ones share their first half."""
        rng = random.Random(self.seed)
        half = self.prompt_tokens // 2
        shared = self._ids(rng, half)
        return [shared + self._ids(rng, self.prompt_tokens - half) if i % 2 == 0
                else self._ids(rng, self.prompt_tokens) for i in range(self.n_prompts)]

    def hit_prompts(self) -> list[list[int]]:
        rng = random.Random(self.seed + 1)
        return [self._ids(rng, self.hit_prompt_tokens) for _ in range(self.n_hit_prompts)]

    # -- the pin phase (module docstring) ------------------------------------------
    @property
    def sharer_prompt_tokens(self) -> int:
        """A warmed block and 0.9 blocks of its own: decode crosses the second edge."""
        return self.block_tokens + self.prompt_tokens

    def pin_prompts(self) -> tuple[list[int], list[list[int]]]:
        """(the warm prompt: one block plus one token; the ``cap - 1`` sharers,
        which start with that block), fresh token ids."""
        rng = random.Random(self.seed + 2)
        block = self._ids(rng, self.block_tokens)
        warm = block + self._ids(rng, 1)
        return warm, [block + self._ids(rng, self.prompt_tokens) for _ in range(self.cap - 1)]


def state_pages(org: str, geom, grid_tokens: int = 512) -> int:
    """Shared-pool blocks one request's Mamba state takes: a vLLM page for
    stock (S0), the organization's pages per checkpoint for S1/S2
    (`PageLayout`), none for D0 (its states live in the private pool)."""
    from adapters.vllm_plugin.plan import PageLayout

    if org == "s0":
        return 1
    if org == "d0":
        return 0
    return PageLayout(org, geom.ssm_state_bytes, geom.conv_state_bytes,
                      geom.attn_bytes_per_token, grid_tokens).pages_per_checkpoint


def binding_blocks(design: PressureDesign, org: str, geom) -> int:
    """vLLM blocks at which ``cap - 1`` requests at their peak fit and ``cap``
    outgrow them: the null block plus ``cap - 1`` requests' attention blocks
    and states. D0 gets the S1 count (equal memory); what binds there is its
    attention pool, which `d0_fraction` sizes the same way."""
    per_request = design.peak_attention_blocks + state_pages("s1" if org == "d0" else org, geom)
    return 1 + (design.cap - 1) * per_request


def pin_phase_binds(design: PressureDesign, org: str, geom) -> bool:
    """Whether the pin phase's sharers are all admitted at the binding budget
    (W's block and state, held while they adopt it, and their first blocks:
    1 + s + (cap - 1)(1 + s) <= (cap - 1)(2 + s), i.e. s <= cap - 2 state
    pages); with larger states the last waits for the others to finish and
    nothing is preempted in that phase. D0's pools bind on attention alone."""
    if org in ("s0", "d0"):
        return True
    return state_pages(org, geom) <= design.cap - 2


def d0_fraction(design: PressureDesign, blocks: int) -> float:
    """D0's attention fraction giving its attention pool ``cap - 1``
    requests' peak attention blocks (`harness.budget.vllm_d0_split` floors)."""
    want = (design.cap - 1) * design.peak_attention_blocks
    usable = blocks - 1
    if not 0 < want < usable:
        raise HbenchError(f"d0 at {blocks} blocks cannot give attention {want} blocks and keep "
                          "a checkpoint pool; raise --blocks")
    return (want + 0.5) / usable


@dataclass(frozen=True)
class ServedRun:
    """One server's answers: its outputs on the designed traffic, its
    preemptions (``/metrics``), the plugin's layout and last counters (None
    for stock) and its hit-vs-recompute checks."""

    org: str
    blocks: int
    aliased: bool                          # the organization's negative control
    outputs: tuple[tuple[int, ...], ...]
    preemptions: int
    resolved: dict | None
    counters: dict | None
    checks: tuple[PromptCheck, ...]
    log_path: str
    pin_binds: bool = True                 # the pin phase can preempt (`pin_phase_binds`)

    @property
    def label(self) -> str:
        from adapters.vllm_plugin.plan import ALIAS_LABEL

        control = f" ({ALIAS_LABEL[self.org]})" if self.aliased else ""
        return f"{self.org}{control} at {self.blocks} blocks"

    @property
    def invalidations(self) -> int:
        from adapters.metrics_scrape import checkpoint_invalidations

        return checkpoint_invalidations(self.counters or {})

    def counter(self, name: str) -> int:
        """The plugin's last ``name`` counter (0 when it never counted one)."""
        return int((self.counters or {}).get(name, 0))

    def describe(self) -> str:
        line = f"{self.label}: {self.preemptions} preemptions"
        if self.org in ("s1", "s2"):
            line += f", {self.invalidations} checkpoint invalidations"
        if self.org != "s0":
            line += (f", {self.counter('pins_taken')} pins taken, "
                     f"{self.counter('pinned_resumes_with_hit')} resumed from a pinned hit"
                     + ("" if self.pin_binds else " (the pin phase cannot bind here)"))
        if self.aliased and self.org in ("s1", "s2"):
            line += (f", {self.counter('states_placed_elsewhere')} states placed on another "
                     "checkpoint's page")
        return line


@dataclass(frozen=True)
class PressureReport:
    design: PressureDesign
    stock: ServedRun
    orgs: dict[str, ServedRun]
    controls: dict[str, ServedRun]          # organization -> its negative control

    def mismatches(self, run: ServedRun) -> list[int]:
        """Indices of the requests whose outputs differ from stock's."""
        return [i for i, (a, b) in enumerate(zip(run.outputs, self.stock.outputs, strict=True))
                if a != b]

    def lines(self) -> list[str]:
        d = self.design
        out = [f"traffic: {d.n_prompts} prompts of {d.prompt_tokens} tokens, "
               f"{d.output_tokens} generated each, {d.cap} at once, "
               f"vLLM block {d.block_tokens} tokens; then the shared-prefix prompts again; "
               f"then one block warmed and {d.cap - 1} prompts of {d.sharer_prompt_tokens} "
               "tokens that start with it"]
        for run in (self.stock, *self.orgs.values()):
            out.append(run.describe())
            out += [f"  {c.describe()}" for c in run.checks]
        for org, run in self.orgs.items():
            bad = self.mismatches(run)
            n = len(run.outputs)
            out.append(f"{org} vs stock: {n - len(bad)}/{n} outputs identical"
                       + (f"; DIVERGE: requests {bad}" if bad else ""))
        for run in self.controls.values():
            bad = self.mismatches(run)
            out.append(f"negative control {run.describe()}: {len(bad)}/"
                       f"{len(run.outputs)} outputs changed (must be > 0)")
        return out

    def divergent(self) -> bool:
        return (any(self.mismatches(r) for r in self.orgs.values())
                or any(not c.identical for r in (self.stock, *self.orgs.values())
                       for c in r.checks))

    def shortfalls(self) -> list[str]:
        """Why the run proved nothing (empty when it proved something)."""
        out = []
        for run in (self.stock, *self.orgs.values()):
            if run.org != "s0" and run.resolved is None:
                out.append(f"{run.label}: the plugin did not load (no counters in {run.log_path})")
            if run.preemptions == 0:
                out.append(f"{run.label} preempted nothing: memory did not bind; "
                           "give a smaller --blocks")
            if run.org in ("s1", "s2") and run.invalidations == 0:
                out.append(f"{run.label} evicted no cached checkpoint; give a smaller --blocks")
            if (run.org in PINNED_ORGS and run.pin_binds
                    and run.counter("pinned_resumes_with_hit") == 0):
                out.append(f"{run.label}: no preempted request resumed from a pinned hit "
                           f"({run.counter('pins_taken')} pins taken): pinning was not "
                           "exercised")
            if any(c.hit_cached_tokens == 0 for c in run.checks):
                out.append(f"{run.label}: a cache-hit request reused no prompt tokens")
            if any(c.miss_cached_tokens for c in run.checks):
                out.append(f"{run.label}: a salted request reused prompt tokens (no clean "
                           "recompute)")
        for org, run in self.controls.items():
            if not self.mismatches(run):
                out.append(f"the negative control {run.label} left every output intact: "
                           f"the check cannot fail for {org}")
        return out


def launch_config(model: str, org: str, design: PressureDesign, blocks: int,
                  server_cmd: str | None = None):
    """(engine, config) for serving ``org`` at ``blocks`` blocks; HbenchError,
    before any server starts, for what this vLLM cannot serve."""
    from adapters.vllm import VllmEngine
    from harness.config import RunConfig

    engine = VllmEngine(num_blocks=blocks, cpu_block_size=design.block_tokens)
    frac = d0_fraction(design, blocks) if org == "d0" else 0.5
    config = RunConfig(org=org, engine="vllm", model=model, cap=design.cap,
                       max_model_len=design.max_model_len, max_output=design.output_tokens,
                       launch=True, d0_attn_fraction=frac, server_cmd=server_cmd)
    engine.check_config(config)
    return engine, config


def serve_and_check(model: str, org: str, design: PressureDesign, blocks: int, log_dir: Path,
                    aliased: bool = False, hit_check: bool = True,
                    server_cmd: str | None = None, pin_binds: bool = True) -> ServedRun:
    """Launch vLLM for ``org`` (its negative control when ``aliased``) at
    ``blocks`` blocks, serve the designed traffic (and the hit-vs-recompute
    prompts), read its counters, stop it."""
    from adapters.client.http import Endpoint, served_models
    from adapters.metrics_scrape import extract, plugin_report, read_metrics
    from adapters.server_process import ServerProcess, free_port
    from adapters.vllm_plugin.plan import alias_env

    engine, config = launch_config(model, org, design, blocks, server_cmd)
    env = engine.launch_env(config)
    if aliased:
        env.update(alias_env(org))
    port = free_port()
    log = log_dir / f"hbench-verify-{org}{'-alias' if aliased else ''}-{port}.log"
    ep = Endpoint("127.0.0.1", port)
    with ServerProcess(engine.launch_argv(config, port), ep, log, env=env,
                       ready_timeout_s=900) as server:
        model_id = served_models(ep)[0]
        prompts = design.prompts()
        outputs = concurrent_greedy(ep, model_id, prompts, design.output_tokens)
        outputs += concurrent_greedy(ep, model_id, prompts[::2], design.output_tokens)
        outputs += pin_phase(ep, model_id, design)
        checks = (verify_endpoint(ep, model_id, design.hit_prompts(), design.hit_output_len)
                  if hit_check else [])
        samples = read_metrics(ep)
        if samples is None:
            raise HbenchError(f"{ep.url}/metrics could not be read")
        preemptions = extract(samples, "vllm").get("preemptions", 0)
        report = plugin_report(server.log_text())
    return ServedRun(org, blocks, aliased, tuple(outputs), int(preemptions),
                     report["resolved"], report["counters"], tuple(checks), str(log), pin_binds)


def concurrent_greedy(ep, model_id: str, prompts: list[list[int]],
                      output_len: int) -> list[tuple[int, ...]]:
    """All ``prompts`` at once, greedy, exactly ``output_len`` tokens each; the token ids."""
    out: dict[int, tuple[int, ...]] = {}
    errors: list[str] = []

    def one(i):
        try:
            res, _ = complete(ep, model_id, prompts[i], output_len, None)
            out[i] = tuple(res.token_ids)
        except HbenchError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise HbenchError(errors[0])
    return [out[i] for i in range(len(prompts))]


def pin_phase(ep, model_id: str, design: PressureDesign) -> list[tuple[int, ...]]:
    """The warm prompt alone, then its sharers at once (module docstring);
    the outputs, the warm prompt's first."""
    warm, sharers = design.pin_prompts()
    res, _ = complete(ep, model_id, warm, 1, None)
    return [tuple(res.token_ids), *concurrent_greedy(ep, model_id, sharers, design.output_tokens)]


def model_design(model: str, n_hit_prompts: int = 4,
                 hit_output_len: int = 16) -> tuple[PressureDesign, object]:
    """The design for ``model``'s vLLM block on CPU (`vllm_page`) and its geometry in
    the dtype the CPU server runs (float32)."""
    from adapters.vllm import CPU_BLOCK_SIZE, run_geometry, vllm_page
    from harness.config import RunConfig

    geom = run_geometry(RunConfig(engine="vllm", model=model, launch=True))
    if geom is None:
        raise HbenchError(f"hbench knows no geometry for {model}; give a model directory "
                          "with a config.json (hbench tiny-model writes one)")
    cfg = Path(model) / "config.json"
    vocab = json.loads(cfg.read_text()).get("vocab_size") if cfg.is_file() else None
    page = vllm_page(geom, True, CPU_BLOCK_SIZE)
    design = PressureDesign(block_tokens=page["block_tokens"],
                            vocab_size=int(vocab or geom.vocab_size),
                            n_hit_prompts=n_hit_prompts, hit_output_len=hit_output_len)
    return design, dataclasses.replace(geom, dtype="fp32", ssm_state_dtype="fp32")


def verify_pressure(model: str, orgs: tuple[str, ...] = ("s1", "s2", "d0"),
                    blocks: int | None = None, control: bool = True,
                    log_dir: str | Path = "/tmp", n_hit_prompts: int = 4,
                    hit_output_len: int = 16, server_cmd: str | None = None,
                    on_run=None) -> PressureReport:
    """Stock vLLM, then each of ``orgs``, then (``control``) each one's
    negative control, each on its own server at its binding block count
    (``blocks`` for all when given; ``server_cmd`` as `hbench run
    --server-cmd`). ``on_run(run)`` is called as each server finishes."""
    from adapters.vllm_plugin.plan import PLUGIN_ORGS

    bad = [o for o in orgs if o not in PLUGIN_ORGS]
    if bad:
        raise HbenchError(f"--org {bad[0]} is not a plugin organization; choose from "
                          f"{', '.join(PLUGIN_ORGS)} (stock vLLM, s0, is always served)")
    design, geom = model_design(model, n_hit_prompts, hit_output_len)
    log_dir = Path(log_dir)

    least = design.max_model_len // design.block_tokens + 2
    if blocks is not None and blocks < least:
        raise HbenchError(f"--blocks {blocks} cannot hold one request of this traffic "
                          f"({design.max_model_len} tokens: {least - 2} attention blocks, a "
                          f"Mamba state and the null block); give at least {least}")

    def count(org):
        return blocks if blocks is not None else binding_blocks(design, org, geom)

    for org in ("s0", *orgs):
        launch_config(model, org, design, count(org), server_cmd)   # refuse before serving

    def run(org, aliased=False, hit_check=True):
        # a budget given with --blocks is not the one the pin phase was sized for
        binds = blocks is None and pin_phase_binds(design, org, geom)
        result = serve_and_check(model, org, design, count(org), log_dir, aliased, hit_check,
                                 server_cmd, binds)
        if on_run is not None:
            on_run(result)
        return result

    stock = run("s0")
    served = {org: run(org) for org in orgs}
    controls = {org: run(org, aliased=True, hit_check=False) for org in orgs} if control else {}
    return PressureReport(design, stock, served, controls)
