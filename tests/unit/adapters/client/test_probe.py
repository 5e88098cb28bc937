"""``hbench probe`` against `FakeCacheServer`, whose cache geometry the tests script.

Every finding is checked against the value the scripted cache implies: the
reuse unit (smallest reusable prefix, step, hits inside a block), a prefix
inside a longer prompt, a request's own history, survival after K filler
requests, cache on/off, and each evidence source (cached_tokens, /metrics,
TTFT). Then a saved multi-turn workload's replay with a reason per shortfall,
and bad input: one ``Error:`` line, exit 2, nothing written.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from adapters.client.http import Endpoint
from adapters.client.probe_design import Probe
from adapters.client.probe_replay import common_prefix, first_turn_sharers
from adapters.client.probe_ttft import fit_prefill
from adapters.client.probe_wire import Budget, ProbeClient, server_facts
from analysis.probe_verdict import grid_floor, reason
from hbench.cli import cli
from tests.support.fake_openai_cache import FakeCacheServer
from workloads.io import save_workload
from workloads.multiturn.session import Session, Turn
from workloads.workload import Workload, WorkloadRequest


def probe(server: FakeCacheServer, max_requests: int = 120, seed: int = 1):
    ep = Endpoint("127.0.0.1", server.port)
    client = ProbeClient(ep, server_facts(ep, None), Budget(max_requests, 120.0), seed=seed)
    return Probe(client).run()


@pytest.mark.slow
def test_block_aligned_cache_that_keeps_states_where_prompts_end():
    # 64-token blocks; one state per prompt where its last block starts (vLLM align);
    # 6 stored states: a warm prefix survives 5 fillers, not 8
    with FakeCacheServer(block=64, ends_only=True, capacity=6) as s:
        f = probe(s)
    assert f.evidence == "usage" and f.confidence == "high"
    assert f.cache_on is True and f.probe_len == 1024
    assert f.reused_at_top == 960                  # floor(1023 / 64) x 64
    assert (f.step, f.smallest, f.shortest_hit_len) == (64, 64, 65)
    assert f.stops_inside_block is False
    assert f.branch_reused == f.branch_reused_third == 0 and f.branch_prefix == 128
    assert "not reused by a second or a third prompt" in f.branch_meaning
    # turn 1: 161 prompt tokens + 8 generated; its state sits at 128
    assert (f.history_prompt, f.history_generated, f.history_reused) == (161, 8, 128)
    assert (f.survived_fillers, f.evicted_by_fillers) == (4, 8)
    assert f.server_block_size == 64 and not f.budget_spent


@pytest.mark.slow
def test_a_cache_that_keeps_every_block_reuses_a_prefix_inside_a_longer_prompt():
    with FakeCacheServer(block=32, ends_only=False) as s:
        f = probe(s, max_requests=40)
    # a 32-token prompt stores its one full block
    assert (f.step, f.smallest, f.shortest_hit_len) == (32, 32, 32)
    assert f.branch_reused == f.branch_reused_third == f.branch_prefix == 64
    assert f.branch_meaning.endswith("reused by the second prompt to share it")
    assert (f.history_prompt, f.history_reused) == (81, 64)   # the prompt's full blocks
    assert f.stops_inside_block is False
    # survival runs until the next doubling would overrun the budget
    assert f.notes == [f"survival stopped by the request budget: the prefix survived "
                       f"{f.survived_fillers} fillers"]
    assert f.evicted_by_fillers is None and f.survived_fillers >= 4 and f.requests <= 40


@pytest.mark.slow
def test_a_prefix_inside_an_earlier_prompt_is_reused_from_the_third_prompt_on():
    """vLLM 0.32: the second prompt to share a prefix finds no state inside the
    first, and caches one where the two branch; the third reuses it."""
    with FakeCacheServer(block=64, ends_only=True, junctions=True) as s:
        f = probe(s, max_requests=40)
    assert (f.branch_prefix, f.branch_reused, f.branch_reused_third) == (128, 0, 128)
    assert "from the third prompt to share it on" in f.branch_meaning
    assert "junction" in f.branch_meaning
    rows = [p for p in f.pairs if p["what"].startswith("shared prefix")]
    assert [(p["prefix"], p["reused"]) for p in rows] == [(128, 0), (128, 128)]


def test_the_probes_table_says_what_the_third_prompt_means():
    from adapters.client.probe_design import Findings, branch_meaning
    from analysis.probe_verdict import summary_lines

    f = Findings(model="m", probe_len=1024, branch_prefix=256, branch_reused=0,
                 branch_reused_third=256, branch_meaning=branch_meaning(0, 256, 256))
    lines = dict(summary_lines(f.as_dict()))
    assert lines["prefix inside an earlier prompt"].startswith("0 of 256 shared tokens reused "
                                                               "by the second prompt")
    assert lines["the same prefix, a third prompt"] == (
        "256 of 256 shared tokens reused: a prefix inside an earlier prompt is reused from "
        "the third prompt to share it on: the second cached a state at the junction, where the "
        "prefix branched")


@pytest.mark.slow
def test_a_token_granular_cache_lets_a_hit_stop_anywhere():
    # every token boundary is stored: 1024 positions per filler, so 10,000 stored positions
    # keep the warm prefix through 8 fillers of 1024 tokens and lose it to 16
    with FakeCacheServer(block=1, ends_only=False) as s:
        f = probe(s)
    assert (f.step, f.smallest, f.shortest_hit_len) == (1, 1, 1)
    assert f.reused_at_top == 1024 and f.stops_inside_block is True
    assert f.branch_reused == f.branch_reused_third == f.branch_prefix == 2
    assert f.history_reused == f.history_prompt == 3     # this cache keeps no generated token
    assert (f.survived_fillers, f.evicted_by_fillers) == (8, 16)


@pytest.mark.slow
def test_metrics_counter_is_the_evidence_without_cached_tokens():
    with FakeCacheServer(block=64, report_cached=False, metrics=True) as s:
        f = probe(s, max_requests=30)
    assert f.evidence == "metrics" and f.confidence == "high"
    assert (f.step, f.smallest, f.shortest_hit_len) == (64, 64, 65)


@pytest.mark.slow
def test_time_to_first_token_is_the_evidence_without_any_count():
    # 1 ms per computed token: a 64-token hit saves 64 ms, above the tens of ms a loaded
    # machine may add to one first token
    with FakeCacheServer(block=64, report_cached=False, metrics=False, max_model_len=272,
                         ttft_base_s=0.003, ttft_per_token_s=0.001) as s:
        f = probe(s, max_requests=100)
    assert f.evidence == "ttft" and f.confidence in ("medium", "low")
    assert f.prefill_fit["points"] >= 6
    assert abs(f.prefill_fit["per_token_us"] - 1000) < 200
    assert f.cache_on is True
    # a loaded machine may delay a first token by tens of ms: the unit is found, or the
    # probe says its repeated pairs disagreed (and so that it is not sure)
    if f.confidence == "low":
        assert "disagreed" in f.confidence_why
    else:
        assert f.confidence == "medium"
        assert abs(f.shortest_hit_len - 65) <= 4 and abs(f.smallest - 64) <= 12
        assert f.step is not None and abs(f.step - 64) <= 12


def test_ttft_confidence_follows_the_fit_and_the_spread_of_repeated_pairs():
    from adapters.client.probe_evidence import Evidence
    from adapters.client.probe_ttft import PrefillFit

    ev = Evidence("ttft", fit=PrefillFit(0.003, 0.001, 0.002, 6), separations=[32.0, 64.0],
                  spreads=[3, 5])
    assert ev.confidence(64)[0] == "medium" and ev.resolution() == 6
    ev.spreads.append(17)                          # more than a quarter of 64 tokens
    assert ev.confidence(64)[0] == "low" and "disagreed by 17 tokens" in ev.confidence(64)[1]
    assert Evidence("ttft", separations=[5.0]).confidence(64)[0] == "low"
    assert Evidence("usage").confidence(64)[0] == "high" and Evidence("usage").resolution() == 0


@pytest.mark.slow
def test_cache_off_is_found_and_reported_from_cache_config_info():
    with FakeCacheServer(block=64, cache_on=False) as s:
        res = CliRunner().invoke(cli, ["probe", "--endpoint", s.url, "--json", "--seed", "3"])
    assert res.exit_code == 0, res.output
    f = json.loads(res.output)["findings"]
    assert f["cache_on"] is False and f["step"] is None
    assert "enable_prefix_caching=False" in f["cache_off_reason"]
    assert f["requests"] == 3                      # evidence shot + one pair: nothing more to ask


@pytest.mark.slow
def test_cache_off_without_metrics_names_both_explanations():
    with FakeCacheServer(block=64, cache_on=False, metrics=False) as s:
        f = probe(s)
    assert f.cache_on is False
    assert "prefix caching is off, or its unit is longer than 1024" in f.cache_off_reason


@pytest.mark.slow
def test_a_reused_seed_meets_its_own_prefixes_and_a_fresh_one_does_not():
    with FakeCacheServer(block=64) as s:
        first = probe(s, max_requests=12, seed=5)
        again = probe(s, max_requests=12, seed=5)
        fresh = probe(s, max_requests=12, seed=6)
    assert first.reused_at_top == fresh.reused_at_top == 960
    # polluted: the same seed's first probe prompt is found whole, past its own warm state
    assert again.reused_at_top == 1024


def test_prefill_fit_and_grid_arithmetic():
    fit = fit_prefill([(100, 0.012), (200, 0.022), (400, 0.042), (100, 0.012)])
    assert fit.per_token_s == pytest.approx(1e-4) and fit.intercept_s == pytest.approx(0.002)
    assert fit.reused(400, 0.022) == 200 and fit.reused(400, 0.0419) == 0
    assert fit_prefill([(100, 0.01), (100, 0.01), (100, 0.02)]) is None
    g = {"smallest": 128, "step": 128}
    assert [grid_floor(n, g) for n in (127, 128, 255, 256, 1000)] == [0, 128, 128, 256, 896]
    assert common_prefix(np.array([1, 2, 3]), np.array([1, 2, 4, 5])) == 2


def _ids(n: int, start: int) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.int64)


def _req(rid, t, ids, salt=None, group=-1):
    return WorkloadRequest(request_id=rid, arrival_s=t, prompt_text=" ".join(map(str, ids)),
                           prompt_token_ids=np.asarray(ids, dtype=np.int64), output_len=4,
                           prefix_group=group, salt=salt)


def replay_workload() -> Workload:
    """Shortfalls of every kind against 64-token blocks kept where prompts end (capacity 8)."""
    system = _ids(300, 1000)
    reqs = [
        _req(0, 0.0, np.concatenate([system, _ids(200, 5000)])),        # state at 448
        _req(1, 0.3, np.concatenate([system, _ids(50, 6000)])),         # 300 shared, no state <= 300
        _req(2, 0.6, np.concatenate([_ids(40, 1000), _ids(30, 7000)])),  # 40 shared: under a block
        _req(3, 0.9, np.concatenate([system, _ids(200, 5000)]), salt="other"),  # r0's twin, salted
        _req(4, 1.2, _ids(600, 20000)),                                  # producer: state at 576
        _req(5, 1.2005, np.concatenate([_ids(600, 20000), _ids(10, 9000)])),  # while r4 computes
        _req(6, 1.6, _ids(200, 30000)),                                  # state at 192, then evicted
        *[_req(7 + i, 1.9 + 0.05 * i, _ids(100, 40000 + 1000 * i)) for i in range(10)],
        _req(17, 2.6, np.concatenate([_ids(200, 30000), _ids(5, 9500)])),
    ]
    turn = Turn(request_id=18, user_token_ids=_ids(3, 8000), user_text=" 8000 8001 8002",
                answer_token_ids=np.zeros(0, dtype=np.int64), answer_text="", output_len=4,
                think_s=0.01, prompt_len=0)
    sessions = tuple(Session(session_id=r.request_id, first_request=r.request_id,
                             turns=(turn,) if r.request_id == 0 else ()) for r in reqs)
    return Workload(tuple(reqs), meta={"max_model_len": 1040}, sessions=sessions)


@pytest.mark.slow
def test_replay_of_a_saved_multiturn_workload_gives_a_reason_per_shortfall(tmp_path):
    path = save_workload(replay_workload(), tmp_path / "w.parquet")
    html = tmp_path / "probe.html"
    with FakeCacheServer(block=64, ends_only=True, capacity=8,
                         ttft_base_s=0.001, ttft_per_token_s=0.0001) as s:
        res = CliRunner().invoke(cli, ["probe", "--endpoint", s.url, "--workload", str(path),
                                       "--max-requests", "30", "--json", "-o", str(html)])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)["replay"]
    rows = {r["request_id"]: r for r in rep["requests"]}
    assert rows[1]["shareable"] == 300 and rows[1]["reused"] == 0
    assert rows[1]["reason"] == "no_grid_position"
    assert rows[2]["shareable"] == 40 and rows[2]["reason"] == "shorter_than_block"
    assert rows[3]["shareable"] == 499 and rows[3]["reason"] == "isolate"
    assert rows[5]["shareable"] == 600 and rows[5]["reason"] == "producer_computing"
    assert rows[17]["shareable"] == 200 and rows[17]["reason"] == "evicted_before_reuse"
    # the later turn: r0's 500 prompt tokens + 4 generated; its state at 448 is reused
    assert rows[18]["turn"] == 1 and rows[18]["shareable"] == 504 and rows[18]["reused"] == 448
    assert rows[18]["reason"] == "rounded_to_unit"
    assert rows[0]["shareable"] == 0 and rows[0]["reason"] == ""
    assert set(rep["by_reason"]) == {"no_grid_position", "shorter_than_block", "isolate",
                                     "producer_computing", "evicted_before_reuse",
                                     "rounded_to_unit"}
    assert rep["totals"]["requests"] == 19 and rep["totals"]["estimated"] is False
    # most tokens were lost to the request sent while its sharer computed (600)
    assert "(600) were lost to: the earlier requests" in rep["advice"]
    assert "warm the prefix first" in rep["advice"]
    page = html.read_text()
    assert "<script" not in page and "src=" not in page and "Workload replay" in page


def test_replay_on_a_server_with_caching_off_blames_the_cache():
    rows = [{"request_id": 1, "shareable": 300, "reused": 0, "salt_differs": False,
             "sharer_prompt": 500, "sharer_started": True}]
    assert reason(rows[0], {"cache_on": False}, False) == "cache_off"
    on = {"cache_on": True, "smallest": 64, "step": 64, "branch_reused": 64}
    assert reason(rows[0], on, False) == "evicted_before_reuse"
    assert reason(rows[0], on, True) == "evicted_after_reuse"


def test_first_turn_sharers_pick_the_longest_earlier_prefix():
    w = Workload((_req(0, 0.0, _ids(10, 1)), _req(1, 0.1, _ids(5, 1)),
                  _req(2, 0.2, np.concatenate([_ids(8, 1), _ids(2, 90)]))))
    assert first_turn_sharers(w) == {1: (5, 0), 2: (8, 0)}


@pytest.mark.slow
def test_terminal_table_names_every_finding():
    with FakeCacheServer(block=64, capacity=6) as s:
        res = CliRunner().invoke(cli, ["probe", "--endpoint", s.url, "--seed", "2"])
    assert res.exit_code == 0, res.output
    for words in ("smallest reusable prefix", "step between reusable lengths",
                  "a hit can stop inside a block", "prefix inside an earlier prompt",
                  "own history between turns", "cached prefix survival", "evidence"):
        assert words in res.output


@pytest.mark.parametrize("args, message", [
    (["--endpoint", "http://127.0.0.1:1"], "Error: cannot reach http://127.0.0.1:1"),
    (["--endpoint", "ftp://x"], "Error: endpoint must look like http://HOST:PORT"),
    (["--endpoint", "http://127.0.0.1:1", "--max-requests", "2"], "Error: --max-requests"),
])
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, args, message):
    out = tmp_path / "r.html"
    res = CliRunner().invoke(cli, ["probe", *args, "-o", str(out)])
    assert res.exit_code == 2 and res.output.startswith(message), res.output
    assert len(res.output.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.slow
def test_a_missing_workload_or_model_is_refused_before_any_request(tmp_path):
    out = tmp_path / "r.html"
    with FakeCacheServer(block=64) as s:
        res = CliRunner().invoke(cli, ["probe", "--endpoint", s.url, "--workload",
                                       str(tmp_path / "none.parquet"), "-o", str(out)])
        assert res.exit_code == 2 and res.output.startswith("Error: ")
        res2 = CliRunner().invoke(cli, ["probe", "--endpoint", s.url, "--model", "other"])
        assert res2.exit_code == 2
        assert res2.output.strip() == (f"Error: {s.url} does not serve 'other' "
                                       "(it serves fake-hybrid)")
        assert s.completions == 0
    assert not out.exists()


@pytest.mark.slow
def test_replay_without_per_request_counts_gives_the_servers_counter_total(tmp_path):
    w = Workload((_req(0, 0.0, _ids(300, 1)), _req(1, 0.2, _ids(310, 1))))
    path = save_workload(w, tmp_path / "w.parquet")
    with FakeCacheServer(block=64, report_cached=False, metrics=True) as s:
        res = CliRunner().invoke(cli, ["probe", "--endpoint", s.url, "--workload", str(path),
                                       "--max-requests", "12", "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)["replay"]
    assert [r["reused"] for r in rep["requests"]] == [None, None]
    assert rep["totals"]["unknown"] == 2 and rep["totals"]["metrics_reused"] == 256
    assert rep["by_reason"] == {}
    assert rep["advice"].endswith("its hit counter rose by 256 tokens against 300 shareable.")
