"""BlockManager: exact block ids, free-list order, reference counts, prefix-cache hits."""

import pytest

from engine.block_manager import BlockManager
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence


def seq(request_id: str, tokens: list[int]) -> Sequence:
    return Sequence(request_id, tokens, SamplingParams(), arrival_index=0)


def compute(bm: BlockManager, s: Sequence, n: int) -> None:
    """Pretend a step computed n more tokens of s."""
    assert bm.allocate(s, n)
    s.num_computed_tokens += n
    bm.cache_full_blocks(s)


def test_allocation_takes_lowest_free_ids_and_skips_padding_block():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = seq("a", list(range(10)))
    assert bm.allocate(a, 10)
    assert a.block_table == [1, 2, 3]  # ceil(10 / 4) blocks; block 0 is padding
    assert bm.num_free_blocks == 4
    a.num_computed_tokens = 10
    assert bm.allocate(a, 2)  # slots 10, 11 fit in block 3
    assert a.block_table == [1, 2, 3]
    assert bm.allocate(a, 3)  # slots 12..14 need block 4
    assert a.block_table == [1, 2, 3, 4]
    bm.check_integrity([a])


def test_failed_allocation_changes_nothing():
    bm = BlockManager(num_blocks=4, block_size=4)
    a = seq("a", list(range(12)))
    assert not bm.allocate(a, 13)  # needs 4 blocks, 3 usable
    assert a.block_table == [] and bm.num_free_blocks == 3
    assert bm.allocate(a, 12)
    assert bm.num_free_blocks == 0 and bm.usage == 1.0


def test_free_returns_blocks_and_unhashed_blocks_are_reused_first():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    a, b = seq("a", list(range(8))), seq("b", list(range(4)))
    assert bm.allocate(a, 8) and bm.allocate(b, 4)
    assert (a.block_table, b.block_table) == ([1, 2], [3])
    bm.free(a)
    assert a.block_table == [] and bm.num_free_blocks == 6
    c = seq("c", list(range(8)))
    assert bm.allocate(c, 8)
    assert c.block_table == [1, 2]  # freed blocks without content are handed out first
    bm.check_integrity([b, c])


def test_prefix_hit_reuses_full_blocks_with_reference_counts():
    bm = BlockManager(num_blocks=16, block_size=4)
    a = seq("a", list(range(10)))
    compute(bm, a, 10)  # blocks 1, 2 full and hashed; block 3 partial
    b = seq("b", list(range(8)) + [99, 98, 97])
    hits = bm.find_cached_blocks(b)
    assert hits == [1, 2]
    assert bm.allocate(b, 3, hits)
    assert b.block_table == [1, 2, 4]
    assert [bm.blocks[i].ref_count for i in (1, 2, 3, 4)] == [2, 2, 1, 1]
    bm.check_integrity([a, b])


def test_prefix_hit_leaves_the_last_token_to_compute():
    bm = BlockManager(num_blocks=16, block_size=4)
    a = seq("a", list(range(8)))
    compute(bm, a, 8)
    same = seq("same", list(range(8)))
    assert bm.find_cached_blocks(same) == [1]  # 8 tokens cached, but at most 7 may hit


def test_cached_blocks_survive_free_until_evicted_in_lru_order():
    bm = BlockManager(num_blocks=5, block_size=4)  # 4 usable blocks
    a = seq("a", list(range(9)))
    compute(bm, a, 9)  # blocks 1, 2 hashed, 3 partial
    bm.free(a)
    assert bm.num_free_blocks == 4 and bm.usage == 0.0
    # Free list: unhashed first (3, 4), then the hashed tail before the head (2, 1).
    assert list(bm.free_block_ids) == [3, 4, 2, 1]
    b = seq("b", list(range(9)))
    assert bm.find_cached_blocks(b) == [1, 2]
    c = seq("c", [7] * 12)
    assert bm.allocate(c, 12)  # takes 3, 4 and evicts 2 (the later block of a's prefix)
    assert c.block_table == [3, 4, 2]
    assert bm.find_cached_blocks(b) == [1]
    bm.check_integrity([c])


def test_hash_hit_with_different_tokens_is_rejected():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = seq("a", [1, 2, 3, 4, 5])
    compute(bm, a, 5)
    block = bm.blocks[a.block_table[0]]
    block.prefix_key = (None, (9, 9, 9, 9))  # as if another prefix collided on the same hash
    assert bm.find_cached_blocks(seq("b", [1, 2, 3, 4, 5])) == []


def test_prefix_caching_off_never_hits():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    a = seq("a", list(range(9)))
    compute(bm, a, 9)
    assert bm.find_cached_blocks(seq("b", list(range(9)))) == []
    assert bm.cached_block_ids == {}


def test_check_integrity_catches_a_leaked_reference():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = seq("a", list(range(4)))
    assert bm.allocate(a, 4)
    bm.check_integrity([a])
    with pytest.raises(AssertionError, match="block 1"):
        bm.check_integrity([])  # a's block is referenced by nobody the caller knows


def test_too_small_cache_is_rejected():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(num_blocks=1, block_size=4)
