"""Paged KV-cache block pool with a prefix cache, in the manner of vLLM V1's KVCacheManager.

Blocks are counted, not materialised. A block is in one of three states:

- **used**: held by a running sequence, privately or as part of a shared
  cached chunk (reference counted: two requests with the same system prompt
  share its blocks, as vLLM does);
- **evictable**: a cached chunk nobody holds; its content stays reusable
  until the space is needed, then the least recently released chunk goes
  first (vLLM's free-block queue is LRU too);
- **free**: no content.

The cache is keyed on prompt *chunks* (see ``workload``: a Mooncake 512-token
block, a system prompt, a conversation turn) rather than on every 16-token
block; a chunk spans ``floor(end / block_size) - floor(start / block_size)``
blocks of its chain, so hit lengths are whole blocks exactly as in vLLM.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["BlockPool"]


class BlockPool:
    """KV blocks of one replica and the prefix cache living in them.

    Attributes:
        total: number of KV blocks.
        used: blocks held by running sequences (private or shared).
        caching: whether prefix caching is enabled (``enable_prefix_caching``).
    """

    __slots__ = ("_entries", "_evictable", "block_size", "caching", "evictable_blocks", "total", "used")

    def __init__(self, total: int, block_size: int, caching: bool) -> None:
        self.total = total
        self.block_size = block_size
        self.caching = caching
        self.used = 0
        self.evictable_blocks = 0
        # key -> [blocks, refcount]
        self._entries: dict[object, list[int]] = {}
        self._evictable: OrderedDict[object, int] = OrderedDict()

    # ------------------------------------------------------------------ capacity
    def available(self) -> int:
        """Blocks that an allocation may take (free plus evictable)."""
        return self.total - self.used

    def usage(self) -> float:
        """Share of blocks in use (vLLM's ``kv_cache_usage_perc``, 0-1)."""
        return self.used / self.total if self.total else 0.0

    def reserve(self, blocks: int) -> bool:
        """Take ``blocks`` for a sequence, evicting cached chunks LRU-first; False if they do not fit."""
        if blocks <= 0:
            return True
        if self.total - self.used < blocks:
            return False
        while self.total - self.used - self.evictable_blocks < blocks:
            key, n = self._evictable.popitem(last=False)
            del self._entries[key]
            self.evictable_blocks -= n
        self.used += blocks
        return True

    def release(self, blocks: int) -> None:
        """Return a sequence's private blocks."""
        self.used -= blocks

    # ------------------------------------------------------------------ prefix cache
    def lookup(self, chain: Sequence[tuple[object, int]]) -> tuple[int, int]:
        """Leading cached chunks of ``chain``: ``(number of chunks, tokens they cover)``."""
        if not self.caching:
            return 0, 0
        entries = self._entries
        count = tokens = 0
        for key, n in chain:
            if key not in entries:
                break
            count += 1
            tokens += n
        return count, tokens

    def acquire(self, key: object) -> int:
        """Take a reference on a cached chunk; returns its blocks."""
        entry = self._entries[key]
        if entry[1] == 0:
            del self._evictable[key]
            self.evictable_blocks -= entry[0]
            self.used += entry[0]
        entry[1] += 1
        return entry[0]

    def register(self, key: object, blocks: int) -> bool:
        """Publish a chunk a sequence has just computed (its private blocks become shared).

        Returns False when the chunk is already cached (computed concurrently
        by another request); the caller then keeps its blocks private.
        """
        if not self.caching or key in self._entries:
            return False
        self._entries[key] = [blocks, 1]
        return True

    def unref(self, key: object) -> None:
        """Drop a reference; an unreferenced chunk becomes evictable (most recently used)."""
        entry = self._entries[key]
        entry[1] -= 1
        if entry[1] == 0:
            self._evictable[key] = entry[0]
            self.evictable_blocks += entry[0]
            self.used -= entry[0]

    def cache_released(self, key: object, blocks: int) -> bool:
        """Keep ``blocks`` a sequence is releasing as an evictable cached chunk (generated tokens)."""
        if not self.caching or blocks <= 0 or key in self._entries:
            return False
        self._entries[key] = [blocks, 0]
        self._evictable[key] = blocks
        self.evictable_blocks += blocks
        self.used -= blocks
        return True

    def resize(self, total: int) -> None:
        """Change the number of blocks (a redeploy with another memory budget); drops cached chunks that no longer fit.

        The caller preempts sequences first when ``used`` exceeds the new total.
        """
        self.total = total
        while self._evictable and self.evictable_blocks > max(0, total - self.used):
            key, n = self._evictable.popitem(last=False)
            del self._entries[key]
            self.evictable_blocks -= n

    def set_caching(self, enabled: bool) -> None:
        """Switch prefix caching; turning it off drops every unreferenced cached chunk."""
        self.caching = enabled
        if not enabled:
            for key in list(self._evictable):
                del self._entries[key]
            self._evictable.clear()
            self.evictable_blocks = 0
