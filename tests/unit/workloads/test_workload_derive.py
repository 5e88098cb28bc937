"""Derivation on a small synthetic ShareGPT file: determinism, stream
independence (q and rate), caps, context sharing, salts, Parquet round trip."""

import dataclasses
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common.errors import HbenchError
from workloads.bounds import MIN_TURN_TOKENS
from workloads.build import build_workload
from workloads.io import load_workload, save_workload
from workloads.sharegpt.derive import WorkloadSpec, derive_workload
from workloads.sharegpt.loader import parse_file
from workloads.sharegpt.tokenizer import get_tokenizer

SPEC = WorkloadSpec(seed=3, q=0.5, rate=2.0, requests=80, contexts=3, max_model_len=300,
                    max_output=64, mean_input_tokens=200)


def write_sharegpt(path, conversations=300, seed=0):
    """Conversations of pseudo-words; 1 in 8 user turns is long enough that it
    cannot fit max_model_len=300, and replies run up to ~200 tokens."""
    rng = np.random.default_rng(seed)
    vocab = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), size=k))
             for k in rng.integers(2, 9, size=400)]

    def words(n):
        return " ".join(rng.choice(vocab, size=n))

    records = []
    for i in range(conversations):
        turns = []
        for j in range(int(rng.integers(1, 4))):
            n_turn = 120 if rng.random() < 0.125 else int(rng.integers(3, 40))
            opening = f"Topic {i}: " if j == 0 else ""
            turns += [{"from": "human", "value": opening + words(n_turn)},
                      {"from": "gpt", "value": words(int(rng.integers(2, 120)))}]
        records.append({"id": f"s{i}", "conversations": turns})
    path.write_text(json.dumps(records))
    return path


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    return parse_file(write_sharegpt(tmp_path_factory.mktemp("sg") / "sharegpt.json"))


def derive(pairs, **changes):
    return derive_workload(pairs, get_tokenizer(), dataclasses.replace(SPEC, **changes))


def lengths(w):
    return [(r.prompt_len, r.output_len) for r in w.requests]


def test_same_seed_is_byte_identical_and_another_seed_is_not(pairs):
    a, b = derive(pairs), derive(pairs)
    assert a.content_hash == b.content_hash and a.meta == b.meta
    for ra, rb in zip(a.requests, b.requests, strict=True):
        assert ra.prompt_token_ids.tobytes() == rb.prompt_token_ids.tobytes()
        assert ra.prompt_text == rb.prompt_text and ra.arrival_s == rb.arrival_s
    assert derive(pairs, seed=4).content_hash != a.content_hash


def test_a_large_workload_made_on_read_equals_one_made_at_once(pairs, monkeypatch):
    """Past `MADE_AT_ONCE` requests a workload makes each request when read
    (`MadeOnRead`): the same requests, columns, meta and content hash as the
    workload made at once, and each read gives the same request again."""
    import workloads.sharegpt.derive as derive_mod
    from workloads.request_seq import MadeOnRead

    eager = derive(pairs)
    monkeypatch.setattr(derive_mod, "MADE_AT_ONCE", 10)
    lazy = derive(pairs)
    assert isinstance(eager.requests, tuple) and isinstance(lazy.requests, MadeOnRead)
    assert len(lazy.requests) == len(eager.requests) == SPEC.requests
    for a, b, again in zip(eager.requests, lazy.requests, lazy.requests, strict=True):
        for r in (b, again):
            assert dataclasses.replace(r, prompt_token_ids=None) == \
                dataclasses.replace(a, prompt_token_ids=None)
            assert r.prompt_token_ids.dtype == a.prompt_token_ids.dtype
            assert np.array_equal(r.prompt_token_ids, a.prompt_token_ids)
    assert list(lazy.requests.arrival_s) == [r.arrival_s for r in eager.requests]
    assert list(lazy.requests.prompt_len) == [r.prompt_len for r in eager.requests]
    assert list(lazy.requests.output_len) == [r.output_len for r in eager.requests]
    assert lazy.requests[-1].request_id == SPEC.requests - 1
    assert [r.request_id for r in lazy.requests[3:6]] == [3, 4, 5]
    assert lazy.meta == eager.meta and lazy.content_hash == eager.content_hash
    assert lazy.longest_request() == eager.longest_request()


