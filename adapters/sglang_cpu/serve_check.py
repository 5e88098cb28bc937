"""SGLang's dual pools and radix cache, sized from an hbench budget, serving two
small workloads: the check the tests and CI run in the SGLang venv.

    $HBENCH_SGLANG_PYTHON -m adapters.sglang_cpu.serve_check --budget b8

prints one JSON object: the budget's bytes per pool layer (hbench's
`harness.budget.parse_budget_bytes`, the bytes every organization gets from
the label), SGLang's split of them (`pools.split`), what SGLang's pool
objects hold (`SglangPools.describe`), and SGLang's counters after each
workload (`tree.TreeDriver.counters`):

- ``shared_prefix``: ``--requests`` requests of one shared ``--prefix``-token
  system prompt and a distinct ``--suffix``-token question plus
  ``--output`` output tokens each;
- ``multi_turn``: ``--sessions`` sessions of ``--turns`` turns, interleaved
  round-robin; each turn's prompt is the previous turn's whole sequence
  plus ``--suffix`` new tokens, so a later turn can reuse its history only
  if SGLang kept it (and its Mamba state) since the session's last turn.

- ``tombstone``: a request A, then A+B and A+C (A's node now a parent with a
  state, two leaves with states), then SGLang's tree asked to evict two Mamba
  states: LRU takes leaf A+B whole and tombstones A (its state freed, its KV
  kept for A+C), so A+B then matches nothing (no state on its path).

Token ids are deterministic (no tokenizer, no data set). Both workloads run
on fresh pools from the same budget.
"""

from __future__ import annotations

import argparse
import json

from adapters.sglang_cpu import pools as sg_pools
from adapters.sglang_cpu import tree as sg_tree
from adapters.sglang_cpu.tree import EvictParams
from harness.budget import parse_budget_bytes
from harness.model_configs import preset

#: SGLang's default for a Mamba hybrid: one byte of Mamba state per byte of KV
#: would be 1.0; 0.9 is ``ServerArgs.mamba_full_memory_ratio``'s default.
DEFAULT_RATIO = 0.9


def _fresh(geom, pool_split, max_context: int, unified: bool = False):
    if unified:
        pools = sg_pools.build_unified(geom, pool_split, max_running=8, max_context=max_context)
    else:
        pools = sg_pools.build(geom, pool_split, page_size=1, max_running=8,
                               max_context=max_context)
    return pools, sg_tree.TreeDriver(pools, sg_tree.build_tree(pools))


def shared_prefix(driver, requests: int, prefix: int, suffix: int, output: int) -> dict:
    system = list(range(1, prefix + 1))
    for i in range(requests):
        base = 10_000_000 * (i + 1)
        driver.serve(system + [base + t for t in range(suffix + output)])
    driver.check_idle()
    return driver.counters()


def multi_turn(driver, sessions: int, turns: int, suffix: int, output: int) -> dict:
    history = {s: [] for s in range(sessions)}
    for turn in range(turns):
        for s in range(sessions):
            base = 10_000_000 * (1 + s) + 100_000 * turn
            seq = history[s] + [base + t for t in range(suffix + output)]
            driver.serve(seq)
            history[s] = seq
    driver.check_idle()
    return driver.counters()


def tombstone(driver, tokens: int) -> dict:
    a = list(range(1, tokens + 1))
    ab = a + [20_000_000 + t for t in range(tokens)]
    ac = a + [30_000_000 + t for t in range(tokens // 2)]
    for seq in (a, ab, ac):
        driver.serve(seq)
    freed = driver.tree.evict(EvictParams(num_tokens=0, mamba_num=2))
    out = {"evicted_kv_tokens": int(freed.num_tokens_evicted),
           "evicted_mamba_slots": int(freed.mamba_num_evicted),
           "tombstoned_nodes": driver.tombstones.count,
           "kv_tokens_left": int(driver.tree.total_size()[0])}
    out["rematched_ab"] = driver.serve(ab)
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="falcon-h1-7b")
    parser.add_argument("--budget", default="b16")
    parser.add_argument("--ratio", type=float, default=DEFAULT_RATIO,
                        help="SGLang's mamba_full_memory_ratio")
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--prefix", type=int, default=2000)
    parser.add_argument("--suffix", type=int, default=1000)
    parser.add_argument("--output", type=int, default=100)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--unified", action="store_true",
                        help="SGLang's unified memory (--enable-unified-memory) instead of "
                             "its dual pools")
    args = parser.parse_args(argv)

    geom = preset(args.model)
    budget_bytes, label = parse_budget_bytes(args.budget, geom, "d0")
    pool_split = sg_pools.split(budget_bytes, geom, args.ratio, page_size=1)
    max_context = args.prefix + args.turns * (args.suffix + args.output) + 16
    pools, driver = _fresh(geom, pool_split, max_context, args.unified)
    out = {
        "model": geom.name, "budget": label, "budget_bytes_per_pool_layer": budget_bytes,
        "pool_layers": geom.pool_layers, "unified": args.unified,
        "split": {"mamba_full_memory_ratio": args.ratio, "mamba_slots": pool_split.mamba_slots,
                  "kv_tokens": pool_split.kv_tokens},
        "sglang_pools": pools.describe(),
        "shared_prefix": shared_prefix(driver, args.requests, args.prefix, args.suffix,
                                       args.output),
    }
    _, driver = _fresh(geom, pool_split, max_context, args.unified)
    out["multi_turn"] = multi_turn(driver, args.sessions, args.turns, args.suffix, args.output)
    _, driver = _fresh(geom, pool_split, max_context, args.unified)
    out["tombstone"] = tombstone(driver, args.output)
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
