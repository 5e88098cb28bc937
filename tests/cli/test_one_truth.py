"""One truth per report: no sentence names a winner that the tables beside it
call a tie. For each kind of report (``analyze``'s report.md, report.html and
terminal, ``report``, ``capacity``'s report.html and terminal,
``reproduce``'s reproduce.md, report.html and terminal table, ``regress``'s
report) a tie (arms whose seeds cannot be told apart) must leave every
sentence without a winner, and a clear difference must put the winner
sentence there. Result trees are built with the results factory; the
capacity search's grid runner is replaced by a table of goodputs (its own
runs are exercised in tests/cli/test_capacity.py)."""

from __future__ import annotations

import html
import json
import re

import pandas as pd
import pytest

import hbench.capacity as capacity_command
from tests.support.cli import invoke
from tests.support.results_factory import run_id_of, write_run

T = "throughput_ledger_tok_s"
#: Sentences that name a winner or a difference: a signed effect worded as
#: more/fewer/higher/lower, a win, a significant lead, a count of
#: significant results above zero, a reproduced direction, a regression.
CLAIMS = (r"\b\d+(?:\.\d+)? % (?:more|fewer|higher|lower)\b", r"\bbeats\b",
          r"\bsignificantly (?:more|fewer|above|ahead|higher|lower)\b",
          r"\b[1-9]\d* of \d+ [^.]*?(?:are|have a) significant\b",
          r"direction reproduced: yes", r"\bREGRESSION\b")


def claims(text: str) -> list[str]:
    """Every winner claim in ``text`` (HTML tags and entities removed)."""
    plain = html.unescape(re.sub(r"<[^>]+>", " ", text))
    plain = re.sub(r"\s+", " ", plain)
    return [m.group(0) for pattern in CLAIMS for m in re.finditer(pattern, plain)]


def _tree(root, values: dict, budget: str = "b83", **extra) -> None:
    """One run per (org, seed) at ``budget``, 2 req/s: ``values[org]`` lists the
    throughput of seeds 1, 2, 3."""
    for org, per_seed in values.items():
        for seed, v in enumerate(per_seed, start=1):
            write_run(root, f"{org}-{budget}-{seed}", org=org, budget=budget, seed=seed, rate=2.0,
                      summary={T: v, "throughput_span_tok_s": v, **extra.get(org, {})})


# noisy, overlapping seeds: S2 ahead on average, the seeds cannot tell them apart
TIE = {"s2": [100.0, 112.0, 104.0], "d0": [106.0, 101.0, 108.0]}
# every seed: D0 about 20 % ahead
CLEAR = {"s2": [100.0, 101.0, 102.0], "d0": [120.0, 121.3, 122.2]}
WINNER = "D0 serves 20.0 % more output tok/s than S2 (95 % CI"


@pytest.mark.parametrize("values, winner", [(TIE, None), (CLEAR, WINNER)], ids=["tie", "difference"])
def test_analyze_sentences_follow_the_contrast_table(tmp_path, values, winner):
    _tree(tmp_path / "runs", values)
    res = invoke("analyze", tmp_path / "runs", "--out", tmp_path / "a", "--no-figures")
    assert res.exit_code == 0, res.output
    md, page = (tmp_path / "a" / "report.md").read_text(), (tmp_path / "a" / "report.html").read_text()
    table = pd.read_csv(tmp_path / "a" / "contrasts.csv")
    assert list(table.loc[table["metric"] == T, "significant"]) == [winner is not None]
    for text in (md, page, res.output):
        if winner is None:
            assert claims(text) == [], claims(text)
            assert "do not differ significantly on output tok/s" in re.sub(r"\s+", " ", text)
        else:
            assert winner in re.sub(r"\s+", " ", text)


@pytest.mark.parametrize("values, winner", [(TIE, None), (CLEAR, WINNER)], ids=["tie", "difference"])
def test_report_sentences_follow_the_contrast_table(tmp_path, values, winner):
    _tree(tmp_path / "runs", values)
    res = invoke("report", tmp_path / "runs", "-o", tmp_path / "r.html")
    assert res.exit_code == 0, res.output
    page = (tmp_path / "r.html").read_text()
    answers = page[:page.index("<h2>Figures")]
    if winner is None:
        assert claims(page) == [], claims(page)
        assert "not significant" in page and "do not differ significantly" in answers
    else:
        assert winner in answers and "<td>significant</td>" in page


