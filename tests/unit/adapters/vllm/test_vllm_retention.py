"""The plugin's retention bookkeeping (adapters/vllm_plugin/retention.py), on
stand-in blocks: which states a running producer holds, and that a hold's
reference is given back exactly once, apart from anyone else's."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from adapters.vllm_plugin.retention import Retention, prefix_key

GROUP = (1).to_bytes(4, "big")      # a KV-cache group id, as vLLM appends it


@dataclass
class Block:
    block_id: int
    prefix: bytes | None            # the chained prefix hash, None: not cached
    tokens: int = 0                 # block_hash_num_tokens
    ref_cnt: int = 1
    is_null: bool = False

    @property
    def block_hash(self):
        return None if self.prefix is None else self.prefix + GROUP

    @property
    def block_hash_num_tokens(self):
        return self.tokens


class Pool:
    def touch(self, blocks):
        for b in blocks:
            b.ref_cnt += 1

    def free_blocks(self, blocks):
        for b in blocks:
            b.ref_cnt -= 1
            assert b.ref_cnt >= 0, b


def arrive(ret: Retention, *prompts: list[bytes]) -> None:
    for hashes in prompts:
        ret.arrived(hashes)


def test_the_prefix_key_drops_vllms_group_id():
    assert prefix_key(b"abcdef" + GROUP) == b"abcdef"


def test_a_state_is_held_once_its_prefix_has_enough_distinct_requests():
    ret = Retention(2, Pool())
    arrive(ret, [b"p1", b"p2"], [b"p1", b"q2"])     # p1: 2 requests, p2: 1
    demanded, alone = Block(7, b"p1", 512), Block(8, b"p2", 1024)
    ret.admitted("a", 0)
    ret.scan("a", [demanded, alone])
    assert (demanded.ref_cnt, alone.ref_cnt) == (2, 1)
    ret.scan("a", [demanded, alone])                # seen: not held twice
    assert demanded.ref_cnt == 2
    assert ret.snapshot()["retention_holds_taken"] == 1


def test_a_request_appearing_twice_in_one_prompt_counts_once():
    ret = Retention(2, Pool())
    arrive(ret, [b"p1", b"p1"])
    block = Block(3, b"p1", 512)
    ret.scan("a", [block])
    assert block.ref_cnt == 1


def test_a_state_the_producer_adopted_is_not_its_to_hold():
    ret = Retention(1, Pool())
    arrive(ret, [b"p1", b"p2"])
    adopted, made = Block(1, b"p1", 512), Block(2, b"p2", 1024)
    ret.admitted("b", 512)
    ret.scan("b", [adopted, made])
    assert (adopted.ref_cnt, made.ref_cnt) == (1, 2)


def test_null_and_uncached_blocks_are_skipped():
    ret = Retention(1, Pool())
    arrive(ret, [b"p1"])
    null, uncached = Block(0, b"p1", 512, is_null=True), Block(4, None)
    ret.scan("a", [null, uncached])
    assert (null.ref_cnt, uncached.ref_cnt) == (1, 1)
    assert ret.holding() == 0


def test_release_gives_back_only_the_holds_and_leaves_a_pin_alone():
    pool = Pool()
    ret = Retention(1, pool)
    arrive(ret, [b"p1", b"p2"])
    a, b = Block(1, b"p1", 512), Block(2, b"p2", 1024)
    ret.scan("a", [a, b])
    pool.touch([a])                                 # someone else's pin on a
    assert (a.ref_cnt, b.ref_cnt) == (3, 2)
    ret.release("a")
    assert (a.ref_cnt, b.ref_cnt) == (2, 1)
    ret.release("a")                                # a second release takes nothing
    assert (a.ref_cnt, b.ref_cnt) == (2, 1)
    snap = ret.snapshot()
    assert snap["retention_holds_released"] == 2 and snap["retention_held"] == 0
    assert snap["retention_held_peak"] == 2


def test_a_preempted_producer_holds_again_what_it_makes_after_resuming():
    ret = Retention(1, Pool())
    arrive(ret, [b"p1", b"p2"])
    a = Block(1, b"p1", 512)
    ret.scan("a", [a])
    ret.release("a")                                # preempted
    ret.admitted("a", 0)
    ret.scan("a", [a])
    assert a.ref_cnt == 2 and ret.holding() == 1


def test_a_threshold_below_one_is_refused():
    with pytest.raises(ValueError, match="threshold must be >= 1"):
        Retention(0, Pool())
