"""Hostile results trees: manifest and summary files with fields of the wrong
type, nested 200,000 deep, not UTF-8; a configuration edited after the run
(an organization or a budget relabelled, a run id renamed, the files'
record deleted); a manifest or summary that is a FIFO, a link to /dev/zero
or a directory; parquet tables that are garbage or cut short. Every reader (analyze, report, explain, regress) refuses them in one
``Error:`` line naming the file, with exit 2 (for regress too: bad input, not
"regression found"), and writes nothing."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from click.testing import CliRunner

from hbench.cli import cli
from tests.support.hostile import deep_chain, deep_json, deep_object, make_results_tree, refused


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return make_results_tree(tmp_path_factory.mktemp("good"))


def _manifest(**changes):
    def edit(run):
        m = json.loads((run / "manifest.json").read_text())
        for key, value in changes.items():
            if value is _DROP:
                m.pop(key)
            else:
                m[key] = value
        (run / "manifest.json").write_text(json.dumps(m))
    return edit


def _config(**changes):
    """The manifest's configuration edited after the run (and, with ``also``,
    the fields the manifest repeats outside it), its run id left as it was."""
    also = changes.pop("also", False)

    def edit(run):
        m = json.loads((run / "manifest.json").read_text())
        m["config"].update(changes)
        if also:
            m.update({k: v for k, v in changes.items() if k in m})
            m["budget"].update({k: v for k, v in changes.items() if k in m["budget"]})
        (run / "manifest.json").write_text(json.dumps(m))
    return edit


def _special(name: str, kind: str):
    """``name`` replaced by a FIFO, a link to /dev/zero or a directory."""
    def edit(run):
        (run / name).unlink()
        if kind == "fifo":
            os.mkfifo(run / name)
        elif kind == "zero":
            (run / name).symlink_to("/dev/zero")
        else:
            (run / name).mkdir()
    return edit


def _field(path: str, value):
    """One field of the manifest (``a.b`` for a nested one) changed: a field
    the run id does not hash, which the manifest's seal covers."""
    def edit(run):
        m = json.loads((run / "manifest.json").read_text())
        *parents, last = path.split(".")
        holder = m
        for key in parents:
            holder = holder[key]
        holder[last] = value
        (run / "manifest.json").write_text(json.dumps(m))
    return edit


def _padded(run):
    """The manifest padded past the bound readers read (4 MiB), its seal made good."""
    from harness.seal import sealed

    m = json.loads((run / "manifest.json").read_text())
    m["host"]["platform"] = "x" * (5 * 2**20)
    (run / "manifest.json").write_text(json.dumps(sealed(m)))


def _linked_elsewhere(name: str, change):
    """``name`` a symbolic link to an edited copy kept outside the run."""
    def edit(run):
        copy = run.parent.parent / f"elsewhere-{name}"
        copy.write_text((run / name).read_text())
        change(copy)
        (run / name).unlink()
        (run / name).symlink_to(copy)
    return edit


def _summary(**changes):
    def edit(run):
        s = json.loads((run / "summary.json").read_text())
        s.update(changes)
        (run / "summary.json").write_text(json.dumps(s))
    return edit


def _write(name, data: bytes):
    def edit(run):
        (run / name).write_bytes(data)
    return edit


def _cut(name, size: int):
    def edit(run):
        (run / name).write_bytes((run / name).read_bytes()[:size])
    return edit


