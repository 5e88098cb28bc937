"""Which flag applies to which run: no flag is ignored in silence.

A run configuration always holds every field (`harness.config.RunConfig`'s
defaults fill the rest), so a field that does not act on a run cannot be
noticed from the config alone: ``--think-time 2`` on the study's workload, or
``--device cuda`` on the simulator, would be recorded and do nothing. `RULES`
says, once for every command that takes these flags (``run``, ``sweep``,
``capacity``, ``workload build``), when each one applies and why not
otherwise (`TOOL_RULES`, `VERIFY_RULES`: the same for the real-engine tools
``calibrate``, ``fidelity`` and ``verify``); `check_flags` refuses a flag the user gave (typed, in ``--set`` or
in a grid file) that applies to none of the runs it would shape. Defaults are
never refused: only what was given counts (`typed_flags`).

A rule reads the configuration after it is built (so a value is already
valid) and the set of fields that were given (so two flags that both set one
thing, ``--requests`` and ``--duration``, can be refused together). What a
value is allowed to be is `RunConfig`'s check; whether an engine can express
a value it was given is the engine's (`adapters.registry.check_paging`,
`harness.run_setup.check_policies`, the served engines' ``check_config``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields

import click
from click.core import ParameterSource

from common.errors import HbenchError
from harness.config import GRID_FIELDS, RunConfig
from workloads.spec import CONFIG_NAMES, WorkloadSpec

#: RunConfig fields of the workload recipe (`workloads.spec.WorkloadSpec`):
#: a saved workload (``--workload FILE``) brings its own.
RECIPE_FIELDS = tuple(CONFIG_NAMES.get(f.name, f.name) for f in fields(WorkloadSpec))
#: Fields that shape a multi-turn session's later turns.
MULTITURN_FIELDS = ("max_turns", "max_history", "think", "think_time_s", "replay_answers")
#: Engines whose organization and scheduler hbench builds (`harness.orgs`, `harness.scheduler`).
OWN_ENGINES = ("sim", "torch")


#: Real engines that also run in process, their own scheduler deciding and
#: hbench's cost model timing the steps, when no server is named.
REAL_ENGINES = ("vllm", "sglang")


def served(c: RunConfig) -> bool:
    """Whether a server outside this process serves the run (vLLM or SGLang
    with ``--endpoint`` or ``--launch``; without either, they run in process)."""
    return c.engine in REAL_ENGINES and bool(c.endpoint or c.launch)


def in_process(c: RunConfig) -> bool:
    """Whether a real engine's own scheduler runs inside hbench's process."""
    return c.engine in REAL_ENGINES and not served(c)


def priced(c: RunConfig) -> bool:
    """Whether hbench's cost model times the steps (`adapters.sim.cost`)."""
    return c.engine == "sim" or in_process(c)


def own_org(c: RunConfig) -> bool:
    return c.engine in OWN_ENGINES


@functools.cache
def dual_pool_orgs() -> frozenset[str]:
    """The organizations laid out in two pools (D0's block and grid apply to them)."""
    from harness.model_configs import DEFAULT_MODEL, preset
    from harness.orgs import ORGANIZATIONS, layout_for

    geom = preset(DEFAULT_MODEL)
    return frozenset(org for org in ORGANIZATIONS if layout_for(org, geom).dual_pool)


def gamma(c: RunConfig) -> bool:
    return c.arrival == "gamma" or (c.workload_kind == "multiturn" and c.think == "gamma")


@dataclass(frozen=True)
class Rule:
    """``names`` (RunConfig fields, or a command's own parameter names) apply
    to a run where ``applies(config, given)`` holds; ``why`` completes the
    sentence that starts with the flag."""

    names: tuple[str, ...]
    applies: Callable[[RunConfig, frozenset[str]], bool]
    why: str


