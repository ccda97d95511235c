"""Automatic prefix caching: a later sequence that starts with cached tokens computes only
the rest, and gets exactly what a sampler without the cache gets; eviction under memory
pressure; a parameter update empties the cache; property test of the cache's page
references over random traffic."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.rollout import OutOfPagesError, PageAllocator, PageTable, Sampler, SamplingParams
from rljax.rollout.prefix_cache import PrefixCache

from .conftest import random_prompts, sampler_config, training_log_probs

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def cached_vs_uncached(model, num_pages: int):
    return (Sampler(model, sampler_config(num_pages=num_pages)),
            Sampler(model, sampler_config(num_pages=num_pages, enable_prefix_caching=False)))


@pytest.mark.slow
def test_the_next_turn_reuses_the_conversations_pages(llama):
    cached, plain = cached_vs_uncached(llama, num_pages=64)
    try:
        (first,) = cached.generate(random_prompts([6], seed=1), SamplingParams(temperature=0.0, max_tokens=8,
                                                                               ignore_eos=True))
        assert cached.stats()["num_cached_prompt_tokens"] == 0
        # turn 2: the whole conversation so far plus an observation
        turn2 = first.prompt_token_ids + first.token_ids + random_prompts([3], seed=2)[0]
        (ours,) = cached.generate([turn2], GREEDY)
        (theirs,) = plain.generate([turn2], GREEDY)
        # turn 1 computed 6 + 8 - 1 = 13 tokens: its 3 full pages of 4 are reused
        assert cached.stats()["num_cached_prompt_tokens"] == 12
        assert ours.token_ids == theirs.token_ids
        np.testing.assert_allclose(ours.log_probs, theirs.log_probs, atol=1e-5)
        np.testing.assert_allclose(ours.log_probs, training_log_probs(llama, [ours])[0], atol=1e-5)
        assert cached.stats()["pages_used"] == 0  # cached pages are not "in use"
    finally:
        cached.close()
        plain.close()


@pytest.mark.slow
def test_pressure_evicts_cached_pages_and_outputs_stay_exact(llama):
    """14 pages for 4 slots of up to 12 pages: the cache must give pages back (and
    sequences are preempted) all the time; the tokens equal an uncached sampler's."""
    cached, plain = cached_vs_uncached(llama, num_pages=14)
    try:
        base = random_prompts([6, 13, 9, 17, 5, 11], seed=3)
        prompts = base + [p + [7, 8, 9] for p in base[:4]]  # later prompts extend earlier ones
        params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
        ours = cached.generate(prompts, params)
        again = cached.generate(prompts[:3], params)  # after eviction churn
        theirs = plain.generate(prompts, params)
        assert [c.token_ids for c in ours] == [c.token_ids for c in theirs]
        assert [c.token_ids for c in again] == [c.token_ids for c in theirs[:3]]
        stats = cached.stats()
        assert stats["num_preemptions"] > 0 and stats["num_cached_prompt_tokens"] > 0
        scheduler = cached.engine.scheduler
        cache_pages = scheduler.prefix_cache.pages()
        assert stats["pages_used"] == 0 and stats["num_cached_pages"] == len(cache_pages) > 0
        assert all(scheduler.allocator.refcount[p] == 1 for p in cache_pages)  # the cache's own reference
        assert scheduler.allocator.num_used == len(cache_pages)  # nothing else is held: no leak
    finally:
        cached.close()
        plain.close()


def test_new_parameters_empty_the_cache(llama):
    cached, _ = cached_vs_uncached(llama, num_pages=64)
    _.close()
    try:
        prompts = random_prompts([14], seed=4)
        cached.generate(prompts, GREEDY)
        assert cached.stats()["num_cached_pages"] > 0
        from flax import nnx

        cached.update_params(nnx.state(llama))
        assert cached.stats()["num_cached_pages"] == 0
        assert cached.engine.scheduler.allocator.num_used == 0
    finally:
        cached.close()


# ---- the cache's bookkeeping alone -----------------------------------------------------

PAGE = 2
TOKENS = st.lists(st.integers(0, 3), min_size=1, max_size=12)  # a tiny alphabet: prefixes collide
OPS = st.lists(st.tuples(st.sampled_from(["run", "lookup", "evict", "drop"]), TOKENS, st.integers(0, 1000)),
               max_size=60)


@settings(max_examples=150, deadline=None)
@given(num_pages=st.integers(2, 20), ops=OPS)
def test_cache_references_and_contents_stay_consistent(num_pages, ops):
    """`run`: a sequence takes cached pages for its tokens, allocates the rest, "computes"
    them (we record what each page holds) and finishes (registers, releases). Invariants:
    a page's references = tables holding it + 1 if cached; every page a lookup returns
    holds exactly the tokens asked for; nothing is freed twice or leaked."""
    alloc = PageAllocator(num_pages)
    cache = PrefixCache(alloc, PAGE)
    content: dict[int, tuple] = {}  # page -> the token prefix it was computed for
    held: list[PageTable] = []  # lookups still holding their pages
    for op, tokens, pick in ops:
        if op in ("run", "lookup"):
            table = PageTable(alloc)
            table.adopt(cache.lookup(tokens))
            for i, page in enumerate(table.pages):  # each reused page holds our prefix
                assert content[page] == tuple(tokens[:(i + 1) * PAGE])
            if op == "lookup":
                held.append(table)
            else:
                need = -(-len(tokens) // PAGE)
                short = need - len(table) - alloc.num_free
                if short > 0:
                    cache.evict(short)
                try:
                    table.grow_to(need)
                except OutOfPagesError:  # everything cached is in use by lookups
                    table.free()
                else:
                    for i, page in enumerate(table.pages):
                        content[page] = tuple(tokens[:(i + 1) * PAGE])
                    cache.register(tokens, table.pages, len(tokens) - 1)
                    table.free()
        elif op == "evict":
            cache.evict(pick % 4)
        elif held:
            held.pop(pick % len(held)).free()
        # references: tables + the cache's one per cached page
        refs = np.zeros(num_pages, np.int64)
        for t in held:
            for p in t.pages:
                refs[p] += 1
        for p in cache.pages():
            refs[p] += 1
        np.testing.assert_array_equal(alloc.refcount, refs)
        assert set(alloc._free) == {p for p in range(1, num_pages) if refs[p] == 0}
    for t in held:
        t.free()
    cache.clear()
    assert alloc.num_used == 0 and alloc.num_free == num_pages - 1