_DROP = object()
DAMAGE = {
    "config-string": (_manifest(config="s2@b83"), "manifest.json"),
    "config-list": (_manifest(config=[1, 2]), "manifest.json"),
    "config-null": (_manifest(config=None), "manifest.json"),
    "config-missing": (_manifest(config=_DROP), "manifest.json"),
    "budget-string": (_manifest(budget="b83"), "manifest.json"),
    "budget-list": (_manifest(budget=[83]), "manifest.json"),
    "budget-missing": (_manifest(budget=_DROP), "manifest.json"),
    "budget-label-number": (_manifest(budget={"label": 83}), "manifest.json"),
    "run_id-number": (_manifest(run_id=5), "manifest.json"),
    "engine-list": (_manifest(engine=["sim"]), "manifest.json"),
    "workload_hash-number": (_manifest(workload_hash=123), "manifest.json"),
    "schema-string": (_manifest(schema_version="1"), "schema"),
    "manifest-list": (_write("manifest.json", b"[1, 2]"), "manifest.json"),
    "manifest-deep": (_write("manifest.json", deep_json().encode()), "manifest.json"),
    "manifest-latin1": (_write("manifest.json", b'{"status": "\xff"}'), "manifest.json"),
    "manifest-nan": (_write("manifest.json", b'{"status": NaN}'), "manifest.json"),
    "summary-deep": (_write("summary.json", deep_object().encode()), "summary.json"),
    "summary-latin1": (_write("summary.json", b'{"finished": "\xff"}'), "summary.json"),
    "summary-list": (_write("summary.json", b"[]"), "summary.json"),
    "summary-validity-string": (_summary(validity="valid"), "summary.json"),
    "summary-cut": (_cut("summary.json", 100), "summary.json"),
    # the configuration is bound to the run id: an edit is refused, never read
    "org-relabelled": (_config(org="d0", also=True), "does not hash to its run id"),
    "org-only-in-config": (_config(org="d0"), "is not its configuration's"),
    "budget-relabelled": (_config(budget="b63"), "does not hash to its run id"),
    "seed-relabelled": (_config(seed=9), "does not hash to its run id"),
    "rate-relabelled": (_config(rate=9.5), "does not hash to its run id"),
    "run-id-renamed": (_manifest(run_id="my-run"), "not a content address"),
    "files-record-deleted": (_manifest(files=_DROP), "records no size and sha256"),
    "workload-hash-edited": (_manifest(workload_hash="0" * 16), "does not hash to its run id"),
    # special files: never opened, never hang, never read without end
    "manifest-fifo": (_special("manifest.json", "fifo"), "not a regular file"),
    "manifest-dev-zero": (_special("manifest.json", "zero"), "not a regular file"),
    "manifest-directory": (_special("manifest.json", "dir"), "is a directory"),
    "summary-fifo": (_special("summary.json", "fifo"), "summary.json"),
    "summary-dev-zero": (_special("summary.json", "zero"), "summary.json"),
    # every other field is sealed (manifest_sha256): an edit is refused, never read
    "budget-bytes-edited": (_field("budget.allocated_whole_model_bytes", 7), "manifest_sha256"),
    "engine-info-edited": (_field("engine_info.attn_block_tokens", 16), "manifest_sha256"),
    "workload-meta-edited": (_field("workload_meta.context_tokens", 5), "manifest_sha256"),
    "created-edited": (_field("created_utc", "2099-01-01T00:00:00Z"), "manifest_sha256"),
    "weights-edited": (_field("weights_bytes", 1), "manifest_sha256"),
    "status-edited": (_field("status", "running"), "manifest_sha256"),
    "field-added": (_field("note", "x"), "manifest_sha256"),
    "seal-removed": (_manifest(manifest_sha256=_DROP), "records no manifest_sha256"),
    "seal-edited": (_manifest(manifest_sha256="0" * 64), "manifest_sha256"),
    "manifest-padded": (_padded, "at most 4,194,304 are read"),
    "manifest-linked-edited": (_linked_elsewhere("manifest.json", lambda f: f.write_text(
        f.read_text().replace('"weights_bytes": ', '"weights_bytes": 1', 1))), "manifest_sha256"),
    "summary-linked-edited": (_linked_elsewhere("summary.json", lambda f: f.write_text(
        f.read_text().replace('"finished": ', '"finished": 1', 1))), "summary.json"),
}
TABLE_DAMAGE = {
    "requests-garbage": (_write("requests.parquet", b"garbage" * 100), "requests.parquet"),
    "requests-cut": (_cut("requests.parquet", 1000), "requests.parquet"),
    "requests-empty": (_write("requests.parquet", b""), "requests.parquet"),
}


def _damaged(tmp_path, good, edit):
    root = tmp_path / "tree"
    shutil.copytree(good, root)
    run = next(p for p in root.iterdir() if (p / "manifest.json").exists())
    edit(run)
    return root, run


READERS = {
    "analyze": lambda root, run, tmp: ["analyze", root, "--no-figures", "--out", tmp / "an"],
    "report": lambda root, run, tmp: ["report", root, "-o", tmp / "r.html"],
    "explain": lambda root, run, tmp: ["explain", run],
    "regress-candidate": lambda root, run, tmp: ["regress", "--baseline", tmp / "base",
                                                 "--candidate", root],
    "regress-baseline": lambda root, run, tmp: ["regress", "--baseline", root,
                                                "--candidate", tmp / "base"],
}


@pytest.mark.slow
@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_damaged_run_file_is_refused_naming_it(tmp_path, good, damage, reader):
    edit, names = DAMAGE[damage]
    root, run = _damaged(tmp_path, good, edit)
    shutil.copytree(good, tmp_path / "base")
    refused(READERS[reader](root, run, tmp_path), names, watch=tmp_path)