#: The table, in the order a refusal is looked for (the first that fails is
#: the error): the workload's source and shape, the engine, the scheduler
#: and the checkpoint policies, the memory layout.
RULES: tuple[Rule, ...] = (
    Rule(RECIPE_FIELDS, lambda c, g: not c.workload_path,
         "does not apply with --workload FILE: a saved workload is served as it was built, "
         "and its own recipe is recorded (hbench workload build makes another)"),
    Rule(("requests",), lambda c, g: "duration_s" not in g,
         "and --duration both set how many requests arrive (--duration x --rate of them): "
         "give one of them"),
    Rule(MULTITURN_FIELDS, lambda c, g: c.workload_kind == "multiturn",
         "applies to --workload-kind multiturn only: it shapes a conversation's later turns"),
    Rule(("q", "contexts", "mean_input"), lambda c, g: c.workload_kind == "sharegpt",
         "applies to --workload-kind sharegpt only: a multi-turn prompt is its conversation's "
         "own history, not one of the shared contexts"),
    Rule(("burstiness",), lambda c, g: gamma(c),
         "applies to gamma-distributed gaps only: --arrival gamma, or --think gamma with "
         "--workload-kind multiturn"),
    Rule(("chat_column", "revision"), lambda c, g: c.dataset is not None,
         "applies with --dataset only: the packaged ShareGPT is read as it is"),
    Rule(("device", "dtype", "poison"), lambda c, g: c.engine == "torch",
         "applies to --engine torch only (the in-process PyTorch engine)"),
    Rule(("endpoint", "launch"), lambda c, g: c.engine in ("vllm", "sglang"),
         "applies to --engine vllm or sglang only (a real server)"),
    Rule(("endpoint",), lambda c, g: not c.launch,
         "and --launch both name the server to use: give one of them"),
    Rule(("server_cmd",), lambda c, g: c.launch and c.engine in ("vllm", "sglang"),
         "applies with --engine vllm or sglang and --launch only: it is the command the "
         "server is started with"),
    Rule(("gpu",), lambda c, g: priced(c),
         "applies where hbench's cost model times the steps (--engine sim, or vllm or "
         "sglang in process); torch and a server run on the wall clock of their own hardware"),
    Rule(("allow_oversubscribe",), lambda c, g: c.engine == "sim",
         "applies to --engine sim only: only the simulated GPU's memory is checked"),
    Rule(("debug_invariants",), lambda c, g: own_org(c),
         "applies to --engine sim or torch only, whose organizations hbench builds"),
    Rule(("warmup_requests",), lambda c, g: not served(c),
         "does not apply to a server: its client measures every request it sends; "
         "hbench's own engine loop (sim, torch, vllm or sglang in process) serves warm-up "
         "first"),
    Rule(("cap",), lambda c, g: not (served(c) and c.endpoint and not c.launch),
         "does not apply to the server at --endpoint, which runs with its own limit; "
         "--launch starts one with it"),
    Rule(("token_budget",), lambda c, g: own_org(c) or in_process(c),
         "applies where hbench sets the step size (--engine sim, torch, or vllm or sglang "
         "in process); a server plans its own"),
    Rule(("headroom", "admission"),
         lambda c, g: own_org(c) or (c.engine == "vllm" and (c.launch or in_process(c))),
         "applies to --engine sim, torch, or vllm in process or with --launch (its "
         "--watermark and scheduler_reserve_full_isl) only"),
    Rule(("retention",), lambda c, g: own_org(c) or (c.engine == "vllm" and in_process(c)),
         "applies to --engine sim, torch, or vllm in process only: retention is hbench's "
         "scheduler's policy and its vLLM plugin's"),
    Rule(("retention_threshold",), lambda c, g: c.retention,
         "applies with --retention only"),
    Rule(("ckpt_publish", "ckpt_evict"), lambda c, g: own_org(c),
         "applies to --engine sim or torch only: a server decides its own checkpoints"),
    Rule(("ckpt_every_k",), lambda c, g: c.ckpt_publish == "every-k",
         "applies with --ckpt-publish every-k only"),
    Rule(("utility_alpha",), lambda c, g: c.ckpt_evict == "utility",
         "applies with --ckpt-evict utility only"),
    Rule(("d0_attn_fraction",), lambda c, g: c.org in ("d0", "e0") or c.engine == "sglang",
         "applies to the organizations with two pools only (--org d0 or e0; on sglang, the "
         "split of its pools)"),
    Rule(("paging",), lambda c, g: c.engine != "sglang",
         "does not apply to --engine sglang, which lays out its own pools"),
    Rule(GRID_FIELDS, lambda c, g: own_org(c),
         "applies to --engine sim or torch only, whose pages hbench lays out; a real engine "
         "picks its own blocks"),
    Rule(GRID_FIELDS, lambda c, g: c.resolved_paging == "study",
         "does not apply with --paging vllm or vllm-gpu: vLLM's blocks are the grid there"),
    Rule(("shared_block_tokens",), lambda c, g: c.org not in dual_pool_orgs(),
         "applies to the shared-pool organizations only (--org s0, s1 or s2: their page)"),
    Rule(("dual_block_tokens", "dual_grid_tokens"), lambda c, g: c.org in dual_pool_orgs(),
         "applies to the organizations with two pools only (--org d0, u0 or e0)"),
)


