"""The HTML reports: `hbench report`, the one `analyze` writes, `capacity`'s
and `reproduce`'s. Each is checked statically (answers first, runs last and
folded, every figure a PNG data URI, nothing fetched from anywhere, every
figure the command wrote inlined) and rendered in a real headless Chromium:
the screenshot has the window's size and is not blank, every image decoded
(naturalWidth > 0), no element is wider than the page and no text is clipped
by its container. The browser checks skip when ``chromium`` is not
installed (CI installs it: .ci/run)."""

from __future__ import annotations

import base64
import json
import re
import shutil
import struct
import subprocess

import pytest
from click.testing import CliRunner

from hbench.cli import cli

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
# Appended to a copy of the report (the report itself has no script): after
# load, count images the browser decoded and write a marker into the DOM.
# Also lists elements reaching past the page's width and text elements whose
# content is wider than their box (clipped or spilling), opening every
# <details> first so folded tables are measured too.
PROBE = ("<script>window.addEventListener('load',function(){"
         "var ds=document.getElementsByTagName('details');for(var i=0;i<ds.length;i++)ds[i].open=true;"
         "var im=document.images,ok=0;"
         "for(var i=0;i<im.length;i++){if(im[i].complete&&im[i].naturalWidth>0)ok++;}"
         "var W=document.documentElement.clientWidth,wide=[],clipped=[],all=document.body.getElementsByTagName('*');"
         "for(var i=0;i<all.length;i++){var e=all[i],r=e.getBoundingClientRect(),t=(e.textContent||'').slice(0,30);"
         "if(r.right>W+1||r.left<-1)wide.push(e.tagName+' '+t);"
         "if(/^(P|LI|TD|TH|H1|H2|FIGCAPTION|SUMMARY)$/.test(e.tagName)&&e.clientWidth>0&&e.scrollWidth>e.clientWidth+1)"
         "clipped.push(e.tagName+' '+t);}"
         "var d=document.createElement('div');d.id='hbench-probe';"
         "d.textContent=JSON.stringify({loaded:ok,total:im.length,wide:wide,clipped:clipped,page:W,"
         "scroll:document.documentElement.scrollWidth});document.body.appendChild(d);});</script>")


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    for org in ("s2", "d0"):
        for seed in (1, 2):
            res = CliRunner().invoke(cli, ["run", "--out", str(root / "runs"), "--org", org, "--budget", "b108",
                                           "--rate", "2", "--requests", "12", "--seed", str(seed), "--json"])
            assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cli, ["capacity", "--org", "s2,d0", "--budget", "b108", "--rates", "1,8",
                                   "--seeds", "1", "--requests", "12", "--out", str(root / "capacity")])
    assert res.exit_code == 0, res.output
    out = root / "report.html"
    res = CliRunner().invoke(cli, ["report", str(root), "-o", str(out)])
    assert res.exit_code == 0, res.output
    return root, out


@pytest.fixture(scope="module")
def kinds(report, tmp_path_factory):
    """Every kind of report: `report`, `analyze`'s, `capacity`'s, `reproduce`'s (q3, 30 requests)."""
    import analysis.designs as D

    root, out = report
    res = CliRunner().invoke(cli, ["analyze", str(root / "runs"), "--out", str(root / "analysis")])
    assert res.exit_code == 0, res.output
    mp = pytest.MonkeyPatch()
    mp.setattr(D, "QUICK_REQUESTS", 30)
    try:
        rep = tmp_path_factory.mktemp("reproduce")
        res = CliRunner().invoke(cli, ["reproduce", "q3", "--quick", "--out", str(rep)])
        assert res.exit_code == 0, res.output
    finally:
        mp.undo()
    return {"report": out, "analyze": root / "analysis" / "report.html",
            "capacity": root / "capacity" / "report.html", "reproduce": rep / "q3-quick" / "analysis" / "report.html"}


def _h2(text: str) -> list[str]:
    return re.findall(r"<h2>([^<]*)", text)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["report", "analyze", "capacity", "reproduce"])
