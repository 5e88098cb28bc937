"""`--poison`: storage the organization freed or handed away reads as NaN and fails the run.

Each test breaks the organization's bookkeeping on purpose and checks that
the torch engine, with poisoning on, refuses the run; the same workload
without the break serves cleanly (so the failure is the break's doing).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from adapters.torch.continuation import all_at_once  # noqa: E402
from adapters.torch.engine import TorchEngine  # noqa: E402
from common.errors import HbenchError  # noqa: E402
from harness.config import RunConfig  # noqa: E402
from harness.orgs.base import Organization  # noqa: E402
from harness.run_setup import validate  # noqa: E402
from harness.run_workload import build_run_workload  # noqa: E402


def serve(model_dir, org="s2", poison=True):
    config = RunConfig(engine="torch", org=org, budget="b12", model=str(model_dir),
                       config_path=str(model_dir / "config.json"), poison=poison,
                       requests=4, rate=1000.0, mean_input=1200, max_output=4, contexts=1,
                       max_model_len=4096, seed=1, token_budget=1024)
    engine = TorchEngine()
    # every request present before the first step: the schedule does not depend on timing
    run = engine.run(all_at_once(build_run_workload(config)), validate(config))
    return engine, run


def test_the_workload_adopts(model_dir):
    """The breaks below need requests that adopt published checkpoints."""
    engine, _ = serve(model_dir, "s2", poison=False)
    assert engine.stats["adopted_requests"] > 0


@pytest.mark.parametrize("org", ["s1", "s2"])
def test_an_intact_organization_serves_with_poison_on(model_dir, org):
    engine, run = serve(model_dir, org)
    assert all(r.status == "finished" for r in run.requests)
    assert engine.stats["poisoned_pages"] > 0 and engine.stats["publish_copies"] > 0


def test_skipped_state_copies_are_caught(model_dir, monkeypatch):
    """An organization that forgets to ask for its adopt/publish copies leaves the
    fresh live state unwritten: poisoned, it yields NaN logits."""
    monkeypatch.setattr(Organization, "copies", lambda self: ())
    with pytest.raises(HbenchError, match="non-finite logits"):
        serve(model_dir)


def test_checkpoint_member_freed_early_is_caught(model_dir, monkeypatch):
    """An organization that returns a published checkpoint's first member page to
    the free queue while the checkpoint stays in the lookup map: the next
    request that adopts it copies poisoned state."""
    from harness.orgs.keys import key_at

    real_commit = Organization.commit
    broken = []

    def commit(self, rid, keys, computed, prefill_until):
        published = real_commit(self, rid, keys, computed, prefill_until)
        for j in published:
            e = self.ckpts.map[key_at(keys, j)]
            pool, page = e.members[0]
            self.pools[pool].dependents[page].discard(e.id)   # the bug
            self.pools[pool].forget_content(page)
            broken.append(page)
        return published

    monkeypatch.setattr(Organization, "commit", commit)
    with pytest.raises(HbenchError, match="non-finite logits"):
        serve(model_dir)
    assert broken


def test_without_poison_a_skipped_copy_goes_unnoticed_by_the_engine(model_dir, monkeypatch):
    """Why poisoning exists: without it the same bug computes on stale zeros."""
    monkeypatch.setattr(Organization, "copies", lambda self: ())
    engine, run = serve(model_dir, poison=False)
    assert all(r.status == "finished" for r in run.requests)


@pytest.mark.slow
def test_a_region_page_left_behind_by_a_move_is_caught(model_dir, monkeypatch):
    """E0 at its verify point moves capacity, and the engine relocates pages with
    content inside the region's buffer. An engine that forgets the copy leaves
    the page's new slot as the retired page left it, poisoned: NaN logits."""
    from adapters.torch import region
    from adapters.torch.continuation import verify_config, verify_continuation

    monkeypatch.setattr(region.RegionSlots, "_copy", lambda self, pool, src, dst: None)
    with pytest.raises(HbenchError, match="non-finite logits"):
        verify_continuation(verify_config("e0", str(model_dir)))