@pytest.mark.parametrize("damage", sorted(TABLE_DAMAGE))
@pytest.mark.parametrize("reader", ["analyze", "report", "explain"])
def test_a_corrupt_parquet_table_is_refused_naming_it(tmp_path, good, damage, reader):
    edit, name = TABLE_DAMAGE[damage]
    root, run = _damaged(tmp_path, good, edit)
    line = refused(READERS[reader](root, run, tmp_path), name, watch=tmp_path)
    assert "Traceback" not in line and str(run) in line


def _manifest_deleted(run):
    (run / "manifest.json").unlink()


def _linked_in(run):
    """The run moved out of the tree and a symbolic link left in its place."""
    outside = run.parent.parent / "outside"
    run.rename(outside)
    run.symlink_to(outside, target_is_directory=True)


STRAYS = {"manifest-deleted": (_manifest_deleted, "holds summary.json but no manifest.json"),
          "run-dir-linked": (_linked_in, "is a symbolic link to a directory")}
TREE_READERS = {**{k: v for k, v in READERS.items() if k != "explain"},
                "reuse": lambda root, run, tmp: ["reuse", root]}


@pytest.mark.parametrize("stray", sorted(STRAYS))
@pytest.mark.parametrize("reader", sorted(TREE_READERS))
def test_a_cell_a_tree_walk_would_pass_over_is_refused_naming_it(tmp_path, good, stray, reader):
    """A cell whose manifest was deleted, or a link where a cell was, would
    drop out of a walk in silence (a baseline cell then goes ungated): each
    reader of a tree refuses it in one line instead."""
    edit, needle = STRAYS[stray]
    root, run = _damaged(tmp_path, good, edit)
    shutil.copytree(good, tmp_path / "base")
    line = refused(TREE_READERS[reader](root, run, tmp_path), needle, watch=tmp_path)
    assert run.name in line


def _capacity_file(kind: str):
    """A ``capacity.json`` beside the run, as `hbench capacity` seals it, then
    damaged (``kind``): a number edited, the seal removed, a FIFO, a link to
    /dev/zero, a directory, padded past the bound read."""
    from analysis.capacity_file import capacity_text

    def edit(run):
        f = run.parent / "capacity.json"
        f.write_text(capacity_text({"slo": ["ttft_p99<=2s"], "rates": [1.0, 2.0], "seeds": [1],
                                    "capacity": [{"org": "s2", "budget": "b83", "capacity": 2.0}]}))
        if kind == "edited":
            f.write_text(f.read_text().replace('"capacity": 2.0', '"capacity": 20.0'))
        elif kind == "unsealed":
            doc = json.loads(f.read_text())
            doc.pop("capacity_sha256")
            f.write_text(json.dumps(doc))
        elif kind == "padded":
            f.write_text(f.read_text() + " " * (33 * 2**20))
        elif kind != "sealed":
            f.unlink()
            {"fifo": os.mkfifo, "zero": lambda p: p.symlink_to("/dev/zero"),
             "directory": os.mkdir}[kind](f)
    return edit


CAPACITY_DAMAGE = {"edited": "do not match its capacity_sha256", "unsealed": "records no capacity_sha256",
                   "fifo": "not a regular file", "zero": "not a regular file",
                   "directory": "is a directory", "padded": "at most 33,554,432 are read"}


@pytest.mark.parametrize("kind", sorted(CAPACITY_DAMAGE))
@pytest.mark.parametrize("reader", ["report", "analyze"])
def test_a_capacity_file_edited_or_special_is_refused(tmp_path, good, kind, reader):
    """The report prints capacity.json's numbers: an edit is refused, never
    printed, and a FIFO or /dev/zero neither hangs the report nor fills memory."""
    root, run = _damaged(tmp_path, good, _capacity_file(kind))
    refused(READERS[reader](root, run, tmp_path), CAPACITY_DAMAGE[kind], watch=tmp_path)


def test_a_sealed_capacity_file_is_read(tmp_path, good):
    """The control: the same file undamaged is read (and its section written)."""
    from analysis.capacity_file import capacity_docs

    root, run = _damaged(tmp_path, good, _capacity_file("sealed"))
    ((f, doc),) = capacity_docs(root)
    assert f == root / "capacity.json" and doc["capacity"][0]["capacity"] == 2.0


@pytest.mark.slow
@pytest.mark.parametrize("reader", ["analyze", "report", "regress-candidate", "reuse"])
def test_a_tree_nested_deeper_than_the_recursion_limit_is_read(tmp_path, good, reader):
    """Readers walk a results tree with their own stack: a tree nested 1,200
    directories deep (a RecursionError traceback once) is read as any other."""
    root = tmp_path / "tree"
    shutil.copytree(good, root)
    shutil.copytree(good, tmp_path / "base")
    with deep_chain(root, 1200):
        args = TREE_READERS[reader](root, None, tmp_path)
        res = CliRunner().invoke(cli, [str(a) for a in args])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
