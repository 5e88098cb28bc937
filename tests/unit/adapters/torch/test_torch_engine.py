"""`hbench run --engine torch`: real page pools, real tokens, a complete results directory."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from adapters.tiny_model import PRESETS, write_weights  # noqa: E402
from harness.results import list_runs, read_run  # noqa: E402
from hbench.cli import cli  # noqa: E402

VOCAB = 512
WORKLOAD = ["--requests", "6", "--rate", "50", "--mean-input", "700", "--max-output", "6",
            "--contexts", "2", "--max-model-len", "4096", "--seed", "2"]



def run_torch(out, model_dir, *args):
    return CliRunner().invoke(cli, ["run", "--engine", "torch", "--model", str(model_dir),
                                    "--out", str(out), "--json", *WORKLOAD, *args])


@pytest.mark.slow
@pytest.mark.parametrize("org", ["s0", "s1", "s2", "d0", "u0", "e0"])
def test_every_organization_writes_a_complete_results_directory(tmp_path, model_dir, org):
    res = run_torch(tmp_path, model_dir, "--org", org, "--budget", "b12")
    assert res.exit_code == 0, res.output
    runs = list_runs(tmp_path)
    assert len(runs) == 1
    data = read_run(runs[0])
    s, m = data["summary"], data["manifest"]
    assert s["finished"] == 6 and s["failed"] == 0
    assert m["engine"] == "torch" and m["engine_version"].startswith("torch-")
    # the geometry came from the model directory's config.json, not a preset
    assert m["config"]["config_path"] == str(model_dir / "config.json")
    info = m["engine_info"]
    assert info["device"] == "cpu" and info["dtype"] == "float32" and info["byte_scale"] == 2.0
    # pools really allocated: pages x page bytes x layers, float32 = twice the bf16 bytes
    layers = PRESETS["proportional"].num_hidden_layers
    accounted = sum(p["pages"] * p["page_bytes"] for p in m["budget"]["pools"]) * layers
    assert info["pool_tensor_bytes"] == 2 * accounted
    assert info["process_peak_bytes"] >= info["pool_tensor_bytes"]
    req = data["requests"]
    assert (req["output_tokens"] == req["target_output_tokens"]).all()
    assert s["ttft_p50_s"] > 0 and s["itl_p50_s"] > 0 and s["throughput_span_tok_s"] > 0
    steps = data["steps"]
    # measured, not modelled: each step's parts add up to its wall-clock duration
    assert (steps["duration_s"] > 0).all() and (steps["compute_s"] > 0).all()
    parts = steps["compute_s"] + steps["state_io_s"] + steps["overhead_s"]
    assert ((parts - steps["duration_s"]).abs() < 1e-6).all()
    assert (steps["time_s"] - steps["start_s"] - steps["duration_s"]).abs().max() < 1e-6
    assert steps["mem_ssm_bytes"].max() > 0 and steps["mem_attention_bytes"].max() > 0
    printed = json.loads(res.output[res.output.index("{"):])
    assert printed["finished"] == 6


def test_model_directory_is_required(tmp_path):
    res = CliRunner().invoke(cli, ["run", "--engine", "torch", "--out", str(tmp_path),
                                   "--requests", "2"])
    assert res.exit_code != 0
    assert "Error: --engine torch needs --model DIR" in res.output


def test_a_config_of_another_model_is_refused(tmp_path, model_dir):
    other = tmp_path / "other"
    write_weights(other, PRESETS["tiny"], VOCAB, seed=0)
    res = run_torch(tmp_path / "out", model_dir, "--config", str(other / "config.json"),
                    "--org", "s2", "--budget", "16MiB")
    assert res.exit_code != 0
    assert "does not describe the served model" in res.output


def test_multiturn_sessions_continue_with_the_tokens_the_engine_generated(model_dir, monkeypatch):
    """A later turn's prompt is the previous prompt + the tokens this engine
    generated for it + the new message, and it reuses the history it shares."""
    import adapters.torch.engine as te
    import workloads.multiturn.session as session
    from harness.config import RunConfig
    from harness.run_setup import validate
    from harness.run_workload import build_run_workload
    seen = []

    class Recording(session.SessionLoop):
        def next_turn(self, finished, generated_token_ids, finish_s, generated_text=""):
            nxt = super().next_turn(finished, generated_token_ids, finish_s, generated_text)
            seen.append((finished, list(generated_token_ids), nxt))
            return nxt

    # the engine loop imports it when it serves sessions
    monkeypatch.setattr(session, "SessionLoop", Recording)
    config = RunConfig(engine="torch", org="s2", budget="b12", model=str(model_dir),
                       config_path=str(model_dir / "config.json"), workload_kind="multiturn",
                       requests=2, rate=50.0, max_turns=2, think_time_s=0.05, max_output=6,
                       max_model_len=2048, max_history=1500, mean_input=700,
                       seed=17)   # session 1: a 724-token first turn, then a second turn
    engine = te.TorchEngine()
    run = engine.run(build_run_workload(config), validate(config))
    later = [(f, gen, nxt) for f, gen, nxt in seen if nxt is not None]
    assert later, "no session had a second turn"
    for finished, generated, nxt in later:
        assert generated == engine.outputs[finished.request_id] and len(generated) > 0
        head = np.concatenate([np.asarray(finished.prompt_token_ids), generated])
        assert np.array_equal(np.asarray(nxt.prompt_token_ids)[:len(head)], head)
    records = {r.request_id: r for r in run.requests}
    assert all(r.status == "finished" for r in records.values())
    assert any(records[nxt.request_id].reused_tokens > 0 for _, _, nxt in later)
