"""`scripts/device_check.sh`'s module in its CPU mode (DEVICE=cpu SMALL=1), one organization."""

from __future__ import annotations

import json
import subprocess

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("transformers")

from hbench import device_check  # noqa: E402
from tests.support import REPO_ROOT  # noqa: E402


@pytest.mark.slow
def test_small_cpu_mode_writes_the_report(tmp_path, monkeypatch):
    monkeypatch.setattr(device_check, "ORGS", ("s2",))
    rep = device_check.main(tmp_path, device="cpu", small=True)
    assert rep["parity"]["ok"] and rep["parity"]["max_rel_logit_diff"] < 1e-4
    cont = rep["continuation"]["s2"]
    assert cont["identical"] and cont["adopted_requests"] > 0 and cont["preemptions"] > 0
    row = rep["serving"]["s2"]
    assert row["finished"] == device_check.SMALL_RUN["requests"]
    assert row["step_p50_ms"] > 0 and row["ttft_p50_ms"] > 0 and row["process_peak_gib"] > 0
    saved = json.loads((tmp_path / "device_check.json").read_text())
    assert saved["serving"]["s2"]["steps"] == row["steps"]
    md = (tmp_path / "device_check.md").read_text()
    assert "| s2 | b12 |" in md and "parity vs transformers" in md
    # the calibration step leaves a profile hbench run --gpu accepts, beside the datasheet's
    from adapters.sim.profile import load_profile

    cal = rep["calibration"]
    profile = load_profile(cal["profile"])
    assert profile.engine == "torch" and profile.device == "cpu"
    assert cal["rates"]["mem_bytes_s"]["datasheet"] == pytest.approx(4.8e12 * 0.8)
    assert 0 <= cal["held_out_error"] < cal["datasheet_held_out_error"]
    assert "| mem_bytes_s |" in md


def test_the_script_is_valid_bash_and_runs_the_module():
    script = REPO_ROOT / "scripts" / "device_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert "-m hbench.device_check" in script.read_text()