def test_q0_and_q1_have_identical_length_and_arrival_sequences(pairs):
    w0, wh, w1 = derive(pairs, q=0.0), derive(pairs, q=0.5), derive(pairs, q=1.0)
    assert lengths(w0) == lengths(wh) == lengths(w1)
    assert [r.arrival_s for r in w0.requests] == [r.arrival_s for r in w1.requests]
    assert all(r.prefix_group == -1 and r.prefix_tokens == 0 for r in w0.requests)
    assert all(r.prefix_group >= 0 for r in w1.requests)
    assert 0 < wh.meta["shared_requests"] < len(wh)
    assert sum(r.prompt_len for r in w0.requests) == sum(r.prompt_len for r in w1.requests)


def test_changing_rate_or_arrival_leaves_prompts_identical(pairs):
    base = derive(pairs)
    for other in (derive(pairs, rate=4.5), derive(pairs, arrival="gamma", burstiness=3.0)):
        assert [r.arrival_s for r in other.requests] != [r.arrival_s for r in base.requests]
        for a, b in zip(base.requests, other.requests, strict=True):
            assert (a.prompt_text, a.output_len, a.prefix_group) == (
                b.prompt_text, b.output_len, b.prefix_group)
            assert np.array_equal(a.prompt_token_ids, b.prompt_token_ids)


def test_shared_contexts_share_leading_ids_and_private_ones_share_nothing(pairs):
    w = derive(pairs, q=0.5)
    L = w.meta["context_tokens"]
    by_group: dict[int, list] = {}
    for r in w.requests:
        by_group.setdefault(r.prefix_group, []).append(r)
    shared = {g: rs for g, rs in by_group.items() if g >= 0}
    assert len(shared) == 3
    heads = set()
    for rs in shared.values():
        first = rs[0].prompt_token_ids[:L]
        assert all(np.array_equal(r.prompt_token_ids[:L], first) for r in rs)
        assert all(r.prefix_tokens == L for r in rs)
        heads.add(tuple(first[:8]))
    private = by_group[-1]
    heads |= {tuple(r.prompt_token_ids[:8]) for r in private}
    assert len(heads) == 3 + len(private)  # no two contexts share even 8 leading ids


def test_prompt_is_context_then_turn_in_text_and_ids(pairs):
    tok = get_tokenizer()
    w = derive(pairs, q=1.0, requests=20)
    L = w.meta["context_tokens"]
    contexts: dict[int, str] = {}
    for r in w.requests:
        context, turn = r.prompt_text.rsplit("\n\n", 1)  # synthetic turns hold no blank line
        assert contexts.setdefault(r.prefix_group, context) == context
        assert np.array_equal(r.prompt_token_ids[L:], tok.encode(turn)[0])
        assert np.array_equal(tok.encode(context)[0], r.prompt_token_ids[:L])


def test_caps_are_enforced_and_bind(pairs):
    w = derive(pairs, q=1.0, requests=300)
    L = w.meta["context_tokens"]
    prompt = np.array([r.prompt_len for r in w.requests])
    out = np.array([r.output_len for r in w.requests])
    assert np.all(prompt + out <= SPEC.max_model_len)
    assert np.all((out >= 1) & (out <= SPEC.max_output))
    assert np.all(prompt - L >= MIN_TURN_TOKENS)
    assert np.any(out == SPEC.max_output)  # the generation cap binds
    squeezed = (out == SPEC.max_model_len - prompt) & (out < SPEC.max_output)
    assert np.any(squeezed)  # and the model length cap binds on others


def test_mean_input_lands_near_the_target(pairs):
    w = derive(pairs, requests=1000)
    assert abs(w.meta["mean_input_tokens"] - 200) < 10
    assert w.meta["mean_input_tokens"] == pytest.approx(
        np.mean([r.prompt_len for r in w.requests]), abs=1e-3)


def test_isolate_salts_every_request_uniquely_and_changes_nothing_else(pairs):
    share, iso = derive(pairs), derive(pairs, isolate=True)
    assert all(r.salt is None for r in share.requests)
    assert [r.salt for r in iso.requests] == [f"iso-3-{i}" for i in range(len(iso))]
    assert [r.prompt_text for r in iso.requests] == [r.prompt_text for r in share.requests]
    assert iso.meta["isolate"] is True and iso.content_hash != share.content_hash


