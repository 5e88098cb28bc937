"""Dispatch accuracy and CPU cost of the open-loop streaming client.

Replays a constant-rate workload (default 50 req/s for 10 s) against the
local scripted streaming server of tests/test_openai_stream.py, run in a
separate process so this process's CPU time is the client's alone, and
prints the dispatch lag distribution (actual send minus scheduled arrival)
and the client CPU time per streamed token.

    python benchmarks/bench_client.py [--rate 50] [--seconds 10] [--tokens 32]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_openai_stream import Script, ScriptedServer  # noqa: E402

from adapters.openai_stream import Endpoint, run_open_loop  # noqa: E402
from workloads.workload import Workload, WorkloadRequest  # noqa: E402


def serve(port_queue, stop, tokens: int, interval_s: float):
    script = Script(first_delay_s=0.05, interval_s=interval_s, texts=tuple("t" * tokens))
    with ScriptedServer(script) as srv:
        port_queue.put(srv.port)
        stop.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--interval-ms", type=float, default=10.0)
    args = ap.parse_args()

    ctx = mp.get_context("spawn")
    q, stop = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=serve, args=(q, stop, args.tokens, args.interval_ms / 1000))
    proc.start()
    try:
        endpoint = Endpoint("127.0.0.1", q.get(timeout=30))
        n = int(args.rate * args.seconds)
        wl = Workload(tuple(
            WorkloadRequest(i, i / args.rate, "p", np.zeros(1, dtype=np.int64), args.tokens)
            for i in range(n)))
        cpu0, wall0 = time.process_time(), time.perf_counter()
        res = run_open_loop(endpoint, "tiny", wl)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    finally:
        stop.set()
        proc.join(timeout=10)
    lag_ms = np.array([(r.dispatch_s - r.arrival_s) * 1e3 for r in res.records])
    tokens = sum(r.output_tokens for r in res.records)
    failed = sum(r.status != "finished" for r in res.records)
    print(f"requests {n} at {args.rate:g} req/s, {args.tokens} tokens each every "
          f"{args.interval_ms:g} ms; failed {failed}")
    print(f"dispatch lag ms: p50 {np.percentile(lag_ms, 50):.3f}  p99 "
          f"{np.percentile(lag_ms, 99):.3f}  max {lag_ms.max():.3f}")
    print(f"client CPU {cpu:.2f} s over {wall:.1f} s wall; {tokens} tokens; "
          f"{cpu / max(tokens, 1) * 1e6:.1f} us CPU per streamed token")


if __name__ == "__main__":
    main()
