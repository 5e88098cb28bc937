"""`hbench report`: one self-contained HTML file, checked statically (every
figure a PNG data URI, nothing fetched from anywhere) and rendered in a real
headless Chromium: the screenshot has the window's size and is not blank, and
every image decoded in the browser (naturalWidth > 0). The browser checks
skip when ``chromium`` is not installed (CI installs it: .ci/run)."""

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
PROBE = ("<script>window.addEventListener('load',function(){var im=document.images,ok=0;"
         "for(var i=0;i<im.length;i++){if(im[i].complete&&im[i].naturalWidth>0)ok++;}"
         "var d=document.createElement('div');d.id='hbench-probe';"
         "d.textContent='images-loaded '+ok+'/'+im.length;document.body.appendChild(d);});</script>")


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


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_report_renders_in_headless_chromium(report, tmp_path):
    _, out = report
    shot = tmp_path / "shot.png"
    subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
                    "--window-size=1200,2000", out.as_uri()],
                   check=True, capture_output=True, timeout=120)
    data = shot.read_bytes()
    assert _png_size(data) == (1200, 2000)
    assert len(data) > 50_000, "the screenshot is (nearly) blank"

    probe = tmp_path / "probe.html"
    probe.write_text(out.read_text().replace("</body>", PROBE + "</body>"))
    dom = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile2'}",
                          "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()],
                         check=True, capture_output=True, text=True, timeout=120).stdout
    m = re.search(r"images-loaded (\d+)/(\d+)", dom)
    assert m, "the probe did not run"
    loaded, total = int(m.group(1)), int(m.group(2))
    assert total == out.read_text().count("<img ") and loaded == total > 0


def test_analyze_writes_the_html_report_too(report, tmp_path):
    root, _ = report
    res = CliRunner().invoke(cli, ["analyze", str(root / "runs"), "--out", str(tmp_path / "a"), "--no-figures"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "a" / "report.html").read_text().startswith("<!DOCTYPE html>")
