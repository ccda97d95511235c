"""Automatic prefix caching: full KV pages kept after their sequence is gone, found again
by the tokens they hold.

An agent's second turn resends its whole conversation (prompt, first answer, tool
output); a retried or preempted request resends its prompt. Without a cache each of
these recomputes every token. Here, when a sequence finishes (or is preempted, or a
request's shared prompt prefix is forked), its *full* pages are registered under a key
that identifies the exact token prefix they hold, and a new sequence starts by taking
references to the longest run of cached pages that matches its own tokens (leaving at
least one token to compute, whose logits it samples from). It then computes only the
rest.

Keys are exact, not hashes: page i's key is ``(block id of page i-1, its S tokens)``,
where block ids are handed out once and never reused, so two keys are equal only when
the whole prefixes are. A page's contents depend on every earlier token (through
attention), which is why the parent is part of the key.

Memory: the cache holds one reference on each cached page (the `PageAllocator`'s
refcounts). A page only the cache refers to is *evictable*: when the allocator runs dry,
the least recently used such pages go back to the free list before any running sequence
is preempted. Cached pages are never written: a sequence writes only at positions past
the pages it shares, and shared pages are full.

Cached keys and values belong to the parameters that computed them: the engine clears
the cache when it receives new parameters (`update_params`).
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass

from rljax.rollout.pages import PageAllocator

ROOT = -1  # the parent block id of a sequence's first page


@dataclass
class _Block:
    block_id: int
    page: int
    key: tuple


class PrefixCache:
    """Full pages by token prefix, with LRU eviction of pages nobody else holds."""

    def __init__(self, allocator: PageAllocator, page_size: int):
        self.allocator = allocator
        self.page_size = page_size
        self._by_key: dict[tuple, _Block] = {}
        self._lru: collections.OrderedDict[int, _Block] = collections.OrderedDict()  # block id -> block
        self._block_ids = itertools.count()
        self.hit_tokens = 0  # tokens a lookup found cached (not recomputed), since creation
        self.queried_tokens = 0

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def num_evictable(self) -> int:
        """Cached pages that only the cache holds (freed on demand)."""
        return sum(1 for b in self._lru.values() if self.allocator.refcount[b.page] == 1)

    def pages(self) -> list[int]:
        return [b.page for b in self._lru.values()]

    def _chain(self, tokens: list[int], num_pages: int):
        """(key, block or None) for the first `num_pages` full pages of `tokens`, stopping
        at the first page that is not cached (its key is still yielded)."""
        parent = ROOT
        s = self.page_size
        for i in range(num_pages):
            key = (parent, tuple(tokens[i * s:(i + 1) * s]))
            block = self._by_key.get(key)
            yield key, block
            if block is None:
                return
            parent = block.block_id

    def lookup(self, tokens: list[int]) -> list[int]:
        """Pages holding the longest cached run of `tokens`' full pages, at most
        `(len(tokens) - 1) // page_size` of them (one token is always left to compute).
        Takes one reference on each page for the caller."""
        limit = (len(tokens) - 1) // self.page_size
        found = []
        for _, block in self._chain(tokens, limit):
            if block is None:
                break
            self._lru.move_to_end(block.block_id)
            found.append(block.page)
        self.allocator.retain(found)
        self.queried_tokens += len(tokens)
        self.hit_tokens += len(found) * self.page_size
        return found

    def register(self, tokens: list[int], pages: list[int], num_computed: int) -> None:
        """Cache the full pages among `pages` whose `num_computed` tokens are computed
        (page i holds `tokens[i*S:(i+1)*S]`). Pages already cached under the same key are
        skipped; a new block takes one reference on its page."""
        num_full = min(num_computed // self.page_size, len(pages))
        parent = ROOT
        s = self.page_size
        for i in range(num_full):
            key = (parent, tuple(tokens[i * s:(i + 1) * s]))
            block = self._by_key.get(key)
            if block is None:
                block = _Block(next(self._block_ids), pages[i], key)
                self.allocator.retain([pages[i]])
                self._by_key[key] = block
                self._lru[block.block_id] = block
            else:
                self._lru.move_to_end(block.block_id)
            parent = block.block_id

    def evict(self, num_pages: int) -> int:
        """Free up to `num_pages` evictable pages, least recently used first; returns how
        many were freed."""
        freed = 0
        for block_id in list(self._lru):
            if freed >= num_pages:
                break
            block = self._lru[block_id]
            if self.allocator.refcount[block.page] == 1:
                self._drop(block)
                freed += 1
        return freed

    def clear(self) -> None:
        """Forget every block (e.g. new parameters make the cached values stale)."""
        for block in list(self._lru.values()):
            self._drop(block)

    def _drop(self, block: _Block) -> None:
        del self._lru[block.block_id]
        del self._by_key[block.key]
        self.allocator.release([block.page])
