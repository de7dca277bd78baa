"""Paged KV-cache bookkeeping: which physical block holds which tokens of which sequence.

The cache is `num_blocks` blocks of `block_size` token slots. Block 0 is the padding block: it is
never handed out, so a padded block table (zeros) points at harmless memory. A sequence's
`block_table[i]` holds its tokens `[i * block_size, (i + 1) * block_size)`; slot = block * size + offset.

Prefix caching: once a block is full its contents are final, so it gets a hash chained to its
parent's (`hash((parent_hash, tokens))`). A new sequence whose prompt starts with the same tokens
reuses those blocks (reference counted) instead of computing them. Freed blocks keep their hash
and wait in the free list in LRU order, so a later request can still hit them until the block is
reused for something else:

    free list (OrderedDict):  oldest freed -> ... -> newest freed
    allocation pops the oldest; a hit on a free cached block takes it out of the middle in O(1).

Only this class writes `Sequence.block_table`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from engine.sequence import Sequence

PAD_BLOCK_ID = 0


class Block:
    __slots__ = ("block_id", "ref_count", "block_hash", "prefix_key")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: int | None = None  # set once the block is full
        self.prefix_key: tuple | None = None  # (parent_hash, tokens): verified on every hit

    def reset(self) -> None:
        self.block_hash = None
        self.prefix_key = None


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is padding), got {num_blocks}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_block_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))
        self.cached_block_ids: dict[int, int] = {}  # block_hash -> block_id
        self.prefix_cache_queries = 0  # prompt tokens looked up
        self.prefix_cache_hits = 0  # of those, tokens found in the cache

    # -- queries ----------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def usage(self) -> float:
        """Fraction of usable blocks held by live sequences (cached free blocks count as free)."""
        return 1.0 - self.num_free_blocks / (self.num_blocks - 1)

    def num_blocks_needed(self, seq: Sequence, num_new_tokens: int, num_hit_blocks: int = 0) -> int:
        """Fresh blocks needed to hold `num_new_tokens` more tokens after the computed ones and
        after `num_hit_blocks` cached prefix blocks that are about to be attached."""
        num_slots = seq.num_computed_tokens + num_hit_blocks * self.block_size + num_new_tokens
        total = -(-num_slots // self.block_size)
        return max(0, total - len(seq.block_table) - num_hit_blocks)

    def find_cached_blocks(self, seq: Sequence) -> list[int]:
        """Block ids holding the longest cached prefix of a new sequence's tokens.

        At most `num_tokens - 1` tokens can hit: the last one must be computed to get logits.
        """
        assert not seq.block_table, "only a sequence without blocks looks up the cache"
        if not self.enable_prefix_caching:
            return []
        hits: list[int] = []
        parent_hash: int | None = None
        for start in range(0, seq.num_tokens - 1 - self.block_size + 1, self.block_size):
            key = (parent_hash, tuple(seq.token_ids[start : start + self.block_size]))
            block_id = self.cached_block_ids.get(hash(key))
            if block_id is None or self.blocks[block_id].prefix_key != key:
                break
            hits.append(block_id)
            parent_hash = self.blocks[block_id].block_hash
        return hits

    # -- allocation -------------------------------------------------------------------------

    def allocate(self, seq: Sequence, num_new_tokens: int, hit_block_ids: Iterable[int] = ()) -> bool:
        """Give `seq` room for `num_new_tokens` more tokens, after any cached prefix blocks.

        Returns False, changing nothing, when too few blocks are free.
        """
        hit_block_ids = list(hit_block_ids)
        num_new_blocks = self.num_blocks_needed(seq, num_new_tokens, len(hit_block_ids))
        num_hits_in_free_list = sum(1 for b in hit_block_ids if self.blocks[b].ref_count == 0)
        if num_new_blocks + num_hits_in_free_list > self.num_free_blocks:
            return False
        for block_id in hit_block_ids:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_block_ids[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
        for _ in range(num_new_blocks):
            block_id, _ = self.free_block_ids.popitem(last=False)  # least recently freed
            block = self.blocks[block_id]
            if block.block_hash is not None and self.cached_block_ids.get(block.block_hash) == block_id:
                del self.cached_block_ids[block.block_hash]  # evict its cached contents
            block.reset()
            block.ref_count = 1
            seq.block_table.append(block_id)
        return True

    def record_prefix_lookup(self, num_prompt_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_cache_queries += num_prompt_tokens
        self.prefix_cache_hits += num_hit_tokens

    def free(self, seq: Sequence) -> None:
        """Release the sequence's blocks. Tail blocks go to the free list first, so they are
        evicted before the shared head of a prefix."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_ids[block_id] = None
                if block.block_hash is None:  # nothing worth keeping: hand it out first
                    self.free_block_ids.move_to_end(block_id, last=False)
        seq.block_table = []

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Hash the blocks that became full with the tokens computed so far."""
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        parent_hash: int | None = None
        for i in range(num_full):
            block = self.blocks[seq.block_table[i]]
            if block.block_hash is None:
                start = i * self.block_size
                key = (parent_hash, tuple(seq.token_ids[start : start + self.block_size]))
                block.prefix_key = key
                block.block_hash = hash(key)
                # A duplicate computed concurrently stays unregistered; the first one serves hits.
                self.cached_block_ids.setdefault(block.block_hash, block.block_id)
            parent_hash = block.block_hash

    # -- checks -----------------------------------------------------------------------------

    def check_integrity(self, live: Iterable[Sequence]) -> None:
        """Raise AssertionError unless free list, reference counts and block tables agree."""
        refs = [0] * self.num_blocks
        for seq in live:
            for block_id in seq.block_table:
                assert block_id != PAD_BLOCK_ID, f"{seq.request_id} holds the padding block"
                refs[block_id] += 1
        assert PAD_BLOCK_ID not in self.free_block_ids, "padding block is in the free list"
        for block in self.blocks[1:]:
            assert block.ref_count == refs[block.block_id], (
                f"block {block.block_id}: ref_count {block.ref_count} != {refs[block.block_id]} uses"
            )
            in_free = block.block_id in self.free_block_ids
            assert in_free == (block.ref_count == 0), (
                f"block {block.block_id}: ref_count {block.ref_count} but in free list: {in_free}"
            )
        for block_hash, block_id in self.cached_block_ids.items():
            assert self.blocks[block_id].block_hash == block_hash, f"stale cache entry {block_id}"
