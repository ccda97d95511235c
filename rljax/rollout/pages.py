"""Host-side bookkeeping of the paged KV cache: which pages each sequence holds.

Pure Python over a numpy refcount array, never traced (the scheduler's side of the
cache; the device pool is in `rljax.rollout.kv_cache`). `PageAllocator` hands out
pages from a free list and counts references, so the n samples of one prompt can share
the prompt's full pages; a page returns to the free list when its last reference is
released. Page 0 is a reserved null page: it is never handed out; padded page-table
entries and padded batch rows point at it, and every read of it is masked out. A token
at position t lives in page `table[t // page_size]`, slot `t % page_size`.
"""

from __future__ import annotations

import math

import numpy as np

NULL_PAGE = 0


class OutOfPagesError(RuntimeError):
    """The allocator has fewer free pages than asked for."""


class PageAllocator:
    """Free list plus reference counts over pages 1 .. num_pages-1 (page 0 is reserved).

    `allocate` returns fresh pages with one reference each; `retain` adds a reference
    (sharing); `release` drops one and frees the page at zero. Releasing a free page or
    retaining a free page is a bug and raises."""

    def __init__(self, num_pages: int):
        if num_pages < 2:
            raise ValueError(f"num_pages must be >= 2 (page 0 is reserved), got {num_pages}")
        self.num_pages = num_pages
        self.refcount = np.zeros(num_pages, np.int32)
        # Pop from the end: low page ids are handed out first.
        self._free = list(range(num_pages - 1, NULL_PAGE, -1))
        self.peak_used = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_pages - 1 - len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfPagesError(f"asked for {n} pages, {len(self._free)} free")
        pages = [self._free.pop() for _ in range(n)]
        self.refcount[pages] = 1
        self.peak_used = max(self.peak_used, self.num_used)
        return pages

    def retain(self, pages: list[int]) -> None:
        for p in pages:
            if p == NULL_PAGE or self.refcount[p] <= 0:
                raise RuntimeError(f"retain of page {p}, which is not allocated")
            self.refcount[p] += 1

    def release(self, pages: list[int]) -> None:
        for p in pages:
            if p == NULL_PAGE or self.refcount[p] <= 0:
                raise RuntimeError(f"release of page {p}, which is not allocated (double free)")
            self.refcount[p] -= 1
            if self.refcount[p] == 0:
                self._free.append(p)

    def reset_peak(self) -> None:
        self.peak_used = self.num_used


class PageTable:
    """One sequence's pages, in order. Leading pages may be shared with other
    sequences (read only); the pages it writes are always its own (refcount 1)."""

    def __init__(self, allocator: PageAllocator):
        self.allocator = allocator
        self.pages: list[int] = []

    def __len__(self) -> int:
        return len(self.pages)

    def grow_to(self, num_pages: int) -> None:
        """Own at least `num_pages` pages (raises OutOfPagesError, changing nothing)."""
        extra = num_pages - len(self.pages)
        if extra > 0:
            self.pages.extend(self.allocator.allocate(extra))

    def adopt(self, pages: list[int]) -> None:
        """Start with `pages`, on which the caller already took one reference each."""
        if self.pages:
            raise RuntimeError("adopt on a non-empty page table")
        self.pages = list(pages)

    def share_from(self, other: "PageTable", num_pages: int) -> None:
        """Start as a reader of `other`'s first `num_pages` pages (one reference each)."""
        if self.pages:
            raise RuntimeError("share_from on a non-empty page table")
        shared = other.pages[:num_pages]
        self.allocator.retain(shared)
        self.pages = list(shared)

    def free(self) -> None:
        self.allocator.release(self.pages)
        self.pages = []

    def writable(self, first_page: int) -> bool:
        """True when every page from `first_page` on is owned by this sequence alone."""
        return all(self.allocator.refcount[p] == 1 for p in self.pages[first_page:])


def pages_for(num_tokens: int, page_size: int) -> int:
    return math.ceil(num_tokens / page_size)
