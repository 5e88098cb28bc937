"""The torch engine's checks on a GPU machine (`scripts/device_check.sh`).

Three parts, each written to ``OUT`` as it finishes (``device_check.json``
and ``device_check.md``):

1. parity: hbench's Falcon-H1 against transformers' ``FalconH1ForCausalLM``
   on the device, float32, the proportional tiny model; the prompt is
   prefilled in chunks with the state handed through pages between them.
2. continuation: `adapters.torch.continuation` per organization on the
   device in float32 (adoptions, preemptions, poisoned pages; every request
   against a cold run).
3. serving: one short open-loop run per organization. Full size: Falcon-H1-7B's
   geometry (44 layers, the `falcon-h1-7b` preset's config) with random bf16
   weights made on the device, at b83; ``small``: the tiny model on CPU in
   float32. The table has step times, TTFT/ITL and peak memory.
4. calibration: ``hbench calibrate --engine torch`` on the same model and
   device (`hbench.calibration`), written as a cost profile
   (``OUT/profile-<device>.json``) that ``hbench run --gpu`` accepts, with its
   fitted rates beside the datasheet preset's (``h200`` on a GPU) and the
   fit's held-out error next to the preset's.

Budget of the full-size run at b83 (per layer 83 x 1557 KiB = 126.2 MiB; x 44
layers = 5.42 GiB of pools in bf16) plus 7.6e9 bf16 parameters (14.2 GiB;
loading makes a float32 copy once, ~28 GiB transient): well inside one
80-141 GiB GPU.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from harness.config import ORG_NAMES

ORGS = ORG_NAMES   # the organizations checked: every one the torch engine builds
#: Serving runs: a short workload at the study's budget (full size) or at the
#: tiny working point (small). Same shape: 8 requests, shared prefixes.
FULL_RUN = dict(budget="b83", requests=8, rate=4.0, mean_input=1500, max_output=16,
                contexts=2, max_model_len=8192)
SMALL_RUN = dict(budget="b12", requests=6, rate=50.0, mean_input=700, max_output=6,
                 contexts=2, max_model_len=4096)


def tiny_model(out: Path) -> Path:
    from adapters.tiny_model import PRESETS, write_weights

    d = out / "tiny-proportional"
    write_weights(d, PRESETS["proportional"], 512, seed=0)
    return d


def parity(model_dir: Path, device: str) -> dict:
    """Max |ours - transformers| / max |transformers| over a 1100-token prompt."""
    import torch

    try:
        from transformers import FalconH1ForCausalLM
    except ImportError:
        return {"skipped": "transformers is not installed"}
    from adapters.torch.model import FalconH1
    from adapters.torch.paging import kv_view

    ref = FalconH1ForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32)
    ref = ref.to(device).eval()
    ours = FalconH1.from_dir(model_dir).to(device, torch.float32)
    prompt = torch.arange(1100, device=device) % ours.cfg.vocab_size
    with torch.no_grad():
        want = ref(prompt[None]).logits[0]
    sh = ours.shapes
    pool = torch.zeros(3, sh.n_layers, sh.kv_block_elems(512), device=device)
    kv = kv_view(pool, sh, 512)
    ssm, conv = (t.to(device) for t in sh.zero_state())
    got = [ours.prefill_chunk(prompt[a:b], a, kv, [0, 1, 2], ssm, conv)
           for a, b in ((0, 300), (300, 812), (812, 1100))]
    got = torch.cat(got)
    rel = float((got - want).abs().max() / want.abs().max())
    return {"max_rel_logit_diff": rel, "ok": rel <= 1e-4}


def workload_for(config):
    """The run's workload, through the folder ``HBENCH_WORKLOAD_CACHE`` names if
    set: loaded from it when there, else built and saved into it. A GPU machine
    without the ShareGPT package is handed the workloads this way: run the
    check here with ``PREPARE=1`` (`prepare`) to fill the folder, carry
    it, and point the variable at it there."""
    import hashlib
    import os

    from harness.run_workload import build_run_workload
    from workloads.io import load_workload, save_workload
    from workloads.spec import WorkloadSpec

    cache = os.environ.get("HBENCH_WORKLOAD_CACHE")
    if not cache:
        return build_run_workload(config)
    key = hashlib.sha256(repr(WorkloadSpec.from_config(config)).encode()).hexdigest()[:16]
    path = Path(cache) / f"{key}.parquet"
    if path.exists():
        return load_workload(path)
    workload = build_run_workload(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_workload(workload, path)
    return workload


def continuation(model_dir: Path, device: str) -> dict:
    from adapters.torch.continuation import verify_config, verify_continuation

    out = {}
    for org in ORGS:
        t = time.perf_counter()
        config = verify_config(org, str(model_dir), device=device)
        rep = verify_continuation(config, workload_for(config))
        out[org] = {"identical": rep.all_identical, "requests": len(rep.checks),
                    "max_rel_logit_diff": max(c.max_rel_logit_diff for c in rep.checks),
                    **rep.stats, "wall_s": round(time.perf_counter() - t, 2)}
    return out


def random_7b(out: Path, device: str, seed: int = 0):
    """Falcon-H1-7B's shapes with random bf16 weights made on ``device``; writes
    its config.json to ``out`` (the run's geometry) and returns (model, dir)."""
    import torch

    from adapters.tiny_model import TinyFalconH1
    from adapters.torch.config import FalconH1Config
    from adapters.torch.model import FalconH1
    from harness.model_configs import PRESETS

    p = PRESETS["falcon-h1-7b"]
    spec = TinyFalconH1(
        hidden_size=p["hidden_size"], intermediate_size=p["intermediate_size"],
        num_hidden_layers=p["num_hidden_layers"], num_attention_heads=p["num_attention_heads"],
        num_key_value_heads=p["num_key_value_heads"], head_dim=p["head_dim"],
        mamba_d_ssm=p["mamba_d_ssm"], mamba_n_heads=p["mamba_n_heads"],
        mamba_d_state=p["mamba_d_state"], mamba_chunk_size=256,
        max_position_embeddings=p["max_position_embeddings"])
    cfg_dict = spec.hf_config(p["vocab_size"])
    d = out / "falcon-h1-7b-random"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg_dict, indent=2) + "\n")
    gen = torch.Generator(device=device).manual_seed(seed)
    weights = {}
    for name, shape in spec.param_shapes(p["vocab_size"]).items():
        if name.endswith("layernorm.weight") or name.endswith(".D"):
            w = torch.ones(shape, device=device, dtype=torch.bfloat16)
        elif name.endswith("A_log"):
            w = torch.log(torch.arange(1, shape[0] + 1, device=device, dtype=torch.float32))
        elif name.endswith("dt_bias") or name.endswith("conv1d.bias"):
            w = (torch.rand(shape, generator=gen, device=device) - 0.5) * 0.2
        else:
            fan_in = 1
            for n in shape[1:]:
                fan_in *= n
            w = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)
            w = w * fan_in ** -0.5
        weights[name] = w.to(torch.bfloat16)
    model = FalconH1(FalconH1Config.from_dict(cfg_dict), weights)
    del weights
    return model.to(device, torch.bfloat16), d


