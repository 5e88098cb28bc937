"""No flag is ignored in silence: a flag given where it does not apply is one
``Error:`` line naming it, before any work; given where it applies, it is
taken. Each case is one flag with a context where it does not apply and one
where it does (`hbench.flag_rules.RULES`).

A context where the flag applies is shown accepted by reaching the next
check of the command, the one on where the output goes (an ``--out`` under
a file): the flag check passed, and nothing ran.
"""

from __future__ import annotations

import dataclasses

import pytest

from harness.config import RunConfig
from hbench.commands.run import run as run_command
from hbench.flag_rules import APPLY_ALWAYS, RULES
from tests.support.cli import invoke, one_error_line

MT = ["--workload-kind", "multiturn"]
WL = ["--workload", "saved.parquet"]          # never read: the flag check comes first
TORCH = ["--engine", "torch", "--model", "{model}"]
VLLM_AT = ["--engine", "vllm", "--endpoint", "http://127.0.0.1:9"]
VLLM_LAUNCH = ["--engine", "vllm", "--launch"]
VLLM_IN = ["--engine", "vllm"]                 # no server named: vLLM's scheduler in process
SGLANG_IN = ["--engine", "sglang", "--org", "d0"]
SGLANG_AT = [*SGLANG_IN, "--endpoint", "http://127.0.0.1:9"]
UNWRITABLE = "/dev/null/out"

