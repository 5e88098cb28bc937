"""The state kernels on a GPU: per-layer timing, the engine's decode step, a cost profile.

``bash scripts/kernel_check.sh OUT`` (or ``python -m hbench.kernel_check OUT``)
writes ``OUT/kernel_check.md`` (the tables) and ``OUT/kernel_check.json``
(every number), saved after each part:

1. kernels: per layer at Falcon-H1-7B's geometry in bf16 (24 heads x 128 x
   256 SSM state, 3,584 x 3 conv state), batch 1 to 256, the paged SSM and
   conv updates on S0, S1, S2 and D0 layouts (pages in random order,
   `adapters.torch.kernels.bench`) against the same kernels on contiguous
   state; achieved bytes per second (state read + written) against a
   measured device copy. Targets: paged within 10 % of contiguous for S1 and
   S2 at batch >= 32; the SSM update at >= 70 % of the copy bandwidth.
2. engine: the torch engine serving `hbench.device_check.FULL_RUN` at b83
   (random bf16 weights of the 7B geometry) per organization, decode through
   the torch path (before) and through the kernels (after): step times.
3. calibration: `hbench.device_check.calibration` (``hbench calibrate
   --engine torch`` on the device, kernels on), the profile written to OUT.

``--dry-run`` runs parts 1 and 2 on CPU through Triton's interpreter at toy
sizes (a 4-head geometry, batch 1 and 2, the tiny model, one organization
served, one request) and skips 3: it proves the check runs, not how fast anything is.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
ORGS = ("s0", "s1", "s2", "d0")
#: a toy Falcon-H1 for --dry-run: 4 SSM heads x 16 x 32, conv (64 + 64) x 3
TOY = {"model_type": "falcon_h1", "hidden_size": 64, "intermediate_size": 128,
       "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
       "head_dim": 32, "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_ssm": 64,
       "mamba_d_state": 32, "mamba_n_groups": 1, "mamba_d_conv": 4, "vocab_size": 512,
       "max_position_embeddings": 4096, "tie_word_embeddings": False}


def kernel_dims(geom) -> dict:
    """The state kernels' sizes of a geometry's layer."""
    H, P, N, G = geom.ssm_n_heads, geom.ssm_head_dim, geom.ssm_d_state, geom.ssm_n_groups
    return {"H": H, "P": P, "N": N, "G": G, "C": H * P + 2 * G * N, "W": geom.ssm_d_conv - 1}


def kernels(device: str, dry_run: bool, log) -> dict:
    """Part 1 (see the module docstring): rows per (org, batch) and the copy bandwidth."""
    from adapters.torch.kernels.bench import copy_bandwidth, time_layer
    from harness.model_configs import from_config, preset
    from harness.orgs import layout_for

    geom = from_config(TOY, name="toy") if dry_run else preset("falcon-h1-7b")
    dims = kernel_dims(geom)
    bw = copy_bandwidth(device, 1 << 20 if dry_run else 1 << 30, 1 if dry_run else 10)
    log(f"copy bandwidth {bw / 1e9:.1f} GB/s; dims {dims}")
    rows = []
    for org in ORGS:
        layout = layout_for(org, geom)
        for b in (1, 2) if dry_run else BATCHES:
            t = time_layer(layout, dims, b, device, reps=1 if dry_run else 20)
            row = {"org": org, "batch": b, **t,
                   "paged_over_dense": (t["ssm_paged_s"] + t["conv_paged_s"])
                   / (t["ssm_dense_s"] + t["conv_dense_s"]),
                   "ssm_paged_bytes_s": t["ssm_bytes"] / t["ssm_paged_s"],
                   "ssm_dense_bytes_s": t["ssm_bytes"] / t["ssm_dense_s"]}
            row["ssm_paged_of_copy"] = row["ssm_paged_bytes_s"] / bw
            rows.append(row)
            log(f"{org} b={b}: ssm {1e6 * t['ssm_paged_s']:.1f}/{1e6 * t['ssm_dense_s']:.1f} us "
                f"paged/dense, conv {1e6 * t['conv_paged_s']:.1f}/{1e6 * t['conv_dense_s']:.1f}")
    return {"geometry": geom.name, "dims": dims, "copy_bytes_s": bw, "rows": rows}


def engine(device: str, dry_run: bool, out: Path, log) -> dict:
    """Part 2: decode step times per organization, torch path then kernels."""
    import dataclasses

    from adapters.torch.continuation import all_at_once, verify_config
    from adapters.torch.engine import TorchEngine
    from harness.config import RunConfig
    from harness.run_setup import validate
    from hbench.device_check import FULL_RUN, random_7b, tiny_model, workload_for

    if dry_run:
        model, model_dir = None, tiny_model(out)
        configs = {"s2": dataclasses.replace(verify_config("s2", str(model_dir), budget="b12"),
                                             requests=1, max_output=2, mean_input=600,
                                             contexts=1, token_budget=4096)}
    else:
        model, model_dir = random_7b(out, device)
        configs = {org: RunConfig(engine="torch", org=org, model=str(model_dir),
                                  config_path=str(model_dir / "config.json"), device=device,
                                  **FULL_RUN) for org in ORGS}
    rows = {}
    for org, config in configs.items():
        setup, workload = validate(config), all_at_once(workload_for(config))
        for label, use in (("before", False), ("after", True)):
            eng = TorchEngine(model=model, kernels=use)
            t = time.perf_counter()
            run = eng.run(workload, setup)
            decode = sorted(r["duration_s"] for r in run.steps if r["prefill_tokens"] == 0)
            rows[f"{org} {label}"] = {
                "state_kernels": run.engine_info["state_kernels"], "steps": len(run.steps),
                "decode_steps": len(decode),
                "decode_p50_ms": 1e3 * decode[len(decode) // 2] if decode else None,
                "decode_max_ms": 1e3 * decode[-1] if decode else None,
                "wall_s": round(time.perf_counter() - t, 2)}
            log(f"engine {org} {label}: {rows[f'{org} {label}']}")
    return {"model": str(model_dir), "runs": rows, "_model": model}


def table(report: dict) -> str:
    k = report["kernels"]
    md = [f"# state kernels ({report['gpu'] or report['device']}"
          f"{', dry run: toy sizes, interpreter' if report['dry_run'] else ''})", "",
          f"Per layer, {k['geometry']} {k['dims']}, bf16; copy bandwidth "
          f"{k['copy_bytes_s'] / 1e9:.1f} GB/s.", "",
          "| org | batch | SSM paged us | SSM dense us | conv paged us | conv dense us | "
          "paged / dense | SSM paged GB/s | of copy |", "|---" * 9 + "|"]
    for r in k["rows"]:
        md.append(f"| {r['org']} | {r['batch']} | {1e6 * r['ssm_paged_s']:.1f} | "
                  f"{1e6 * r['ssm_dense_s']:.1f} | {1e6 * r['conv_paged_s']:.1f} | "
                  f"{1e6 * r['conv_dense_s']:.1f} | {r['paged_over_dense']:.3f} | "
                  f"{r['ssm_paged_bytes_s'] / 1e9:.1f} | {100 * r['ssm_paged_of_copy']:.0f}% |")
    if "engine" in report:
        md += ["", "| engine run | kernels | steps | decode steps | decode p50 ms | "
               "decode max ms | wall s |", "|---" * 7 + "|"]
        for name, r in report["engine"]["runs"].items():
            p50 = "-" if r["decode_p50_ms"] is None else f"{r['decode_p50_ms']:.1f}"
            mx = "-" if r["decode_max_ms"] is None else f"{r['decode_max_ms']:.1f}"
            md.append(f"| {name} | {r['state_kernels']} | {r['steps']} | {r['decode_steps']} | "
                      f"{p50} | {mx} | {r['wall_s']} |")
    if "calibration" in report:
        md += ["", f"calibration: {json.dumps(report['calibration'], default=str)}"]
    return "\n".join(md) + "\n"


def main(out: str | Path, device: str = "cuda", dry_run: bool = False) -> dict:
    import torch

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    logf = (out / "kernel_check.log").open("a")

    def log(msg: str) -> None:
        logf.write(f"{time.strftime('%H:%M:%S')} {msg}\n")
        logf.flush()

    report = {"device": device, "dry_run": dry_run, "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(device) if device.startswith("cuda") else None}

    def save() -> None:
        plain = {k: v for k, v in report.items()}
        if "engine" in plain:
            plain["engine"] = {k: v for k, v in plain["engine"].items() if k != "_model"}
        (out / "kernel_check.json").write_text(json.dumps(plain, indent=2, default=str) + "\n")
        (out / "kernel_check.md").write_text(table(plain))

    import triton
    report["triton"] = triton.__version__
    report["kernels"] = kernels(device, dry_run, log)
    save()
    report["engine"] = engine(device, dry_run, out, log)
    save()
    if not dry_run:
        from hbench.device_check import calibration

        model = report["engine"]["_model"]
        report["calibration"] = calibration(model, Path(report["engine"]["model"]), device, out,
                                            False)
        save()
    logf.close()
    return report


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="folder for kernel_check.md / .json / .log")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU, Triton's interpreter, toy sizes, no calibration")
    args = ap.parse_args()
    main(args.out, "cpu" if args.dry_run else args.device, args.dry_run)
    print((Path(args.out) / "kernel_check.md").read_text())