def test_an_untested_contrast_names_no_winner_however_large(tmp_path):
    # D0 is 20 % ahead on every seed, but its requests failed: the contrast is not tested
    bad = {"validity": {"valid": False, "reasons": ["failures"], "checks": {"failures": {"status": "fail"}}}}
    _tree(tmp_path / "runs", CLEAR, d0=bad)
    res = invoke("report", tmp_path / "runs", "-o", tmp_path / "r.html")
    assert res.exit_code == 0, res.output
    page = (tmp_path / "r.html").read_text()
    assert claims(page) == [], claims(page)
    answers = html.unescape(page[:page.index("<h2>Figures")])
    assert "D0 vs S2 on output tok/s is not tested: arms not valid: throughput not valid in 3 of 6 runs" in answers
    assert "3 of 6 runs are not valid (failures: 3" in answers
    # run ids are left to the table at the end
    d0_1 = run_id_of(tmp_path / "runs" / "d0-b83-1")
    assert d0_1 not in answers and d0_1 in page[page.index("Runs not valid"):]


# ------------------------------------------------------------------ capacity

SLO = "ttft_p99<=2s,tpot_p99<=100ms"


def _capacity(tmp_path, monkeypatch, goodput: dict):
    """``hbench capacity`` over a grid whose goodputs are ``goodput[org][rate]``
    (a value per seed 1..3) at b63; every run meets the SLO."""
    out = tmp_path / "cap"
    rows = []
    for org, by_rate in goodput.items():
        for rate, per_seed in by_rate.items():
            for seed, g in enumerate(per_seed, start=1):
                run_id = f"{org}-{rate:g}-{seed}"
                d = write_run(out, run_id, org=org, budget="b63", rate=rate, seed=seed)
                rows.append({"org": org, "budget": "b63", "rate": rate, "seed": seed, "meets": True,
                             "slo_held": True, "goodput": g, "valid": True, "invalid_reasons": "",
                             "run_id": run_id,
                             "ttft_p99_s": 1.0, "tpot_p99_s": 0.05, "run_dir": str(d)})
    monkeypatch.setattr(capacity_command, "search", lambda *a, **k: pd.DataFrame(rows))
    res = invoke("capacity", "--org", ",".join(goodput), "--budget", "b63", "--rates", "1,2",
                 "--seeds", "1-3", "--slo", SLO, "--out", out)
    assert res.exit_code == 0, res.output
    return res.output, (out / "report.html").read_text(), json.loads((out / "capacity.json").read_text())


def test_capacity_tie_names_no_winner_and_no_crossover(tmp_path, monkeypatch):
    # D0 ahead at 1 req/s, S2 ahead at 2 req/s on average: mean-only crossover, but noisy seeds
    terminal, page, doc = _capacity(tmp_path, monkeypatch, {
        "s2": {1.0: [0.90, 1.00, 0.95], 2.0: [1.9, 1.5, 1.8]},
        "d0": {1.0: [1.00, 0.92, 0.96], 2.0: [1.6, 1.8, 1.6]}})
    assert [w["winner"] for w in doc["winner_map"]] == ["tie", "tie"] and doc["crossovers"] == []
    for text in (terminal, page):
        assert claims(text) == [], claims(text)
        assert "0 of 2 (budget, rate) cells have a significant goodput winner" in re.sub(r"\s+", " ", text)
    assert "no crossover" in terminal


def test_capacity_clear_difference_names_the_winner_and_the_crossover(tmp_path, monkeypatch):
    terminal, page, doc = _capacity(tmp_path, monkeypatch, {
        "s2": {1.0: [0.95, 0.96, 0.97], 2.0: [1.50, 1.51, 1.52]},
        "d0": {1.0: [0.95, 0.96, 0.97], 2.0: [1.90, 1.92, 1.93]}})
    assert [w["winner"] for w in doc["winner_map"]] == ["tie", "d0"]
    assert [(c["org"], c["beats"], c["from_rate"]) for c in doc["crossovers"]] == [("d0", "s2", 2.0)]
    sentence = "At b63, D0 serves significantly more goodput than S2 from 2 req/s up"
    for text in (terminal, page):
        flat = re.sub(r"\s+", " ", html.unescape(text))
        assert sentence in flat and "1 of 2 (budget, rate) cells have a significant goodput winner" in flat


