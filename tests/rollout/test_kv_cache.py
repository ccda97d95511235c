"""Page allocator and page tables: property tests over random admit / fork / grow /
finish / preempt sequences (no leak, no double free, no page shared without a
reference, page 0 never handed out) and pool sizing."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.models import ModelConfig
from rljax.rollout import KVCacheConfig, OutOfPagesError, PageAllocator, PageTable, SamplerConfig
from rljax.rollout.kv_cache import plan_cache
from rljax.rollout.pages import NULL_PAGE

OPS = st.lists(
    st.tuples(st.sampled_from(["admit", "fork", "grow", "finish", "preempt"]), st.integers(0, 1000), st.integers(1, 5)),
    max_size=80,
)


def check_invariants(alloc: PageAllocator, tables: list[PageTable]) -> None:
    held: dict[int, int] = {}
    for t in tables:
        assert NULL_PAGE not in t.pages
        assert len(set(t.pages)) == len(t.pages)  # a table never lists a page twice
        for p in t.pages:
            held[p] = held.get(p, 0) + 1
    # Every page a table holds carries exactly that many references, and only those.
    for p in range(1, alloc.num_pages):
        assert alloc.refcount[p] == held.get(p, 0), (p, alloc.refcount[p], held.get(p, 0))
    assert alloc.refcount[NULL_PAGE] == 0
    free = alloc._free
    assert len(set(free)) == len(free)  # no double free
    assert NULL_PAGE not in free
    assert set(free) == {p for p in range(1, alloc.num_pages) if alloc.refcount[p] == 0}  # no leak
    assert alloc.num_used == len(held)


@settings(max_examples=200, deadline=None)
@given(num_pages=st.integers(2, 24), ops=OPS)
def test_random_page_traffic_keeps_invariants(num_pages, ops):
    alloc = PageAllocator(num_pages)
    tables: list[PageTable] = []
    for op, pick, size in ops:
        if op == "admit" or not tables:
            t = PageTable(alloc)
            try:
                t.grow_to(size)
            except OutOfPagesError:
                assert size > alloc.num_free
            tables.append(t)
        else:
            t = tables[pick % len(tables)]
            if op == "fork":
                child = PageTable(alloc)
                shared = min(size, len(t))
                child.share_from(t, shared)
                assert all(alloc.refcount[p] >= 2 for p in child.pages)
                assert not child.writable(0) or shared == 0
                tables.append(child)
            elif op == "grow":
                before = list(t.pages)
                try:
                    t.grow_to(len(t) + size)
                    assert t.writable(len(before))  # new pages are its own
                except OutOfPagesError:
                    assert t.pages == before  # a failed grow changes nothing
            else:  # finish and preempt both hand every reference back
                t.free()
                tables.remove(t)
        check_invariants(alloc, tables)
    for t in tables:
        t.free()
    check_invariants(alloc, [])
    assert alloc.num_free == num_pages - 1


def test_double_free_and_null_page_are_refused():
    alloc = PageAllocator(4)
    pages = alloc.allocate(3)
    assert NULL_PAGE not in pages and sorted(pages) == [1, 2, 3]
    with pytest.raises(OutOfPagesError):
        alloc.allocate(1)
    alloc.release(pages)
    with pytest.raises(RuntimeError, match="double free"):
        alloc.release(pages[:1])
    with pytest.raises(RuntimeError):
        alloc.retain([NULL_PAGE])
    assert alloc.peak_used == 3


def test_plan_cache_sizes_the_pool():
    mc = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    config = SamplerConfig(max_model_len=64, kv_cache=KVCacheConfig(page_size=8, num_pages=20))
    explicit = plan_cache(mc, config, "float32")
    assert explicit.pool_shape == (2, 20, 8, 4, 8)  # [L, P, S, 2K, D]
    assert explicit.bytes_per_page == 2 * 2 * 8 * 2 * 8 * 4
    # CPU reports no free memory: room for max_num_seqs full sequences plus the null page.
    fallback = plan_cache(mc, SamplerConfig(max_num_seqs=3, max_model_len=64, kv_cache=KVCacheConfig(page_size=8)),
                          "bfloat16")
    assert fallback.num_pages == 3 * 8 + 1 and fallback.dtype == "bfloat16"
    with pytest.raises(ValueError, match="fewer than one"):
        plan_cache(mc, SamplerConfig(max_model_len=64, kv_cache=KVCacheConfig(page_size=8, num_pages=5)), "float32")
