"""Multi-turn replay: sessions, the closed loop, the simulator serving them."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from common.errors import HbenchError
from harness.config import RunConfig
from harness.metrics import TURN_SUMMARY_KEYS, summarize
from harness.per_request import per_request_table, turn_table
from harness.run_setup import validate
from workloads.build import build_workload
from workloads.multiturn.derive import stream, think_times
from workloads.multiturn.session import SessionLoop
from workloads.spec import WorkloadSpec

RECIPE = dict(seed=3, q=1.0, rate=0.5, requests=12, workload_kind="multiturn", max_turns=4,
              think_time_s=2.0)


@pytest.fixture(scope="module")
def wl():
    return build_workload(**RECIPE)


def test_built_twice_with_one_seed_is_identical(wl):
    again = build_workload(**RECIPE)
    assert again.content_hash == wl.content_hash
    assert [s.request_ids for s in again.sessions] == [s.request_ids for s in wl.sessions]
    other = build_workload(**{**RECIPE, "seed": 4})
    assert other.content_hash != wl.content_hash


def test_sessions_respect_caps_and_number_requests_in_order(wl):
    assert len(wl.requests) == 12 and len(wl.sessions) == 12
    assert all(1 + len(s.turns) <= 4 for s in wl.sessions)
    assert any(s.turns for s in wl.sessions)
    ids = [rid for s in wl.sessions for rid in s.request_ids[1:]]
    assert ids == list(range(12, wl.total_requests))
    short = build_workload(**{**RECIPE, "max_history": 600})
    for s in short.sessions:
        first = short.requests[s.first_request]
        assert first.prompt_len + first.output_len <= 600
        assert all(t.prompt_len + t.output_len <= 600 for t in s.turns)


def test_next_prompt_is_previous_prompt_plus_generated_plus_new_message(wl):
    loop = SessionLoop(wl)
    s = next(s for s in wl.sessions if len(s.turns) >= 2)
    req = wl.requests[s.first_request]
    for k, turn in enumerate(s.turns):
        generated = np.arange(req.output_len, dtype=np.int64) + 10_000 * (k + 1)
        nxt = loop.next_turn(req, generated, finish_s=100.0 + k)
        expected = np.concatenate([req.prompt_token_ids, generated, turn.user_token_ids])
        assert np.array_equal(nxt.prompt_token_ids, expected)
        assert nxt.request_id == turn.request_id
        assert nxt.arrival_s == 100.0 + k + turn.think_s
        assert nxt.prefix_tokens == req.prompt_len + req.output_len
        assert nxt.prompt_len == turn.prompt_len   # planned length: outputs are exact
        req = nxt
    assert loop.next_turn(req, [1] * req.output_len, 200.0) is None


def test_replayed_answers_take_the_place_of_generated_tokens():
    w = build_workload(**{**RECIPE, "replay_answers": True})
    assert w.meta["replay_answers"] is True
    loop = SessionLoop(w)
    s = next(s for s in w.sessions if s.turns)
    req = w.requests[s.first_request]
    nxt = loop.next_turn(req, np.full(req.output_len, 7), 1.0)
    turn = s.turns[0]
    assert len(turn.answer_token_ids) == req.output_len
    assert np.array_equal(nxt.prompt_token_ids, np.concatenate(
        [req.prompt_token_ids, turn.answer_token_ids, turn.user_token_ids]))
    assert nxt.prompt_text == req.prompt_text + turn.answer_text + turn.user_text


def test_isolate_gives_each_session_one_salt(wl):
    w = build_workload(**{**RECIPE, "isolate": True})
    salts = [r.salt for r in w.requests]
    assert len(set(salts)) == len(salts) and None not in salts
    loop = SessionLoop(w)
    s = next(s for s in w.sessions if s.turns)
    first = w.requests[s.first_request]
    assert loop.next_turn(first, [1] * first.output_len, 0.0).salt == first.salt
    assert all(r.salt is None for r in wl.requests)


@pytest.mark.parametrize("kind,dist", [("exponential", "expon"), ("gamma", "gamma")])
def test_think_times_follow_their_distribution(kind, dist):
    spec = WorkloadSpec(seed=5, q=1.0, rate=1.0, workload_kind="multiturn", think=kind,
                        think_time_s=4.0, burstiness=0.5)
    x = think_times(spec, stream(5, "think"), 2000)
    args = (0, 4.0) if dist == "expon" else (2.0, 0, 2.0)   # gamma: shape 1/0.5, scale 4/2
    assert stats.kstest(x, dist, args=args).pvalue > 0.01
    assert stats.kstest(x, "expon", args=(0, 2.0)).pvalue < 1e-6   # a wrong mean is rejected
    const = WorkloadSpec(seed=5, q=1.0, rate=1.0, workload_kind="multiturn", think="constant",
                         think_time_s=4.0)
    assert np.all(think_times(const, stream(5, "think"), 10) == 4.0)


def test_session_arrivals_are_poisson_at_the_rate():
    w = build_workload(**{**RECIPE, "requests": 400, "rate": 2.0, "max_turns": 1})
    gaps = np.diff([0.0] + [r.arrival_s for r in w.requests])
    assert stats.kstest(gaps, "expon", args=(0, 0.5)).pvalue > 0.01
    assert w.total_requests == 400


def test_unknown_kind_and_think_are_refused():
    with pytest.raises(HbenchError, match="unknown --workload-kind"):
        WorkloadSpec(seed=0, q=1.0, rate=1.0, workload_kind="chat")
    with pytest.raises(HbenchError, match="think"):
        RunConfig(think="lognormal")
    with pytest.raises(HbenchError, match="max-turns"):
        RunConfig(max_turns=0)


PROMPTS: dict[str, dict[int, bytes]] = {}   # org -> request id -> later-turn prompt ids


@pytest.fixture(scope="module")
def served():
    import adapters.sim.engine as sim
    import workloads.multiturn.session as session

    class Recording(SessionLoop):
        def next_turn(self, finished, generated_token_ids, finish_s, generated_text=""):
            nxt = super().next_turn(finished, generated_token_ids, finish_s, generated_text)
            if nxt is not None:
                PROMPTS[self.org][nxt.request_id] = nxt.prompt_token_ids.tobytes()
            return nxt

    out = {}
    mp = pytest.MonkeyPatch()
    mp.setattr(session, "SessionLoop", Recording)   # the engine loop imports it when it serves sessions
    try:
        for org in ("s0", "s1", "s2", "d0"):
            cfg = RunConfig(org=org, budget="b83", workload_kind="multiturn", requests=12,
                            rate=0.5, max_turns=4, think_time_s=2.0, seed=3)
            w = build_workload(**RECIPE)
            Recording.org = org
            PROMPTS[org] = {}
            out[org] = (w, sim.SimEngine().run(w, validate(cfg)))
    finally:
        mp.undo()
    return out


@pytest.mark.parametrize("org", ["s0", "s1", "s2", "d0"])
def test_simulator_serves_every_turn_and_later_turns_reuse_history(served, org):
    w, run = served[org]
    recs = {r.request_id: r for r in run.requests}
    assert len(recs) == w.total_requests
    assert all(r.status == "finished" for r in recs.values())
    grid = run.engine_info["grid_tokens"]
    for s in w.sessions:
        prev = recs[s.first_request]
        assert (prev.session, prev.turn) == (s.session_id, 0)
        for k, t in enumerate(s.turns, start=1):
            r = recs[t.request_id]
            assert r.turn == k and r.session == s.session_id
            # prompt = previous prompt + what it generated + the new message
            assert r.prompt_tokens == prev.prompt_tokens + prev.output_tokens + len(t.user_token_ids)
            assert r.arrival_s == pytest.approx(prev.finish_s + t.think_s)
            # the previous turn's prefill checkpoints are reused (nothing else evicts them here)
            assert r.reused_tokens >= prev.prompt_tokens // grid * grid
            prev = r
    summary = summarize(run)
    assert set(TURN_SUMMARY_KEYS) <= set(summary)
    assert summary["later_turns"] == w.total_requests - len(w.requests)
    assert summary["history_survived_fraction"] == 1.0
    assert 0 < summary["history_reuse_fraction"] <= 1.0
    table = per_request_table(run).to_pandas()
    by_turn = turn_table(table)
    assert list(by_turn["turn"]) == sorted(set(table["turn"]))
    assert by_turn.loc[by_turn["turn"] == 0, "reused_tokens_mean"].item() == 0


def test_paired_organizations_see_identical_prompts_token_for_token(served):
    w = served["s0"][0]
    assert len(PROMPTS["s0"]) == w.total_requests - len(w.requests)
    assert PROMPTS["s0"] == PROMPTS["s1"] == PROMPTS["s2"] == PROMPTS["d0"]


def test_coarser_grid_reuses_less_history(served):
    s1 = summarize(served["s1"][1])["history_reused_tokens"]
    d0 = summarize(served["d0"][1])["history_reused_tokens"]
    assert d0 < s1     # D0 checkpoints every 1792 tokens, S1 every 512


def test_saved_multiturn_workload_loads_back_with_its_sessions(wl, tmp_path):
    from workloads.io import load_workload, save_workload

    back = load_workload(save_workload(wl, tmp_path / "mt.parquet"))
    assert back.content_hash == wl.content_hash
    assert back.total_requests == wl.total_requests
    t0, t1 = wl.sessions[0], back.sessions[0]
    assert [t.think_s for t in t1.turns] == [t.think_s for t in t0.turns]
    assert all(np.array_equal(a.user_token_ids, b.user_token_ids)
               for a, b in zip(t0.turns, t1.turns, strict=True))


def test_cli_runs_a_multiturn_workload(tmp_path):
    from click.testing import CliRunner

    from harness.results import read_run
    from hbench.cli import cli

    res = CliRunner().invoke(cli, [
        "run", "--workload-kind", "multiturn", "--requests", "6", "--rate", "1",
        "--max-turns", "3", "--think-time", "1", "--think", "constant", "--org", "s1",
        "--out", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    run = read_run(next(p for p in tmp_path.iterdir() if p.is_dir()))
    assert run["manifest"]["config"]["workload_kind"] == "multiturn"
    assert run["manifest"]["workload_meta"]["think"] == "constant"
    req = run["requests"]
    assert {"session", "turn", "history_tokens", "history_survived"} <= set(req.columns)
    assert run["summary"]["later_turns"] == int((req["turn"] >= 1).sum()) > 0
    later = req[req["turn"] >= 1]
    # turns whose previous prompt reached a 512-token grid point found it cached
    assert later["history_survived"].notna().any()
    assert (later["history_survived"].dropna() == 1.0).all()
    assert (later.loc[later["history_survived"] == 1.0, "reused_tokens"] >= 512).all()


def test_turn_figure_draws_reuse_and_ttft_by_turn_per_organization_and_budget(served):
    from analysis.figures import turn_figure
    from common.palette import org_color

    tables = {(org, "b83"): per_request_table(run).to_pandas() for org, (_, run) in served.items()}
    fig = turn_figure(tables)
    reuse_ax, ttft_ax = fig.axes
    assert [line.get_label() for line in reuse_ax.get_lines()] == ["D0", "S0", "S1", "S2"]
    assert [line.get_color() for line in reuse_ax.get_lines()] == [org_color(o) for o in ("d0", "s0", "s1", "s2")]
    s1 = turn_table(tables[("s1", "b83")])
    x, y = ttft_ax.get_lines()[2].get_data()
    assert list(x) == list(s1["turn"]) and np.allclose(y, 1e3 * s1["ttft_p50_s"])
    assert ttft_ax.get_yscale() == "log" and ttft_ax.get_title() == "budget b83: TTFT p50"
    # a second budget gets its own column of panels: budgets are never pooled into one line
    two = {**tables, ("s1", "b108"): tables[("s1", "b83")]}
    fig2 = turn_figure(two)
    assert [a.get_title() for a in fig2.axes] == ["budget b83: history served from cache",
                                                   "budget b108: history served from cache",
                                                   "budget b83: TTFT p50", "budget b108: TTFT p50"]
    assert [line.get_label() for line in fig2.axes[1].get_lines()] == ["S1"]
    single = {key: t.drop(columns=["turn"]) for key, t in tables.items()}
    assert turn_figure(single) is None


def test_run_size_guard_counts_every_turn_a_session_may_make():
    assert RunConfig(workload_kind="multiturn", requests=10, max_turns=3).expected_requests == 30
    assert RunConfig(requests=10, max_turns=3).expected_requests == 10
    with pytest.raises(HbenchError, match="--requests x --max-turns asks for about 1,600,000"):
        RunConfig(workload_kind="multiturn", requests=200_000)


def test_malformed_sessions_are_refused(wl):
    import dataclasses

    from workloads.workload import Workload

    s = next(s for s in wl.sessions if s.turns)
    bad_think = dataclasses.replace(s, turns=(dataclasses.replace(s.turns[0], think_s=-1.0),
                                              *s.turns[1:]))
    sessions = tuple(bad_think if x is s else x for x in wl.sessions)
    with pytest.raises(HbenchError, match="think time -1.0"):
        Workload(requests=wl.requests, meta=wl.meta, sessions=sessions)
    with pytest.raises(HbenchError, match="numbered"):
        Workload(requests=wl.requests, meta=wl.meta, sessions=wl.sessions[::-1])
    twice = (wl.sessions[0], dataclasses.replace(wl.sessions[1], first_request=0))
    with pytest.raises(HbenchError, match="distinct"):
        Workload(requests=wl.requests, meta=wl.meta, sessions=twice)


def test_a_saved_workload_records_its_own_kind_and_refuses_another(tmp_path):
    from click.testing import CliRunner

    from harness.results import read_run
    from hbench.cli import cli

    runner = CliRunner()
    path = tmp_path / "w.parquet"
    res = runner.invoke(cli, ["workload", "build", "--requests", "5", "--mean-input", "600",
                              "-o", str(path)])
    assert res.exit_code == 0, res.output
    out = tmp_path / "runs"
    res = runner.invoke(cli, ["run", "--workload", str(path), "--workload-kind", "multiturn",
                              "--out", str(out), "--json"])
    assert res.exit_code == 2 and "--workload-kind does not apply with --workload" in res.output
    assert not out.exists()
    res = runner.invoke(cli, ["run", "--workload", str(path), "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    run = read_run(next(p for p in out.iterdir() if p.is_dir()))
    assert run["manifest"]["config"]["workload_kind"] == "sharegpt"
    assert "later_turns" not in run["summary"]
