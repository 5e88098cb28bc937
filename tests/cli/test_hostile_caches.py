"""A hostile cache directory, as a shared CI runner, bit rot or a user with an
editor leaves it: every kept entry edited in place (values out of range,
values in range, a digest with a newline, a large file's record), replaced
by a FIFO, a directory, a link to ``/dev/zero`` or to another entry, padded
past the bound read; the parsed corpus flipped, its record deleted. ``hbench run`` must give the very summary a clean cache
gives, say in one line per entry that it computed it again, print no
traceback, finish in bounded time and memory, and leave the cache holding
good entries again (the next run reads them in silence).

Each case runs ``hbench run`` in a subprocess (so a hang is a timeout and
memory is the child's own peak, from ``wait4``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from tests.support import REPO_ROOT

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="FIFOs, /dev/zero")]

ARGS = ["run", "--requests", "30", "--rate", "4", "--seed", "5", "--json"]
#: Generous bounds: a run of 30 requests takes a second or two and ~200 MB.
SECONDS, MAX_RSS_MB = 120, 1500


def hbench_run(cache: Path, out: Path) -> tuple[dict, list[str], int]:
    """``hbench run ARGS`` with ``cache`` as its cache directory: the summary
    and what the manifest records from the cache, its stderr lines and its
    peak RSS in MB."""
    env = {**os.environ, "HBENCH_CACHE_DIR": str(cache)}
    with tempfile.TemporaryFile("w+") as so, tempfile.TemporaryFile("w+") as se:
        proc = subprocess.Popen([sys.executable, "-m", "hbench.cli", *ARGS, "--out", str(out)],
                                cwd=REPO_ROOT, env=env, stdout=so, stderr=se)
        timer = threading.Timer(SECONDS, proc.kill)   # a hang ends as a kill, and fails below
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)   # reaped here, for the child's own peak RSS
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        so.seek(0)
        se.seek(0)
        stdout, stderr = so.read(), se.read()
    assert proc.returncode == 0, f"exit {proc.returncode} (killed after {SECONDS} s?): {stderr[-2000:]}"
    assert "Traceback" not in stderr
    summary = json.loads(stdout)
    manifest = json.loads((Path(summary.pop("run_dir")) / "manifest.json").read_text())
    # what the cache feeds besides the numbers: the engine version (cell ids and
    # pairing), the workload's identity and meta, the packages' versions
    recorded = {k: manifest[k] for k in ("engine_version", "workload_hash", "workload_meta", "packages")}
    return {"summary": summary, **recorded}, [ln for ln in stderr.splitlines() if ln.strip()], \
        usage.ru_maxrss / 1024


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A cache filled by one run, and that run's summary."""
    root = tmp_path_factory.mktemp("pristine")
    cache = root / "cache"
    parsed = Path(os.environ["HBENCH_CACHE_DIR"]) / "sharegpt-pairs"
    if parsed.is_dir():   # the session's parsed corpus: parsing it again is not the point
        shutil.copytree(parsed, cache / "sharegpt-pairs")
    summary, _, _ = hbench_run(cache, root / "out")
    again, lines, _ = hbench_run(cache, root / "out2")
    assert again == summary and lines == []
    return cache, summary


def entry(cache: Path, kind: str) -> Path:
    """The one entry of ``kind`` (``kind/*.arrow`` for a large file, whose record
    is ``kind/*.json`` beside it; ``derived-workloads`` names its table)."""
    kind, _, pattern = kind.partition("/")
    (f,) = sorted((cache / kind).glob(pattern or ("*.arrow" if kind == "derived-workloads"
                                                  else "*.json")))
    return f


def _edit_value(key: str, text: str):
    def edit(f: Path):
        doc = json.loads(f.read_text())
        raw = json.dumps(doc).replace(json.dumps(doc["value"][key]), text, 1)
        f.write_text(raw)
    return edit


def _fifo(f: Path):
    f.unlink()
    os.mkfifo(f)


def _dev_zero(f: Path):
    f.unlink()
    f.symlink_to("/dev/zero")


def _directory(f: Path):
    f.unlink()
    f.mkdir()


def _linked_to(other_kind: str):
    """``f`` a symbolic link to the entry of another kind (a valid entry, under
    another key)."""
    def damage(f: Path):
        other = entry(f.parent.parent, other_kind)
        f.unlink()
        f.symlink_to(other)
    return damage


def _oversized(f: Path):
    doc = json.loads(f.read_text())
    doc["padding"] = "x" * (5 * 2**20)
    f.write_text(json.dumps(doc))