# ------------------------------------------------------------------ reproduce

def _q4_tree(root, d0_over_s2: dict) -> None:
    """Q4's arms (D0 and S2 at b63, b83, b108) on seeds 1-3; D0's throughput
    is S2's times ``d0_over_s2[budget][seed - 1]``."""
    for budget, ratios in d0_over_s2.items():
        for seed, r in enumerate(ratios, start=1):
            s2 = 400.0 + 10 * seed
            for org, v in (("s2", s2), ("d0", s2 * r)):
                write_run(root, f"{org}-{budget}-{seed}", org=org, budget=budget, seed=seed, rate=3.0,
                          cap=63, summary={T: v})


@pytest.mark.parametrize("clear", [False, True], ids=["tie", "difference"])
def test_reproduce_says_direction_reproduced_only_when_significant(tmp_path, clear):
    from rich.console import Console

    from analysis.reproduce import evaluate_design
    from hbench.commands.reproduce import _print_table

    # the study: D0 +5.0 % at b63, -12.6 % at b108; hbench's b63 sign agrees in both trees
    b63 = [1.05, 1.051, 1.049] if clear else [1.09, 0.99, 1.07]
    _q4_tree(tmp_path, {"b63": b63, "b83": [0.99, 1.01, 1.0], "b108": [0.87, 0.875, 0.88]})
    rep = evaluate_design("q4", tmp_path, figures=False)
    row = rep.table.set_index("figure").loc["D0 vs S2 at b63"]
    assert row["direction_reproduced"] == "yes" and (row["hbench_verdict"] == "significant") == clear
    console = Console(width=250, record=True)
    _print_table(console, "q4", rep.table)
    md, page = (tmp_path / "reproduce.md").read_text(), (tmp_path / "analysis" / "report.html").read_text()
    # the b63 row's direction cell in each table: reproduce.md, the terminal, the report's study table
    terminal = console.export_text().splitlines()
    tables = ((md.splitlines(), "| D0 vs S2 at b63 |", "direction reproduced"),
              (terminal, "D0 vs S2 at b63", "direction"),
              (page.split("<tr>"), "<td>D0 vs S2 at b63</td>", "direction reproduced"))
    for lines, key, column in tables:
        head = next(ln for ln in lines if re.search(rf"(\||\u2503|<th>) ?{column}", ln))
        row = next(ln for ln in lines if key in ln)
        split = r"\||\u2503|\u2502|</?t[dh]>"
        names = [c.strip() for c in re.split(split, head) if c.strip()]
        cells = [c.strip() for c in re.split(split, row) if c.strip()]
        assert cells[names.index(column)] == ("yes" if clear else "same sign, not significant"), (names, cells)
    b63_sentence = next(x for x in re.findall(r"<li[^>]*>([^<]*)</li>", page)
                        if x.startswith("D0 vs S2 at b63:"))
    assert ("direction reproduced: yes" in b63_sentence) == clear
    assert ("same sign, not significant" in b63_sentence) == (not clear)


# ------------------------------------------------------------------ regress

BASE = {T: 400.0, "throughput_span_tok_s": 410.0, "ttft_p99_s": 2.0, "itl_p99_s": 0.05, "e2e_p99_s": 30.0,
        "peak_mem_total_bytes": 3e10}


def _noisy(root, throughput: list[float]) -> None:
    for seed, v in enumerate(throughput, start=1):
        write_run(root, f"s2-{seed}", org="s2", seed=seed, engine="vllm", endpoint="http://h:8000",
                  summary={**BASE, T: v, "throughput_span_tok_s": v})


@pytest.mark.parametrize("candidate, regressed", [([404.0, 392.0, 401.0], False), ([330.0, 331.0, 332.5], True)],
                         ids=["tie", "difference"])
def test_regress_report_claims_a_regression_only_when_significant(tmp_path, candidate, regressed):
    _noisy(tmp_path / "b", [400.0, 398.0, 403.0])
    _noisy(tmp_path / "c", candidate)
    res = invoke("regress", "--baseline", tmp_path / "b", "--candidate", tmp_path / "c",
                 "--report", tmp_path / "r.md")
    assert res.exit_code == (1 if regressed else 0), res.output
    md = (tmp_path / "r.md").read_text()
    for text in (md, res.output):
        assert ("REGRESSION" in text) == regressed
        if not regressed:
            assert claims(text) == [] and "no regression" in text