#: The real-engine tools (``calibrate``, ``fidelity``, ``verify``) by their own
#: parameter names; a tool's context is a `RunConfig` of its engine, its
#: ``--launch`` and ``--endpoint``.
TOOL_RULES: tuple[Rule, ...] = (
    Rule(("device", "dtype"), lambda c, g: c.engine == "torch",
         "applies to --engine torch only (the in-process engine)"),
    Rule(("quick",), lambda c, g: "profile_path" not in g,
         "applies without --profile only: it is the design of the calibration run first"),
)
#: ``hbench fidelity``'s: a real engine calibrated and served, or vLLM's
#: scheduler in process (``--in-process``).
FIDELITY_RULES: tuple[Rule, ...] = (
    *TOOL_RULES,
    Rule(("in_process",), lambda c, g: c.engine == "vllm",
         "applies to --engine vllm only: its scheduler runs in process"),
    Rule(("gpu", "headroom"), lambda c, g: "in_process" in g,
         "applies with --in-process only: a real engine runs on its own hardware"),
    Rule(("retention",), lambda c, g: "in_process" in g,
         "applies with --in-process only: hbench's vLLM plugin holds a producer's states in "
         "process, not on a server"),
    Rule(("retention_threshold",), lambda c, g: "retention" in g,
         "applies with --retention only"),
    Rule(("profile_path", "quick", "device"), lambda c, g: "in_process" not in g,
         "does not apply with --in-process: both sides are priced by --gpu's cost model"),
)
#: ``hbench verify``'s: the torch engine's continuation check, vLLM's pressure
#: check against stock (``--launch``), or hit-vs-recompute on a server.
VERIFY_RULES: tuple[Rule, ...] = (
    *TOOL_RULES,
    Rule(("budget", "seed"), lambda c, g: c.engine == "torch",
         "applies to --engine torch only (the workload of its continuation check)"),
    Rule(("endpoint", "launch", "server_cmd", "n_prompts", "output_len"),
         lambda c, g: c.engine != "torch",
         "does not apply to --engine torch, which serves in process"),
    Rule(("blocks", "control"), lambda c, g: c.engine == "vllm" and c.launch,
         "applies to --engine vllm --launch only (stock vLLM against the plugin)"),
    Rule(("server_cmd",), lambda c, g: c.launch, "applies with --launch only"),
    Rule(("prompt_chars",), lambda c, g: c.engine != "torch" and not (c.engine == "vllm" and c.launch),
         "applies to text prompts only (a server at --endpoint, or sglang --launch); "
         "vllm --launch sends token-id prompts"),
)

#: What every run takes, whatever else it is given: which organization at which
#: budget, on which engine, of which model, with the state dtype its geometry
#: uses, from which saved workload, and where the results go. A flag of
#: ``hbench run`` that is neither here nor in `RULES` is a flag nobody decided
#: about (tests/cli/test_flag_rules.py fails on it).
APPLY_ALWAYS = ("org", "budget", "engine", "model", "config_path", "ssm_state_dtype",
                "workload_path", "out", "as_json")


def check_flags(given: Mapping[str, str], configs: Iterable[RunConfig],
                rules: tuple[Rule, ...] = RULES) -> None:
    """Refuse (HbenchError, one line naming the flag) the first flag in
    ``given`` (parameter or RunConfig field name -> how the user wrote it)
    that applies to none of ``configs`` (one run, or a grid's cells) by
    ``rules``."""
    configs = list(configs)
    names = frozenset(given)
    for rule in rules:
        for name in rule.names:
            if name in given and not any(rule.applies(c, names) for c in configs):
                raise HbenchError(f"{given[name]} {rule.why}")


def typed_flags(ctx: click.Context) -> dict[str, str]:
    """The parameters of ``ctx``'s command given on the command line (not
    defaults), by name, each with its flag as the help writes it."""
    out = {}
    for p in ctx.command.params:
        if ctx.get_parameter_source(p.name) is ParameterSource.COMMANDLINE:
            longs = [o for o in p.opts if o.startswith("--")] or list(p.opts)
            out[p.name] = "/".join(longs[:1] + list(p.secondary_opts))
    return out
