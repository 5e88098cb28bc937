"""Installed versions are kept in the cache directory and can never be stale:
a kept answer is `importlib.metadata`'s, is used while nothing it read has
changed, and is read afresh when a distribution is installed, removed,
upgraded or edited in place; an answer read through a path changed just
before is not kept."""

from __future__ import annotations

import os
import sys
from importlib import metadata

import pytest

from common.cache import entry_file
from harness import installed_versions as IV
from harness import provenance

NAMES = ("hbench-fake-dist", "hbench-other-dist")
LOOK_UP = IV.look_up
OLD_NS = 1_600_000_000 * 10**9   # a time long past: the paths count as settled


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A directory on `sys.path` to install fake distributions into, and a cache of its own."""
    monkeypatch.setenv("HBENCH_CACHE_DIR", str(tmp_path / "cache"))
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.setattr(sys, "path", [str(site), *sys.path])
    return site


def install(site, name: str, version: str, mtime_ns: int = OLD_NS):
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    settle(site, info, info / "METADATA", mtime_ns=mtime_ns)
    return info


def settle(*paths, mtime_ns: int = OLD_NS):
    for p in paths:
        os.utime(p, ns=(mtime_ns, mtime_ns))


def read(monkeypatch, *, looked_up: list):
    """`installed_versions` of NAMES, noting in ``looked_up`` when importlib.metadata was asked."""
    def counting(names):
        looked_up.append(tuple(names))
        return LOOK_UP(names)

    monkeypatch.setattr(IV, "look_up", counting)
    return IV.installed_versions(NAMES)


def test_a_kept_answer_is_read_back_while_nothing_changed(site, monkeypatch):
    monkeypatch.setattr(IV, "SETTLE_NS", 0)
    install(site, NAMES[0], "1.0.0")
    settle(site)
    calls: list = []
    assert read(monkeypatch, looked_up=calls) == {NAMES[0]: "1.0.0", NAMES[1]: None}
    assert read(monkeypatch, looked_up=calls) == {NAMES[0]: "1.0.0", NAMES[1]: None}
    assert len(calls) == 1   # the second answer came from the cache directory


def test_installing_removing_upgrading_or_editing_a_distribution_is_seen(site, monkeypatch):
    monkeypatch.setattr(IV, "SETTLE_NS", 0)
    calls: list = []
    info = install(site, NAMES[0], "1.0.0")
    settle(site)
    assert read(monkeypatch, looked_up=calls)[NAMES[0]] == "1.0.0"

    # its version edited in place (same size): the METADATA file's identity changed
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {NAMES[0]}\nVersion: 2.0.0\n")
    settle(info / "METADATA", mtime_ns=OLD_NS + 10**9)
    assert read(monkeypatch, looked_up=calls)[NAMES[0]] == "2.0.0" == metadata.version(NAMES[0])

    # installed: a new dist-info in a directory on sys.path
    install(site, NAMES[1], "0.1")
    settle(site, mtime_ns=OLD_NS + 2 * 10**9)
    assert read(monkeypatch, looked_up=calls) == {NAMES[0]: "2.0.0", NAMES[1]: "0.1"}

    # upgraded the way pip does it: the old dist-info removed, a new one written
    for f in sorted(info.iterdir()):
        f.unlink()
    info.rmdir()
    install(site, NAMES[0], "3.0.0")
    settle(site, mtime_ns=OLD_NS + 3 * 10**9)
    assert read(monkeypatch, looked_up=calls)[NAMES[0]] == "3.0.0"

    # removed
    for info in site.glob("*.dist-info"):
        for f in info.iterdir():
            f.unlink()
        info.rmdir()
    settle(site, mtime_ns=OLD_NS + 4 * 10**9)
    assert read(monkeypatch, looked_up=calls) == {NAMES[0]: None, NAMES[1]: None}
    assert len(calls) == 5   # every change was looked up afresh


def test_an_answer_read_through_a_path_changed_just_before_is_not_kept(site, monkeypatch):
    install(site, NAMES[0], "1.0.0", mtime_ns=OLD_NS)   # site/ itself just changed
    calls: list = []
    assert read(monkeypatch, looked_up=calls)[NAMES[0]] == "1.0.0"
    assert read(monkeypatch, looked_up=calls)[NAMES[0]] == "1.0.0"
    assert len(calls) == 2
    assert not entry_file(IV.KIND, IV.environment_key(NAMES)[0]).exists()


def test_a_torn_entry_is_looked_up_again(site, monkeypatch):
    monkeypatch.setattr(IV, "SETTLE_NS", 0)
    install(site, NAMES[0], "1.0.0")
    settle(site)
    calls: list = []
    read(monkeypatch, looked_up=calls)
    key, _ = IV.environment_key(NAMES)
    entry_file(IV.KIND, key).write_text('{"format": 1, "key"')
    assert read(monkeypatch, looked_up=calls)[NAMES[0]] == "1.0.0"
    assert len(calls) == 2


def test_the_manifest_records_the_versions_importlib_metadata_reads(tmp_path, monkeypatch):
    """What `package_versions` recorded before it kept them, first read and kept."""
    monkeypatch.setenv("HBENCH_CACHE_DIR", str(tmp_path / "cache"))

    def version(dist):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    expected = {"python": provenance.platform.python_version(), "hbench": version("hbench") or "0.1.0",
                **{d: version(d) for d in provenance.CORE_PACKAGES},
                **{d: version(d) for d in provenance.OPTIONAL_PACKAGES if version(d) is not None}}
    first = provenance._package_versions.__wrapped__()
    again = provenance._package_versions.__wrapped__()
    assert first == again == expected
    assert list(first) == list(expected)
