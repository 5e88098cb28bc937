"""Calibration: fitting rates to step times, cost profiles, and ``--gpu profile.json``.

The fit is checked against step times made by the cost model itself from
known additive rates (so the right answer is known exactly), plus outliers.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from adapters.calibration.design import design
from adapters.calibration.fit import Sample, fit_rates
from adapters.sim.cost import CostModel, Rates
from adapters.sim.hardware import get_hardware
from adapters.sim.profile import CostProfile, load_profile, save_profile
from common.errors import HbenchError
from harness.config import RunConfig
from harness.engine.shape import StepShape
from harness.model_configs import preset
from harness.results import list_runs, read_run
from harness.run_address import cell_id
from hbench.cli import cli

TRUE = Rates(mem_bytes_s=2e9, state_bytes_s=5e8, gemm_flops_s=3e10, attn_flops_s=1e10,
             scan_flops_s=4e9, step_overhead_s=0.002, request_overhead_s=0.0005, combine="sum")


@pytest.fixture(scope="module")
def geom():
    return preset("falcon-h1-7b")


def shapes() -> list[tuple[str, StepShape]]:
    """Varied shapes: decode batches x contexts, prefill chunks x contexts, copies."""
    out = []
    for b in (1, 2, 4, 8, 16, 32):
        for c in (128, 512, 2048, 4096):
            out.append(("decode", StepShape.from_requests(decode_contexts=(c,) * b)))
    for n in (64, 256, 1024, 2048):
        for c in (0, 512, 3072):
            out.append(("prefill", StepShape.from_requests(prefill_chunks=((n, c),))))
    for k in (1, 2, 4):
        out.append(("copy", StepShape.from_requests(prefill_chunks=((512, 512),),
                                                    decode_contexts=(700,) * k,
                                                    checkpoint_copies=k, checkpoint_loads=k)))
    return out


def samples_from(model: CostModel, held_every: int = 5) -> list[Sample]:
    return [Sample(cls, (sh,), model.step(sh).total_s, held_out=i % held_every == 0)
            for i, (cls, sh) in enumerate(shapes())]


def test_additive_rates_sum_memory_compute_and_overheads(geom):
    m = CostModel(geom, TRUE)
    sh = StepShape.from_requests(prefill_chunks=((256, 128),), decode_contexts=(1000, 2000))
    c, w = m.step(sh), m.work(sh)
    assert c.total_s == pytest.approx(c.memory_s + c.compute_s + 0.002 + 3 * 0.0005)
    assert c.kv_s == pytest.approx(w.kv_bytes / 2e9)
    assert c.state_io_s == pytest.approx(w.state_bytes / 5e8)
    assert c.compute_s == pytest.approx(w.gemm_flops / 3e10 + w.attn_flops / 1e10
                                        + w.scan_flops / 4e9)


def test_the_fit_recovers_known_rates_and_predicts_held_out_shapes(geom):
    fit = fit_rates(geom, samples_from(CostModel(geom, TRUE)), datasheet=get_hardware("h200"))
    for name in ("mem_bytes_s", "state_bytes_s", "gemm_flops_s", "attn_flops_s",
                 "scan_flops_s", "step_overhead_s", "request_overhead_s"):
        assert getattr(fit.rates, name) == pytest.approx(getattr(TRUE, name), rel=1e-4), name
    assert fit.held_out_error < 1e-6 and fit.dropped == 0
    assert fit.residuals["held_out"]["decode"]["n"] > 0
    # the datasheet roofline is far off these (made-up, slow) rates
    assert fit.baseline["held_out"]["all"]["median_abs_rel_error"] > 0.5


def test_outlier_steps_are_dropped_before_the_final_fit(geom):
    samples = samples_from(CostModel(geom, TRUE))
    train = [i for i, s in enumerate(samples) if not s.held_out]
    for i in train[3:5]:          # two steps that shared the machine with someone else
        samples[i] = replace(samples[i], seconds=samples[i].seconds * 6)
    fit = fit_rates(geom, samples)
    assert fit.dropped == 2
    assert fit.rates.gemm_flops_s == pytest.approx(TRUE.gemm_flops_s, rel=1e-3)
    assert fit.held_out_error < 1e-3


def test_a_fit_needs_enough_samples(geom):
    few = samples_from(CostModel(geom, TRUE))[:6]
    with pytest.raises(HbenchError, match="training samples"):
        fit_rates(geom, few)


def test_work_the_data_cannot_see_is_reported_unresolved(geom):
    """Decode-only data: prefill-only work (scan of chunks) cannot be told apart."""
    decode = [Sample("decode", (sh,), CostModel(geom, TRUE).step(sh).total_s)
              for cls, sh in shapes() if cls == "decode"]
    fit = fit_rates(geom, decode)
    assert not all(c["resolved"] for c in fit.coefficients.values())


def test_design_holds_out_cells_and_respects_the_grid():
    cells = design(quick=True, min_chunk=1792)
    assert any(c.held_out for c in cells) and any(not c.held_out for c in cells)
    assert all(c.chunk >= 1792 for c in cells)
    assert all(c.prompt + c.output <= 4096 for c in cells)
    with pytest.raises(HbenchError):
        design(quick=True, max_context=300)


def profile(tmp_path, rates=TRUE, name="p.json"):
    return save_profile(CostProfile(name="test", rates=rates, engine="torch", device="cpu",
                                    model="falcon-h1-7b", mem_bytes=None), tmp_path / name)


def test_profile_round_trip_and_malformed_files(tmp_path):
    p = load_profile(profile(tmp_path))
    assert p.rates == TRUE and p.sha256 and p.describe()["rates"]["combine"] == "sum"
    cases = {"notjson.json": "{", "kind.json": json.dumps({"kind": "x"}),
             "rates.json": json.dumps({"kind": "hbench-cost-profile", "schema": 1,
                                       "rates": {"mem_bytes_s": -1}})}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(HbenchError, match=name):
            load_profile(tmp_path / name)
    with pytest.raises(HbenchError, match="cannot read"):
        load_profile(tmp_path / "missing.json")


RUN = ["run", "--engine", "sim", "--requests", "12", "--rate", "4", "--mean-input", "600",
       "--max-output", "8", "--contexts", "2", "--max-model-len", "2048", "--budget", "b8"]


def test_run_with_a_profile_records_it_and_changes_step_times(tmp_path):
    path = profile(tmp_path)
    slow = replace(TRUE, step_overhead_s=0.2)
    slow_path = profile(tmp_path, slow, "slow.json")
    for gpu, out in ((str(path), "a"), (str(slow_path), "b")):
        res = CliRunner().invoke(cli, [*RUN, "--gpu", gpu, "--out", str(tmp_path / out)])
        assert res.exit_code == 0, res.output
    a, b = (read_run(list_runs(tmp_path / d)[0]) for d in ("a", "b"))
    assert a.manifest["engine_info"]["cost_profile"]["sha256"] == load_profile(path).sha256
    # every step is 0.198 s longer under the slow profile
    da, db = a.table("steps")["duration_s"], b.table("steps")["duration_s"]
    assert len(da) and (db.median() - da.median()) > 0.15


def test_a_bad_profile_is_refused_before_any_work(tmp_path):
    (tmp_path / "bad.json").write_text("[]")
    res = CliRunner().invoke(cli, [*RUN, "--gpu", str(tmp_path / "bad.json"),
                                   "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "Error: cost profile" in res.output
    assert not (tmp_path / "o").exists() or not list_runs(tmp_path / "o")


def test_editing_the_profile_gives_a_new_sweep_cell(tmp_path):
    path = profile(tmp_path)
    cfg = RunConfig(gpu=str(path))
    before = cell_id(cfg, "w", "v")
    profile(tmp_path, replace(TRUE, step_overhead_s=0.01))
    assert cell_id(cfg, "w", "v") != before
    assert cell_id(RunConfig(), "w", "v") == cell_id(RunConfig(), "w", "v")


# ---- end to end on the torch engine (tiny proportional model) -------------------------

torch_needed = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory, model_dir):
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("calibrate")
    res = CliRunner().invoke(cli, ["calibrate", "--engine", "torch", "--model", str(model_dir),
                                   "--quick", "--repeats", "2", "--max-error", "0.5",
                                   "-o", str(out / "profile.json"),
                                   "--samples", str(out / "samples.csv")])
    return res, out


@pytest.mark.slow
@torch_needed
def test_calibrate_torch_writes_a_profile_better_than_the_datasheet(calibrated):
    res, out = calibrated
    assert res.exit_code == 0, res.output
    p = load_profile(out / "profile.json")
    fit = p.fit
    held = fit["held_out_median_abs_rel_error"]
    assert held <= 0.5          # quick design on a shared CPU: 1-31 % measured
    assert held < fit["datasheet"]["held_out"]["all"]["median_abs_rel_error"]
    assert p.engine == "torch" and p.device == "cpu" and p.rates.combine == "sum"
    assert "held_out" in res.output and "datasheet" in res.output
    rows = (out / "samples.csv").read_text().splitlines()
    assert len(rows) - 1 == fit["samples"]


@pytest.mark.slow
@torch_needed
def test_calibrate_refuses_a_fit_worse_than_the_bound(tmp_path, model_dir):
    res = CliRunner().invoke(cli, ["calibrate", "--engine", "torch", "--model", str(model_dir),
                                   "--quick", "--repeats", "1", "--max-error", "1e-9",
                                   "-o", str(tmp_path / "p.json")])
    assert res.exit_code == 1 and "above --max-error" in res.output
    assert not (tmp_path / "p.json").exists()


@pytest.mark.slow
@torch_needed
def test_fidelity_ledger_has_every_metric_for_every_cell(tmp_path, model_dir, calibrated):
    from analysis.fidelity import METRICS

    _, cal = calibrated
    out = tmp_path / "fid"
    args = ["fidelity", "--engine", "torch", "--model", str(model_dir), "--org", "s0,s1,s2,d0",
            "--budget", "b8", "--seeds", "0", "--requests", "10", "--rate", "6",
            "--profile", str(cal / "profile.json"), "--out", str(out)]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    import pandas as pd

    table = pd.read_csv(out / "ledger.csv")
    cells = table[["org", "budget", "seed"]].drop_duplicates()
    assert len(cells) == 4
    for org in ("s0", "s1", "s2", "d0"):
        got = set(table[table["org"] == org]["metric"])
        assert got == {m.name for m in METRICS}, org
    assert table["real"].notna().all() and table["sim"].notna().all()
    doc = json.loads((out / "fidelity.json").read_text())
    assert {m["metric"] for m in doc["metrics"]} == {m.name for m in METRICS}
    assert (out / "fidelity.png").is_file()
    runs = list_runs(out / "runs")
    assert sorted(read_run(r).engine for r in runs) == ["sim"] * 4 + ["torch"] * 4
    # both sides of a cell served the same workload
    by_cell = {}
    for r in map(read_run, runs):
        by_cell.setdefault(r.config["org"], set()).add(r.workload_hash)
    assert all(len(h) == 1 for h in by_cell.values())
    # a second call resumes: nothing is run twice
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 0, again.output
    assert len(list_runs(out / "runs")) == 8
    only = CliRunner().invoke(cli, ["fidelity", "--engine", "torch", "--model", str(model_dir),
                                    "--out", str(out), "--analyze-only"])
    assert only.exit_code == 0 and "throughput_span_tok_s" in only.output


def test_fidelity_ledger_arithmetic():
    from analysis.fidelity import METRICS, _agreement

    ratio_m = next(m for m in METRICS if m.name == "ttft_p50_s")
    count_m = next(m for m in METRICS if m.name == "preemptions")
    assert _agreement(ratio_m, 2.0, 3.0) == (1.5, 1.0, pytest.approx(0.5))
    assert _agreement(count_m, 4.0, 1.0)[2] == 3.0
    assert _agreement(ratio_m, 0.0, 0.0)[0] == 1.0
    assert np.isinf(_agreement(ratio_m, 0.0, 1.0)[0])


# ---- the vLLM driver's inference from client-side times (no server needed) -------------

def test_vllm_itl_samples_average_stretches_once_every_request_decodes():
    from adapters.calibration.design import Cell
    from adapters.vllm_calibrate import decode_samples
    from harness.records import RequestRecord

    cell = Cell("decode b2 c512", "decode", 2, 512, 9, 512)
    # request 1's first token at 1.0; request 0 decoded alone before (mixed steps).
    # From 1.0 on both decode every 0.1 s, but request 0's tokens come in bursts.
    a = RequestRecord(0, 0.0, 512, 9, token_times=[0.8, 0.9, 1.0, 1.15, 1.15001, 1.3, 1.4, 1.5,
                                                   1.6])
    b = RequestRecord(1, 0.0, 512, 9, token_times=[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8])
    samples = decode_samples(cell, [a, b], grid=512, segments=2)
    assert [s.steps[0].decode_requests for s in samples] == [2, 2]
    # the window starts at index 2 (both decoding), ends at index 8; a burst inside a
    # stretch does not matter, its mean gap is one step
    assert [s.seconds for s in samples] == pytest.approx([0.1, 0.1], abs=1e-4)
    assert samples[0].steps[0].decode_context_tokens == 2 * (512 + 3)
    with pytest.raises(HbenchError, match="did not finish"):
        decode_samples(cell, [a], grid=512)


def test_vllm_ttft_spans_the_prefill_chunks_and_a_client_term():
    from adapters.calibration.design import Cell
    from adapters.vllm_calibrate import prefill_steps, ttft_sample
    from harness.records import RequestRecord

    steps = prefill_steps(1100, 256, grid=512)
    assert [s.prefill_tokens for s in steps] == [256, 256, 256, 256, 76]
    assert [s.prefill_context_tokens for s in steps] == [0, 256, 512, 768, 1024]
    assert sum(s.checkpoint_copies for s in steps) == 2          # boundaries 512 and 1024
    cell = Cell("prefill 1100 by 256", "prefill", 1, 1100, 2, 256)
    r = RequestRecord(0, 0.0, 1100, 2, dispatch_s=0.25, first_token_s=0.75,
                      token_times=[0.75, 0.8])
    s = ttft_sample(cell, [r], 256, 512)
    assert s.seconds == pytest.approx(0.5) and s.nuisance == {"client_s": 1.0}
    assert len(s.steps) == 5 and s.shape_class == "ttft"


def test_a_client_term_is_fitted_apart_from_the_rates(geom):
    """TTFT samples carry a constant client round trip the profile must not absorb."""
    m = CostModel(geom, TRUE)
    samples = samples_from(m)
    for n in (1024, 2048, 3072, 4096):
        steps = tuple(StepShape.from_requests(prefill_chunks=((256, c),))
                      for c in range(0, n, 256))
        samples.append(Sample("ttft", steps, sum(m.step(s).total_s for s in steps) + 0.05,
                              nuisance={"client_s": 1.0}))
    fit = fit_rates(geom, samples)
    assert fit.nuisance["client_s"] == pytest.approx(0.05, rel=1e-3)
    assert fit.rates.step_overhead_s == pytest.approx(TRUE.step_overhead_s, rel=1e-3)


def test_repeats_keep_each_samples_fastest_time_and_never_mix_different_schedules():
    from adapters.calibration.design import fastest

    a = StepShape.from_requests(decode_contexts=(100,))
    b = StepShape.from_requests(decode_contexts=(100, 200))

    def run(*pairs):
        return [Sample("decode", (sh,), t) for sh, t in pairs]

    first = fastest(None, run((a, 0.3), (b, 0.2)))
    assert [s.seconds for s in fastest(first, run((a, 0.1), (b, 0.5)))] == [0.1, 0.2]
    # a repeat whose steps differ: the faster whole repeat wins, never a mixture
    other = run((b, 0.1), (a, 0.1))
    assert fastest(first, other) == other
    assert fastest(first, run((b, 0.9))) == first


@pytest.mark.parametrize("args, message", [
    (["calibrate", "--model", "{tmp}/none", "-o", "{tmp}/p.json"], "no config.json there"),
    (["fidelity", "--model", "{model}", "--profile", "{tmp}/none.json", "--org", "s0",
      "--seeds", "0", "--requests", "4", "--out", "{tmp}/out"], "cost profile"),
    (["fidelity", "--model", "{model}", "--org", "s9", "--out", "{tmp}/out"],
     "unknown organization 's9'"),
    (["fidelity", "--model", "{model}", "--out", "{tmp}/out", "--analyze-only"],
     "no results directory"),
])
def test_calibrate_and_fidelity_refuse_bad_input_before_any_work(tmp_path, model_dir, args,
                                                                  message):
    argv = [a.format(tmp=tmp_path, model=model_dir) for a in args]
    res = CliRunner().invoke(cli, argv)
    assert res.exit_code == 2 and res.output.startswith("Error: ") and message in res.output
    assert not (tmp_path / "out").exists() and not (tmp_path / "p.json").exists()


def test_vllm_a_decode_window_read_in_one_burst_gives_no_sample():
    """A loaded machine: the stream stalls after the first tokens, then the whole
    window arrives within a millisecond, far below the server's own
    inter-token latency. That window says nothing about a step (its gaps are
    the client's parsing), so the request gives no sample, and a cell of such
    requests none at all: the driver times it again."""
    from adapters.calibration.design import Cell
    from adapters.vllm_calibrate import decode_samples, retimed
    from harness.records import RequestRecord

    cell = Cell("decode b2 c512", "decode", 2, 512, 12, 512)
    steady = [1.0 + 0.1 * k for k in range(12)]
    # b's first token comes last (1.3): the window starts there, at a's fourth token;
    # b's stream stalls after its third token, then the rest arrives at once
    burst = [1.3, 1.4, 1.5] + [2.5 + 1e-5 * k for k in range(9)]
    a, b = (RequestRecord(i, 0.0, 512, 12, token_times=t) for i, t in enumerate((steady, burst)))
    # unscreened, b's burst drags the median of the two to half a step
    assert decode_samples(cell, [a, b], grid=512, segments=2)[0].seconds < 0.06
    samples = decode_samples(cell, [a, b], grid=512, segments=2, server_itl=0.1)
    assert [s.seconds for s in samples] == pytest.approx([0.1, 0.1])    # a's stretches only
    stalled = RequestRecord(0, 0.0, 512, 12, token_times=steady[:3] + [2.4 + 1e-5 * k
                                                                        for k in range(9)])
    assert decode_samples(cell, [stalled, b], grid=512, segments=2, server_itl=0.1) == []

    answers = iter([[], [], samples, []])
    assert retimed(lambda _: next(answers), cell, retimes=2) == samples     # third time lucky
    answers = iter([[], [], [], samples])
    assert retimed(lambda _: next(answers), cell, retimes=2) == []          # then it gives up


def test_the_fidelity_figure_says_which_metric_the_real_engine_does_not_observe():
    """A metric with no real value in any cell (vLLM in process cannot tell a
    Mamba block's conv state from its SSM state) gets a panel that says so,
    not empty axes."""
    import pandas as pd

    from analysis.fidelity import fidelity_figure

    rows = [{"metric": metric, "org": "s0", "budget": "b83", "seed": seed,
             "real": (math.nan if metric == "peak_mem_conv_bytes" else 100.0 + seed),
             "sim": 101.0 + seed}
            for metric in ("throughput_ledger_tok_s", "peak_mem_conv_bytes") for seed in (0, 1)]
    fig = fidelity_figure(pd.DataFrame(rows))
    panels = {ax.get_title(): ax for ax in fig.axes}
    conv, tput = panels["peak_mem_conv_bytes"], panels["throughput_ledger_tok_s"]
    assert not conv.axison and [t.get_text() for t in conv.texts] == [
        "not observed\nby the real engine"]
    assert tput.axison and len(tput.collections) >= 1 and not tput.texts
