"""Forward-pass times of the PyTorch Falcon-H1 (adapters.torch) on one core.

Builds a random-weight model of a ``hbench tiny-model`` preset (weights and
config only) in a temporary directory and times, on one thread pinned to one
core, the calls an in-process engine makes:

* prefill of one 512-token chunk from a fresh state, and of the next 512
  tokens (attending over the first block);
* one decode step for ``--batch`` requests at ``--context`` tokens each;
* gathering and scattering those requests' checkpoints through pages
  (3 SSM member pages + 1 conv page, as S1 lays them out).

Then an estimate of a run of ``--requests`` requests with ``--context``-token
prompts and ``--output`` output tokens each (prefill in 512-token chunks,
decode at ``--batch``), excluding scheduling.

    python -m benchmarks.bench_torch_model [--preset proportional] [--batch 8]
        [--context 1024] [--requests 60] [--output 64] [--repeats 7] [--cpu 0]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from adapters.tiny_model import PRESETS, write_weights
from adapters.torch.model import FalconH1
from adapters.torch.paging import (
    StatePlacement,
    gather_state,
    kv_view,
    lay_over_pages,
    page_pool,
    scatter_state,
)
from benchmarks.bench_orgs import pin_cpu

BLOCK = 512
VOCAB = 2048


def median_s(fn, repeats: int) -> tuple[float, float]:
    """Median wall and median process CPU seconds of ``fn()``.

    On a shared machine the CPU time (one thread) shows the work; the wall
    time adds waiting for the core.
    """
    wall, cpu = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        fn()
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - t)
    return statistics.median(wall), statistics.median(cpu)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="proportional", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--output", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--cpu", type=int, default=0)
    args = ap.parse_args(argv)
    print(pin_cpu(args.cpu), "; torch threads 1")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        write_weights(d, PRESETS[args.preset], VOCAB, seed=0)
        model = FalconH1.from_dir(d)
    s = model.shapes
    blocks = -(-(args.context + 1) // BLOCK)
    kv = kv_view(page_pool(args.batch * blocks, s.n_layers, s.kv_block_elems(BLOCK)), s, BLOCK)
    tables = [list(range(r * blocks, (r + 1) * blocks)) for r in range(args.batch)]
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, VOCAB, (args.context,), generator=gen)

    first = median_s(lambda: model.prefill_chunk(prompt[:512], 0, kv, tables[0],
                                                 *s.zero_state(), last_only=True), args.repeats)
    ssm, conv = s.zero_state()
    model.prefill_chunk(prompt[:512], 0, kv, tables[0], ssm, conv)
    second = median_s(lambda: model.prefill_chunk(prompt[512:1024], 512, kv, tables[0],
                                                  ssm.clone(), conv.clone(), last_only=True),
                      args.repeats)
    for r in range(1, args.batch):        # every request's context K/V in place
        kv[tables[r][0]] = kv[tables[0][0]]
        kv[tables[r][1]] = kv[tables[0][1]]
    ssm_b, conv_b = s.zero_state(args.batch)
    tokens = torch.randint(0, VOCAB, (args.batch,), generator=gen)
    positions = torch.full((args.batch,), args.context)
    decode = median_s(lambda: model.decode(tokens, positions, kv, tables, ssm_b, conv_b),
                      args.repeats * 3)

    page = -(-s.ssm_elems // 3)
    pool = page_pool(4 * args.batch, s.n_layers, max(page, s.conv_elems))
    places = [StatePlacement(lay_over_pages([4 * r, 4 * r + 1, 4 * r + 2], s.ssm_elems, page),
                             lay_over_pages([4 * r + 3], s.conv_elems, page))
              for r in range(args.batch)]

    def round_trip():
        states = [gather_state(pool, p, s) for p in places]
        for p, (a, b) in zip(places, states, strict=True):
            scatter_state(pool, p, a, b)
    paging = median_s(round_trip, args.repeats * 3)

    chunks = -(-args.context // 512)
    print(f"preset {args.preset}: {sum(w.numel() for w in model.layers[0].values()):,} "
          f"parameters per layer, {s.n_layers} layers")
    print(f"{'median ms':40s} {'wall':>8s} {'cpu':>8s}")
    rows = [("prefill 512 tokens, fresh state", first), ("prefill 512 tokens after 512", second),
            (f"decode step, batch {args.batch} at {args.context} tokens", decode),
            (f"gather + scatter {args.batch} checkpoints", paging)]
    for label, (wall, cpu) in rows:
        print(f"{label:40s} {wall * 1e3:8.1f} {cpu * 1e3:8.1f}")
    for i, kind in enumerate(("wall", "cpu")):
        prefill_s = args.requests * (first[i] + (chunks - 1) * second[i])
        decode_s = args.requests * args.output / args.batch * (decode[i] + paging[i])
        print(f"estimate ({kind}): {args.requests} requests x {args.context} prompt + "
              f"{args.output} output tokens = {prefill_s:.1f} s prefill + {decode_s:.1f} s decode")


if __name__ == "__main__":
    main()