# (flag and value, a context where it does not apply, one where it does)
CASES = {
    "think-time": (["--think-time", "2"], [], MT),
    "think": (["--think", "constant"], [], MT),
    "max-turns": (["--max-turns", "3"], [], MT),
    "max-history": (["--max-history", "4000"], [], MT),
    "replay-answers": (["--replay-answers"], [], MT),
    "q": (["--q", "0.5"], MT, []),
    "contexts": (["--contexts", "4"], MT, []),
    "mean-input": (["--mean-input", "2000"], MT, []),
    "requests with duration": (["--requests", "240"], ["--duration", "30"], []),
    "burstiness, arrivals": (["--burstiness", "2"], [], ["--arrival", "gamma"]),
    "burstiness, think times": (["--burstiness", "2"], MT, [*MT, "--think", "gamma"]),
    "chat-column": (["--chat-column", "messages"], [], ["--dataset", "corpus.jsonl"]),
    "seed, saved workload": (["--seed", "3"], WL, []),
    "rate, saved workload": (["--rate", "1"], WL, []),
    "requests, saved workload": (["--requests", "12"], WL, []),
    "duration, saved workload": (["--duration", "10"], WL, []),
    "arrival, saved workload": (["--arrival", "constant"], WL, []),
    "isolate, saved workload": (["--isolate"], WL, []),
    "max-model-len, saved workload": (["--max-model-len", "4096"], WL, []),
    "max-output, saved workload": (["--max-output", "64"], WL, []),
    "workload-kind, saved workload": (MT, WL, []),
    "dataset, saved workload": (["--dataset", "corpus.jsonl"], WL, []),
    "device": (["--device", "cpu"], [], TORCH),
    "dtype": (["--dtype", "fp32"], VLLM_LAUNCH, TORCH),
    "poison": (["--poison"], [], TORCH),
    "endpoint": (["--endpoint", "http://127.0.0.1:9"], TORCH, ["--engine", "vllm"]),
    "endpoint with launch": (["--endpoint", "http://127.0.0.1:9"], VLLM_LAUNCH, ["--engine", "vllm"]),
    "launch": (["--launch"], [], ["--engine", "sglang", "--org", "d0"]),
    "server-cmd": (["--server-cmd", "serve {model}"], VLLM_AT, VLLM_LAUNCH),
    "gpu, torch": (["--gpu", "h100-sxm"], TORCH, []),
    "gpu, server": (["--gpu", "h100-sxm"], SGLANG_AT, SGLANG_IN),
    "gpu, vllm in process": (["--gpu", "h100-sxm"], VLLM_AT, VLLM_IN),
    "warmup, vllm in process": (["--warmup", "2"], VLLM_AT, VLLM_IN),
    "token-budget, vllm in process": (["--token-budget", "4096"], VLLM_AT, VLLM_IN),
    "headroom, vllm in process": (["--headroom", "0.1"], VLLM_AT, VLLM_IN),
    "admission, vllm in process": (["--admission", "whole-input"], SGLANG_IN, VLLM_IN),
    "allow-oversubscribe": (["--allow-oversubscribe"], TORCH, []),
    "debug-invariants": (["--debug-invariants"], SGLANG_IN, TORCH),
    "warmup": (["--warmup", "2"], VLLM_LAUNCH, SGLANG_IN),
    "cap": (["--cap", "8"], VLLM_AT, VLLM_LAUNCH),
    "token-budget": (["--token-budget", "4096"], VLLM_LAUNCH, SGLANG_IN),
    "headroom": (["--headroom", "0.1"], SGLANG_IN, VLLM_LAUNCH),
    "admission": (["--admission", "whole-input"], VLLM_AT, TORCH),
    "retention": (["--retention"], VLLM_LAUNCH, TORCH),
    "no-retention": (["--no-retention"], SGLANG_IN, []),
    "retention-threshold": (["--retention-threshold", "3"], [], ["--retention"]),
    "ckpt-publish": (["--ckpt-publish", "marconi"], SGLANG_IN, TORCH),
    "ckpt-evict": (["--ckpt-evict", "utility"], VLLM_LAUNCH, []),
    "ckpt-every-k": (["--ckpt-every-k", "3"], [], ["--ckpt-publish", "every-k"]),
    "utility-alpha": (["--utility-alpha", "2"], ["--ckpt-evict", "lru"], ["--ckpt-evict", "utility"]),
    "d0-attn-fraction, s2": (["--d0-attn-fraction", "0.3"], [], ["--org", "d0"]),
    "d0-attn-fraction, u0": (["--d0-attn-fraction", "0.3"], ["--org", "u0"], ["--org", "e0"]),
    "paging": (["--paging", "study"], SGLANG_IN, TORCH),
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A directory the torch engine's flags accept as --model (config.json present);
    never loaded, since nothing runs."""
    d = tmp_path_factory.mktemp("model")
    (d / "config.json").write_text("{}")
    return str(d)


def _args(args, model_dir):
    return [a.replace("{model}", model_dir) if a == "{model}" else a for a in args]


@pytest.mark.parametrize("case", list(CASES))
def test_a_flag_where_it_does_not_apply_is_refused(tmp_path, model_dir, case):
    flag, bad, _ = CASES[case]
    out = tmp_path / "out"
    res = invoke("run", "--out", out, *_args(bad, model_dir), *flag)
    line = one_error_line(res, flag[0])
    assert line.startswith(f"Error: {flag[0]}") or line.startswith("Error: --retention/"), line
    assert not out.exists()


@pytest.mark.parametrize("case", list(CASES))
def test_a_flag_where_it_applies_is_taken(model_dir, case):
    flag, _, good = CASES[case]
    one_error_line(invoke("run", "--out", UNWRITABLE, *_args(good, model_dir), *flag),
                   f"--out {UNWRITABLE}")


def test_every_run_flag_is_decided():
    """Each flag of ``hbench run`` either applies to every run or has a rule."""
    ruled = {name for rule in RULES for name in rule.names}
    params = {p.name for p in run_command.params}
    assert params == (params & (ruled | set(APPLY_ALWAYS))), params - ruled - set(APPLY_ALWAYS)
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    assert fields <= ruled | set(APPLY_ALWAYS), fields - ruled - set(APPLY_ALWAYS)


def test_every_rule_names_a_flag_that_exists():
    from hbench.commands.workload import build

    known = ({p.name for p in run_command.params} | {p.name for p in build.params}
             | {f.name for f in dataclasses.fields(RunConfig)})
    assert {name for rule in RULES for name in rule.names} <= known


@pytest.mark.parametrize("context", [TORCH, VLLM_AT, VLLM_LAUNCH, SGLANG_IN, SGLANG_AT, MT, WL])
def test_defaults_are_never_refused(model_dir, context):
    """Every field is in the config, defaults included: only what was typed
    counts, so a context alone (--device's default on sglang, --q's on a
    multi-turn run, --seed's with a saved workload) is taken."""
    one_error_line(invoke("run", "--out", UNWRITABLE, *_args(context, model_dir)),
                   f"--out {UNWRITABLE}")


# ------------------------------------------------------------ other commands

@pytest.mark.parametrize(("flag", "bad", "good"), [
    (["--think-time", "2"], [], MT),
    (["--q", "0.5"], MT, []),
    (["--requests", "30"], ["--duration", "10"], []),
    (["--burstiness", "2"], [], ["--arrival", "gamma"]),
    (["--chat-column", "messages"], [], ["--dataset", "corpus.jsonl"]),
    (["--revision", "main"], [], ["--dataset", "org/corpus"]),
])
def test_workload_build_refuses_and_takes_the_same_flags(tmp_path, flag, bad, good):
    out = tmp_path / "w.parquet"
    one_error_line(invoke("workload", "build", "-o", out, *bad, *flag), flag[0])
    assert not out.exists()
    one_error_line(invoke("workload", "build", "-o", f"{UNWRITABLE}/w.parquet", *good, *flag),
                   "--output")


@pytest.mark.parametrize(("flag", "bad", "good"), [
    (["--think-time", "2,5"], [], MT),
    (["--set", "think_time_s=2"], [], MT),
    (["--d0-attn-fraction", "0.3"], ["--org", "s2"], ["--org", "s2,d0"]),
    (["--set", "device=cuda"], [], ["--engine", "sim,torch"]),
    (["--requests", "30"], ["--set", "duration_s=10"], []),
    (["--utility-alpha", "1,2"], [], ["--ckpt-evict", "utility"]),
])
def test_sweep_refuses_a_flag_that_applies_to_none_of_its_cells(tmp_path, flag, bad, good):
    """A sweep's flag must apply to at least one cell (a sim and torch grid
    takes --set device for its torch cells)."""
    out = tmp_path / "out"
    line = one_error_line(invoke("sweep", "--out", out, "--dry-run", *bad, *flag))
    assert line.startswith(f"Error: {flag[0] if flag[0] != '--set' else '--set ' + flag[1].split('=')[0]}")
    small = [] if "--requests" in flag else ["--requests", "12"]   # each flag once
    res = invoke("sweep", "--out", out, "--dry-run", *small, *good, *flag)
    assert res.exit_code == 0, res.output
    assert "to run" in res.output


def test_a_sweep_grid_file_key_is_held_to_the_same_rules(tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text("think_time_s = [1.0, 2.0]\n")
    line = one_error_line(invoke("sweep", "--grid", grid, "--out", tmp_path / "out", "--dry-run"))
    assert f"{grid}: think_time_s applies to --workload-kind multiturn only" in line


@pytest.mark.parametrize(("flag", "bad", "good"), [
    (["--set", "think_time_s=2"], [], ["--set", "workload_kind=multiturn"]),
    (["--set", "ckpt_every_k=3"], [], ["--ckpt-publish", "every-k"]),
    (["--set", "device=cuda"], [], ["--set", "engine=torch"]),
    (["--requests", "30"], ["--set", "duration_s=10"], []),
    (["--set", "workload_path=saved.parquet"], [], None),
])
def test_capacity_refuses_what_its_runs_would_ignore(tmp_path, flag, bad, good):
    out = tmp_path / "cap"
    line = one_error_line(invoke("capacity", "--org", "s2", "--budget", "b83", "--out", out,
                                 *bad, *flag))
    assert not out.exists()
    if good is None:      # a saved workload has its own rate: the grid's rates cannot apply
        assert "--seeds does not apply with --workload FILE" in line
        return
    one_error_line(invoke("capacity", "--org", "s2", "--budget", "b83", "--out", UNWRITABLE,
                          *good, *flag), f"--out {UNWRITABLE}")


# ------------------------------------------------------------ the real-engine tools

VERIFY_TORCH = ["verify", "--engine", "torch"]           # then: needs --model DIR
VERIFY_LAUNCH = ["verify", "--engine", "vllm", "--launch"]  # then: needs --model DIR
VERIFY_AT = ["verify", "--engine", "vllm", "--endpoint", "http://127.0.0.1:9"]  # then: unreachable

# (flag, the command where it does not apply, the command where it does, its next error there)
TOOL_CASES = {
    "verify device": (["--device", "cpu"], VERIFY_LAUNCH, VERIFY_TORCH, "needs --model DIR"),
    "verify seed": (["--seed", "2"], VERIFY_AT, VERIFY_TORCH, "needs --model DIR"),
    "verify budget": (["--budget", "b8"], VERIFY_LAUNCH, VERIFY_TORCH, "needs --model DIR"),
    "verify blocks": (["--blocks", "4"], VERIFY_AT, VERIFY_LAUNCH, "needs --model DIR"),
    "verify no-control": (["--no-control"], VERIFY_TORCH, VERIFY_LAUNCH, "needs --model DIR"),
    "verify prompts": (["--prompts", "2"], VERIFY_TORCH, VERIFY_LAUNCH, "needs --model DIR"),
    "verify launch": (["--launch"], VERIFY_TORCH, ["verify", "--engine", "vllm"],
                      "needs --model DIR"),
    "verify server-cmd": (["--server-cmd", "serve {model}"], VERIFY_AT, VERIFY_LAUNCH,
                          "needs --model DIR"),
    "verify prompt-chars": (["--prompt-chars", "300"], VERIFY_LAUNCH, VERIFY_AT, "cannot reach"),
    "calibrate dtype": (["--dtype", "fp32"],
                        ["calibrate", "--engine", "vllm", "--model", "m", "-o", "p.json"],
                        ["calibrate", "--engine", "torch", "--model", "m", "-o",
                         f"{UNWRITABLE}/p.json"], "--out"),
    "fidelity device": (["--device", "cpu"], ["fidelity", "--engine", "vllm", "--model", "m"],
                        ["fidelity", "--model", "m", "--out", UNWRITABLE], "--out"),
    "fidelity quick": (["--quick"], ["fidelity", "--model", "m", "--profile", "p.json"],
                       ["fidelity", "--model", "m", "--out", UNWRITABLE], "--out"),
    "fidelity retention": (["--retention"], ["fidelity", "--engine", "vllm", "--model", "m"],
                           ["fidelity", "--engine", "vllm", "--in-process", "--out", UNWRITABLE],
                           "--out"),
    "fidelity retention-threshold": (["--retention-threshold", "3"],
                                     ["fidelity", "--engine", "vllm", "--in-process"],
                                     ["fidelity", "--engine", "vllm", "--in-process",
                                      "--retention", "--out", UNWRITABLE], "--out"),
}


@pytest.mark.parametrize("case", list(TOOL_CASES))
def test_a_tool_flag_is_refused_where_it_does_not_apply_and_taken_where_it_does(tmp_path, case):
    flag, bad, good, next_error = TOOL_CASES[case]
    line = one_error_line(invoke(*bad, *flag), flag[0])
    assert line.startswith(("Error: --control/", f"Error: {flag[0]}")), line
    one_error_line(invoke(*good, *flag), next_error)