def _corpus(damage):
    """``damage`` to the parsed corpus, with the derived workload it would feed
    removed (absent: made again in silence), so the run reads the corpus."""
    def both(f: Path):
        for derived in (f.parent.parent / "derived-workloads").iterdir():
            derived.unlink()
        damage(f)
    return both


def _flip_middle_byte(f: Path):
    with open(f, "r+b") as fh:
        fh.seek(f.stat().st_size // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))


def _flip_last_byte(f: Path):
    data = bytearray(f.read_bytes())
    data[-20] ^= 0xFF
    f.write_bytes(bytes(data))


def _sim_digest_entry() -> str:
    """The simulator's code-digest entry (a run keeps two: the engine's and
    the recording code's, `hbench.runner.recorded_version`)."""
    from adapters.sim.engine import DIGEST_ROOTS
    from common.code_digest import SOURCE_ROOT, cache_file

    return f"code-digest/{cache_file(DIGEST_ROOTS, SOURCE_ROOT.resolve()).name}"


SIM_DIGEST = _sim_digest_entry()
CASES = {
    "ks-pvalue-tiny": ("ks-expon", _edit_value("pvalue", "1e-300")),
    "ks-pvalue-nan": ("ks-expon", _edit_value("pvalue", "NaN")),
    "ks-pvalue-two": ("ks-expon", _edit_value("pvalue", "2.0")),
    "ks-pvalue-negative": ("ks-expon", _edit_value("pvalue", "-0.5")),
    "ks-pvalue-infinity": ("ks-expon", _edit_value("pvalue", "Infinity")),
    "ks-fifo": ("ks-expon", _fifo),
    "ks-dev-zero": ("ks-expon", _dev_zero),
    "sim-digest-newline": (SIM_DIGEST, _edit_value("digest", json.dumps("0123456789ab\nx"))),
    "sim-digest-other": (SIM_DIGEST, _edit_value("digest", json.dumps("0123456789ab"))),
    "sim-digest-fifo": (SIM_DIGEST, _fifo),
    "versions-edited": ("installed-versions", lambda f: f.write_text(
        f.read_text().replace('"numpy": "', '"numpy": "9', 1))),
    "versions-dev-zero": ("installed-versions", _dev_zero),
    "derived-byte-flipped": ("derived-workloads", _flip_last_byte),
    "derived-fifo": ("derived-workloads", _fifo),
    "derived-dev-zero": ("derived-workloads", _dev_zero),
    "derived-record-edited": ("derived-workloads/*.json", lambda f: f.write_text(
        f.read_text().replace('"bytes": ', '"bytes": 1', 1))),
    "ks-linked-to-another-entry": ("ks-expon", _linked_to(SIM_DIGEST)),
    "ks-oversized": ("ks-expon", _oversized),
    "versions-directory": ("installed-versions", _directory),
    "sim-digest-directory": (SIM_DIGEST, _directory),
    "derived-directory": ("derived-workloads", _directory),
    # the parsed corpus: a 100 MB table, hashed as it is mapped
    "corpus-byte-flipped": ("sharegpt-pairs/*.arrow", _corpus(_flip_middle_byte)),
    "corpus-fifo": ("sharegpt-pairs/*.arrow", _corpus(_fifo)),
    "corpus-record-deleted": ("sharegpt-pairs/*.arrow",
                              _corpus(lambda f: f.with_suffix(".json").unlink())),
    "corpus-directory": ("sharegpt-pairs/*.arrow", _corpus(_directory)),
}
#: Cases whose damage the cache cannot undo: it writes over a file, not a
#: directory, so the entry is computed again (one line) on every run that reads
#: it (the corpus is read again only when a derived workload is not kept).
STAYS = {"versions-directory", "sim-digest-directory", "derived-directory"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_edited_or_special_cache_entry_never_changes_a_result(pristine, tmp_path, case):
    kind, damage = CASES[case]
    cache = tmp_path / "cache"
    shutil.copytree(pristine[0], cache, symlinks=True)
    f = entry(cache, kind)
    damage(f)
    summary, lines, rss = hbench_run(cache, tmp_path / "out")
    assert summary == pristine[1]                       # the result and its record, unchanged
    assert len(lines) == 1, lines                       # one line says so
    assert lines[0].startswith(f"hbench: ignoring cache entry {f}") and "computing it again" in lines[0]
    assert rss < MAX_RSS_MB, f"peak RSS {rss:.0f} MB"
    again, lines, _ = hbench_run(cache, tmp_path / "out2")   # the cache holds a good entry again
    assert again == pristine[1] and len(lines) == (case in STAYS), lines