def test_every_report_answers_first_and_lists_runs_last_folded(kinds, kind):
    text = kinds[kind].read_text()
    h2 = _h2(text)
    assert h2[0] == "Answers" and h2[-1] == "Runs and validity", h2
    assert h2.index("Figures") < next(i for i, h in enumerate(h2) if h.startswith("Contrasts"))
    answers = text[text.index("<h2>Answers"):text.index("<h2>", text.index("<h2>Answers") + 4)]
    assert "Asked:" in answers and "<li" in answers
    runs = text[text.index("<h2>Runs and validity"):]
    # folded: the runs that are not valid (if any) first, then every run
    assert re.match(r"<h2>Runs and validity</h2>(<h3>Runs not valid</h3><details><summary>.*?</details>)?"
                    r"<details><summary>", runs), runs[:300]
    # the run table is sorted by organization, budget, rate and seed, not by run id
    rows = re.findall(r"<tr><td>([a-z0-9]+)</td><td>([a-z0-9]+)</td><td>([0-9.]+)</td>",
                      runs[runs.rindex("<details>"):])
    assert rows and [r[0] for r in rows] == sorted(r[0] for r in rows)


@pytest.mark.slow
def test_reproduce_report_carries_the_study_table(kinds):
    text = kinds["reproduce"].read_text()
    assert "<h2>Study vs hbench" in text
    table = text[text.index("<h2>Study vs hbench"):]
    for col in ("study&#x27;s value", "hbench&#x27;s value", "hbench&#x27;s verdict"):
        assert f"<th>{col}</th>" in table, col
    assert "<td>no-share control: S0 throughput</td>" in table
    assert "no-share control: S0 throughput: the study reported 293.84 tok/s" in text


def test_capacity_report_opens_with_capacity_sentences(kinds, report):
    root, _ = report
    doc = json.loads((root / "capacity" / "capacity.json").read_text())
    text = kinds["capacity"].read_text()
    answers = text[:text.index("<h2>Figures")]
    for c in doc["capacity"]:
        assert f"{c['org'].upper()} at {c['budget']} sustains " in answers
        assert f"{c['capacity_req_s']:.2f} req/s within" in answers
    assert 'alt="capacity winner map"' in answers


def test_analyze_report_inlines_every_figure_it_wrote(kinds, report):
    root, _ = report
    written = sorted(p.stem for p in (root / "analysis" / "figures").glob("*.png"))
    assert written and {"latency_cdf", "contrasts_forest"} <= set(written)
    alts = set(re.findall(r'<img alt="([^"]+)"', kinds["analyze"].read_text()))
    assert set(written) <= alts, set(written) - alts


def test_report_is_self_contained_with_every_section(report):
    root, out = report
    text = out.read_text()
    for heading in ("Runs and validity", "Contrasts", "TTFT attribution", "Capacity at the SLO",
                    "Shared-prefix diagnostics", "Figures"):
        assert f"<h2>{heading}" in text, heading
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//|file:)""", text), "fetches something"
    srcs = re.findall(r'<img[^>]*src="([^"]+)"', text)
    assert len(srcs) >= 4                       # forest, attribution, winner map, latency CDF
    for src in srcs:
        assert src.startswith("data:image/png;base64,")
        w, h = _png_size(base64.b64decode(src.split(",", 1)[1]))
        assert w > 100 and h > 100
    # the capacity numbers are those of capacity.json
    doc = json.loads((root / "capacity" / "capacity.json").read_text())
    assert all(f"<td>{c['org']}</td><td>{c['budget']}</td>" in text for c in doc["capacity"])


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
@pytest.mark.parametrize("kind", ["report", "analyze", "capacity", "reproduce"])
def test_report_renders_in_headless_chromium(kinds, kind, tmp_path):
    import html as H

    out = kinds[kind]
    shot = tmp_path / "shot.png"
    subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
                    "--window-size=1200,2000", out.as_uri()],
                   check=True, capture_output=True, timeout=120)
    data = shot.read_bytes()
    assert _png_size(data) == (1200, 2000)
    assert len(data) > 50_000, "the screenshot is (nearly) blank"

    probe = tmp_path / "probe.html"
    probe.write_text(out.read_text().replace("</body>", PROBE + "</body>"))
    dom = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile2'}", "--window-size=1200,2000",
                          "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()],
                         check=True, capture_output=True, text=True, timeout=120).stdout
    m = re.search(r'<div id="hbench-probe">([^<]*)</div>', dom)
    assert m, "the probe did not run"
    found = json.loads(H.unescape(m.group(1)))
    assert found["total"] == out.read_text().count("<img ") and found["loaded"] == found["total"] > 0
    assert found["wide"] == [] and found["scroll"] <= found["page"], found["wide"]
    assert found["clipped"] == [], found["clipped"]


@pytest.mark.slow
def test_analyze_writes_the_html_report_too(report, tmp_path):
    root, _ = report
    res = CliRunner().invoke(cli, ["analyze", str(root / "runs"), "--out", str(tmp_path / "a"), "--no-figures"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "a" / "report.html").read_text().startswith("<!DOCTYPE html>")
