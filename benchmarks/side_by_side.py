"""Time this checkout against another one, side by side in one run.

Machines here are shared and noisy, so a speed claim is a ratio measured in
one sitting: the two trees run the same benchmark module alternately (which
goes first rotates every round), each writing its per-organization times as
JSON, and the best time of each tree is compared. `bench_orgs` and `bench_run`
use this for their ``--against TREE`` option.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def alternate(other: str | Path, module: str, argv: Sequence[str], orgs: Sequence[str],
              time_key: str, rounds: int, title: str, json_out: str | None = None) -> dict:
    """Run ``python -m module *argv --json FILE`` in this tree and in ``other``
    alternately for ``rounds`` rounds; print and return, per organization, the
    best ``time_key`` of each tree, their ratio (this / other) and every
    round's ratio."""
    trees = {"this": ROOT, "other": Path(other).resolve()}
    best: dict[str, dict[str, float]] = {t: {} for t in trees}
    per_round: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(rounds):
            order = list(trees) if rnd % 2 == 0 else list(trees)[::-1]
            got = {}
            for name in order:
                out = Path(tmp) / f"{name}-{rnd}.json"
                subprocess.run([sys.executable, "-m", module, *argv, "--json", str(out)],
                               cwd=trees[name], check=True, stdout=subprocess.DEVNULL)
                got[name] = {o: v[time_key]
                             for o, v in json.loads(out.read_text())["orgs"].items()}
                for o, t in got[name].items():
                    best[name][o] = min(t, best[name].get(o, t))
            per_round.append({o: got["this"][o] / got["other"][o] for o in orgs})
    print(f"{title}, this checkout {ROOT} over {trees['other']}: best of {rounds} "
          "alternating runs")
    print(f"{'org':4} {'other s':>8} {'this s':>8} {'this/other':>10} {'per-run ratios':>16}")
    result = {}
    for o in orgs:
        ratio = best["this"][o] / best["other"][o]
        runs = " ".join(f"{r[o]:.2f}" for r in per_round)
        print(f"{o:4} {best['other'][o]:8.3f} {best['this'][o]:8.3f} {ratio:10.2f}   {runs}")
        result[o] = {"other_best_s": best["other"][o], "this_best_s": best["this"][o],
                     "ratio": ratio, "per_run_ratios": [r[o] for r in per_round]}
    if json_out:
        Path(json_out).write_text(json.dumps({"against": str(trees["other"]), "orgs": result},
                                             indent=2))
    return result