def test_duration_mode_and_longer_runs_extend_shorter_ones(pairs):
    long = derive(pairs, requests=80)
    short = derive(pairs, requests=50)
    assert [r.prompt_text for r in short.requests] == [r.prompt_text for r in long.requests[:50]]
    until = derive(pairs, duration_s=long.requests[40].arrival_s)
    assert len(until) == 40 and until.meta["requests"] == 40
    assert all(r.arrival_s < long.requests[40].arrival_s for r in until.requests)


def test_meta_records_the_recipe(pairs):
    m = derive(pairs).meta
    assert {k: m[k] for k in ("seed", "q", "rate", "arrival", "burstiness", "requests",
                              "contexts", "max_model_len", "max_output", "isolate",
                              "records_read", "truncated", "tokenizer")} == {
        "seed": 3, "q": 0.5, "rate": 2.0, "arrival": "poisson", "burstiness": 1.0,
        "requests": 80, "contexts": 3, "max_model_len": 300, "max_output": 64,
        "isolate": False, "records_read": 300, "truncated": False,
        "tokenizer": "regex-bpe-approx-v1"}
    assert m["dataset"] == "sharegpt.json" and m["mean_input_target"] == 200


@pytest.mark.parametrize("changes, msg", [
    ({"q": 1.5}, "--q must be in"),
    ({"max_output": 300}, r"--max-output must be in \[1, max-model-len 300\)"),
    ({"mean_input_tokens": 400}, r"--mean-input must be in \(4, max-model-len 300\)"),
    ({"mean_input_tokens": 12}, "cannot be reached"),
    ({"arrival": "burst"}, "unknown --arrival"),
])
def test_bad_recipes_raise_one_line_errors(pairs, changes, msg):
    with pytest.raises(HbenchError, match=msg):
        derive(pairs, **changes)


def test_parquet_round_trip_preserves_hash_meta_and_arrays(pairs, tmp_path):
    w = derive(pairs, isolate=True)
    back = load_workload(save_workload(w, tmp_path / "w.parquet"))
    assert back.content_hash == w.content_hash and back.meta == w.meta
    assert all(b.prompt_token_ids.dtype == np.int64 for b in back.requests)
    assert [b.salt for b in back.requests] == [r.salt for r in w.requests]


def test_loading_something_else_is_a_user_error(tmp_path):
    with pytest.raises(HbenchError, match="workload file not found"):
        load_workload(tmp_path / "none.parquet")
    pq.write_table(pa.table({"x": [1]}), tmp_path / "other.parquet")
    with pytest.raises(HbenchError, match="not an hbench workload file"):
        load_workload(tmp_path / "other.parquet")
    (tmp_path / "text.parquet").write_text("hello")
    with pytest.raises(HbenchError, match="not a Parquet workload"):
        load_workload(tmp_path / "text.parquet")


def test_build_workload_with_a_dataset_path_matches_derive(pairs, tmp_path, monkeypatch):
    monkeypatch.setenv("HBENCH_CACHE_DIR", str(tmp_path / "cache"))
    path = write_sharegpt(tmp_path / "sharegpt.json")
    w = build_workload(seed=3, q=0.5, rate=2.0, requests=80, contexts=3, max_model_len=300,
                       max_output=64, mean_input_tokens=200, dataset=path)
    assert w.content_hash == derive(pairs).content_hash


@pytest.mark.parametrize("arrivals, prompts, outputs, msg", [
    ([0.0, -1.0], [5, 5], [1, 1], "request 1: arrival time -1.0"),
    ([0.0, float("nan")], [5, 5], [1, 1], "request 1: arrival time nan"),
    ([0.0, 1.0], [5, 0], [1, 1], "request 1: empty prompt"),
    ([0.0, 1.0], [5, 5], [0, 1], "request 0: output length 0"),
    ([1.0, 0.5], [5, 5], [1, 1], "non-decreasing"),
])
def test_requests_made_on_read_are_checked_by_their_columns(arrivals, prompts, outputs, msg):
    from workloads.request_seq import MadeOnRead
    from workloads.workload import Workload

    def make(i):
        raise AssertionError("the checks read the columns, not the requests")

    seq = MadeOnRead(make, arrival_s=np.array(arrivals), prompt_len=np.array(prompts),
                     output_len=np.array(outputs))
    with pytest.raises(HbenchError, match=msg):
        Workload(requests=seq)