def serve(model, model_dir: Path, device: str, out: Path, small: bool) -> dict:
    """One short run per organization; the results directories go under ``out/runs``."""
    from adapters.torch.engine import TorchEngine
    from harness.config import RunConfig
    from harness.metrics import summarize
    from harness.run_setup import validate

    rows = {}
    for org in ORGS:
        config = RunConfig(engine="torch", org=org, model=str(model_dir),
                           config_path=str(model_dir / "config.json"), device=device,
                           **(SMALL_RUN if small else FULL_RUN))
        setup = validate(config)
        workload = workload_for(config)
        engine = TorchEngine(model=model)
        t = time.perf_counter()
        run = engine.run(workload, setup)
        wall = time.perf_counter() - t
        s = summarize(run, weights_bytes=0)
        steps = sorted(r["duration_s"] for r in run.steps)
        rows[org] = {
            "budget": config.budget, "wall_s": round(wall, 2), "steps": len(steps),
            "step_p50_ms": 1e3 * steps[len(steps) // 2], "step_max_ms": 1e3 * steps[-1],
            "ttft_p50_ms": 1e3 * s["ttft_p50_s"], "ttft_p99_ms": 1e3 * s["ttft_p99_s"],
            "itl_p50_ms": 1e3 * s["itl_p50_s"], "itl_p99_ms": 1e3 * s["itl_p99_s"],
            "preemptions": s["preemptions"], "finished": s["finished"],
            "pool_gib": run.engine_info["pool_tensor_bytes"] / 2**30,
            "process_peak_gib": run.engine_info["process_peak_bytes"] / 2**30,
            "peak_attention_mib": s["peak_mem_attention_bytes"] / 2**20,
            "peak_ssm_mib": s["peak_mem_ssm_bytes"] / 2**20,
        }
    return rows


def calibration(model, model_dir: Path, device: str, out: Path, small: bool) -> dict:
    """Fit a cost profile on the device (the full design; quick when ``small``) and
    set its rates beside the datasheet preset's."""
    from adapters.sim.cost import Rates
    from adapters.sim.hardware import get_hardware
    from adapters.sim.profile import save_profile
    from harness.config import RunConfig
    from harness.model_configs import geometry_for_run
    from harness.orgs import layout_for
    from hbench.calibration import calibrate

    geom = geometry_for_run(RunConfig(model=str(model_dir),
                                      config_path=str(model_dir / "config.json")))
    datasheet = get_hardware("h200")
    t = time.perf_counter()
    profile, fit, _ = calibrate("torch", model_dir, geom, quick=small, datasheet=datasheet,
                                min_chunk=layout_for("s2", geom).grid_tokens, device=device,
                                model=model, org="s2")
    path = save_profile(profile, out / f"profile-{device.replace(':', '')}.json")
    preset = Rates.roofline(datasheet)
    rates = {name: {"fitted": getattr(profile.rates, name), "datasheet": getattr(preset, name)}
             for name in ("step_overhead_s", "request_overhead_s", "mem_bytes_s",
                          "state_bytes_s", "gemm_flops_s", "attn_flops_s", "scan_flops_s")}
    held = fit.baseline.get("held_out", {}).get("all", {})
    return {"profile": str(path), "samples": fit.samples, "rates": rates,
            "held_out_error": fit.held_out_error,
            "datasheet_held_out_error": held.get("median_abs_rel_error"),
            "residuals": fit.residuals, "wall_s": round(time.perf_counter() - t, 2)}


def table(rows: dict) -> str:
    cols = ["budget", "wall_s", "steps", "step_p50_ms", "step_max_ms", "ttft_p50_ms",
            "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "preemptions", "finished", "pool_gib",
            "process_peak_gib", "peak_attention_mib", "peak_ssm_mib"]
    lines = ["| org | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for org, r in rows.items():
        cells = [f"{r[c]:.2f}" if isinstance(r[c], float) else str(r[c]) for c in cols]
        lines.append(f"| {org} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def prepare(small: bool = False) -> list[Path]:
    """Build every workload the check serves into ``HBENCH_WORKLOAD_CACHE``
    (no model needed: a workload depends only on its `WorkloadSpec`)."""
    import os

    from adapters.torch.continuation import verify_config
    from harness.config import RunConfig

    cache = Path(os.environ["HBENCH_WORKLOAD_CACHE"])
    configs = [verify_config(org, "unused") for org in ORGS]
    configs += [RunConfig(engine="torch", org=org, **(SMALL_RUN if small else FULL_RUN))
                for org in ORGS]
    for config in configs:
        workload_for(config)
    return sorted(cache.glob("*.parquet"))


def main(out: str | Path, device: str = "cuda", small: bool = False) -> dict:
    import torch

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if device == "cpu":
        torch.set_num_threads(1)
    report: dict = {"device": device, "small": small,
                    "gpu": torch.cuda.get_device_name(device) if device.startswith("cuda")
                    else None}

    def save() -> None:
        (out / "device_check.json").write_text(json.dumps(report, indent=2) + "\n")

    tiny = tiny_model(out)
    t = time.perf_counter()
    report["parity"] = parity(tiny, device)
    report["parity"]["wall_s"] = round(time.perf_counter() - t, 2)
    save()
    report["continuation"] = continuation(tiny, device)
    save()
    if small:
        model, model_dir = None, tiny
    else:
        model, model_dir = random_7b(out, device)
    report["serving"] = serve(model, model_dir, device, out, small)
    save()
    report["calibration"] = calibration(model, model_dir, device, out, small)
    save()
    md = [f"# torch engine device check ({report['gpu'] or device})", "",
          f"parity vs transformers: {report['parity']}", "", "continuation (fp32):", ""]
    md += [f"- {org}: {r}" for org, r in report["continuation"].items()]
    md += ["", "serving " + ("(tiny model, fp32)" if small else "(Falcon-H1-7B geometry, "
                             "random bf16 weights)"), "", table(report["serving"]), ""]
    cal = report["calibration"]
    md += [f"calibration ({cal['samples']} steps, {cal['wall_s']} s): held-out median |error| "
           f"{100 * cal['held_out_error']:.1f}% (datasheet h200 "
           f"{100 * (cal['datasheet_held_out_error'] or float('nan')):.1f}%); {cal['profile']}", "",
           "| rate | fitted | datasheet h200 |", "|---|---|---|"]
    md += [f"| {k} | {v['fitted']:.4g} | {v['datasheet']:.4g} |" for k, v in cal["rates"].items()]
    md.append("")
    (out / "device_check.md").write_text("\n".join(md))
    return report


if __name__ == "__main__":
    import os
    import sys

    if os.environ.get("PREPARE") == "1":
        files = prepare(os.environ.get("SMALL", "0") == "1")
        print(f"{len(files)} workloads in {os.environ['HBENCH_WORKLOAD_CACHE']}")
        sys.exit(0)

    rep = main(os.environ.get("OUT", "device-out"), os.environ.get("DEVICE", "cuda"),
               os.environ.get("SMALL", "0") == "1")
    ok = (rep["parity"].get("ok", True)
          and all(r["identical"] for r in rep["continuation"].values())
          and all(r["finished"] == (SMALL_RUN if rep["small"] else FULL_RUN)["requests"]
                  for r in rep["serving"].values()))
    print((Path(os.environ.get("OUT", "device-out")) / "device_check.md").read_text())
    sys.exit(0 if ok else 1)
