"""The host scheduler alone, from its contract (`schedule` -> StepPlan, `apply` results ->
finished requests): admission order, chunked prefill, preemption when pages run out and
recomputation after it, prefix-cache reuse, prefix sharing, abort. No model and nothing
compiled: a fake device answers every row with token 5."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rljax.rollout import KVCacheConfig, SamplerConfig, SamplingParams
from rljax.rollout.scheduler import Scheduler, StepKind, StepPlan

TOKEN = 5


def scheduler(num_pages: int = 32, **overrides) -> Scheduler:
    """Pages of 4 tokens, 2 slots, prefill chunks of 8 within 16 padded tokens."""
    base = dict(
        max_num_seqs=2, max_num_batched_tokens=16, max_model_len=32, kv_cache=KVCacheConfig(page_size=4),
        batch_buckets=(2,), prefill_chunk_buckets=(8,), page_table_buckets=(8,), num_scheduler_steps=2,
        enable_prefix_caching=False, share_prefix=False,
    )
    return Scheduler(SamplerConfig(**{**base, **overrides}), num_pages, eos_ids=frozenset({99}), vocab_size=100)


def params(**kw) -> SamplingParams:
    return SamplingParams(**{"max_tokens": 4, "ignore_eos": True, "seed": 0, **kw})


def run(s: Scheduler, plan: StepPlan):
    """The fake device: every sampled token is TOKEN, with log_prob -0.5."""
    shape = (len(plan.rows), max(r.num_steps for r in plan.rows))
    return s.apply(plan, np.full(shape, TOKEN, np.int32), np.full(shape, -0.5, np.float32))


def drain(s: Scheduler) -> list[StepPlan]:
    plans = []
    while (plan := s.schedule()) is not None:
        plans.append(plan)
        run(s, plan)
    return plans


def test_the_scheduler_imports_no_jax():
    """scheduler.py and everything it imports load with jax and flax unimportable (the
    package `__init__`, which exports the engine, is bypassed)."""
    root = Path(__file__).resolve().parents[2]
    code = f"""
import sys, types
class NoJax:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("jax", "jaxlib", "flax"):
            raise ImportError(name + " is blocked")
sys.meta_path.insert(0, NoJax())
import rljax
package = types.ModuleType("rljax.rollout")
package.__path__ = [{str(root / "rljax" / "rollout")!r}]
sys.modules["rljax.rollout"] = package
import rljax.rollout.scheduler
assert not any(m.split(".")[0] in ("jax", "flax") for m in sys.modules)
"""
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


def test_admission_is_first_come_within_the_slots():
    s = scheduler()
    a, b, c = (s.add_request(name, [1, 2, 3], params(max_tokens=2)) for name in "abc")
    plan = s.schedule()
    assert plan.kind is StepKind.PREFILL
    assert [(r.tokens, r.start) for r in plan.rows] == [((1, 2, 3), 0)] * 2  # a and b; c waits for a slot
    assert run(s, plan) == []
    plan = s.schedule()  # both ready to decode; c still waits
    assert plan.kind is StepKind.DECODE
    assert [(r.tokens, r.start, r.num_steps) for r in plan.rows] == [((TOKEN,), 3, 1)] * 2  # 1 token left each
    assert run(s, plan) == [a, b]
    assert [c.token_ids for c in a.completions] == [[TOKEN, TOKEN]] and a.completions[0].finish_reason == "length"
    plan = s.schedule()
    assert plan.kind is StepKind.PREFILL and len(plan.rows) == 1  # c, admitted into a freed slot
    run(s, plan)
    drain(s)
    assert c.remaining == 0 and not s.has_work() and s.allocator.num_used == 0


def test_long_prompts_prefill_in_chunks_sized_by_the_first_one():
    s = scheduler(prefill_chunk_buckets=(4, 8))
    s.add_request("long", list(range(19)), params())
    plans = drain(s)
    prefill = [(r.start, len(r.tokens), len(r.pages)) for p in plans if p.kind is StepKind.PREFILL for r in p.rows]
    assert prefill == [(0, 8, 2), (8, 8, 4), (16, 3, 5)]
    assert plans[3].kind is StepKind.DECODE and plans[3].rows[0].start == 19

    # Two waiting prompts: the first's 3 tokens pick the 4-token chunk for both rows.
    s.add_request("short", [1, 2, 3], params())
    s.add_request("long", list(range(10)), params())
    plan = s.schedule()
    assert [len(r.tokens) for r in plan.rows] == [3, 4]


def test_dry_pool_preempts_the_latest_admitted_and_it_recomputes():
    s = scheduler(num_pages=6)  # 5 usable pages: two 8-token prompts take 4
    a = s.add_request("a", list(range(8)), params(max_tokens=12))
    b = s.add_request("b", list(range(10, 18)), params(max_tokens=2))
    run(s, s.schedule())  # both prompts computed, one token sampled each
    plan = s.schedule()  # a takes the last page for its next 2 steps; b has none left
    assert plan.kind is StepKind.DECODE and len(plan.rows) == 1 and plan.rows[0].tokens == (TOKEN,)
    assert s.stats.num_preemptions == 1 and s.allocator.num_free == 2  # b gave its 2 pages back
    plans = [plan] + ([] if run(s, plan) else drain(s))
    # b waits until a is done, then recomputes its prompt (one 8-token chunk) and
    # continues from its sampled token, which the next decode call feeds
    at = next(i for i, p in enumerate(plans) if p.kind is StepKind.PREFILL)
    assert [(r.tokens, r.start) for r in plans[at].rows] == [(tuple(range(10, 18)), 0)]
    assert [(r.tokens, r.start, r.num_steps) for r in plans[at + 1].rows] == [((TOKEN,), 8, 1)]
    assert len(a.completions[0].token_ids) == 12 and b.completions[0].token_ids == [TOKEN, TOKEN]
    assert s.allocator.num_used == 0


def test_a_later_prompt_reuses_cached_pages():
    s = scheduler(enable_prefix_caching=True)
    first = list(range(10, 20))
    s.add_request("first", first, params(max_tokens=3))
    first_pages = drain(s)[0].rows[0].pages
    # 10 + 3 tokens, 12 computed: 3 full pages cached; a 12-token prompt may take 2 of them
    s.add_request("next", first + [1, 2], params())
    plan = s.schedule()
    assert s.stats.num_cached_prompt_tokens == 8
    assert (plan.rows[0].start, plan.rows[0].tokens) == (8, tuple(first[8:] + [1, 2]))
    assert plan.rows[0].pages[:2] == first_pages[:2]
    run(s, plan)
    s.set_prefix_caching(False)  # dropping the cache frees its pages
    drain(s)
    assert s.allocator.num_used == 0


def test_samples_of_a_request_share_the_prompts_full_pages():
    s = scheduler(max_num_seqs=4, batch_buckets=(4,), max_num_batched_tokens=32, share_prefix=True)
    prompt = list(range(10))
    request = s.add_request("r", prompt, params(n=3, max_tokens=2))
    prefix = s.schedule()
    assert [(r.tokens, r.start) for r in prefix.rows] == [(tuple(prompt[:8]), 0)]  # 2 full pages, once
    run(s, prefix)
    plan = s.schedule()  # each sample computes the last 2 prompt tokens into a page of its own
    assert plan.kind is StepKind.PREFILL
    assert [(r.tokens, r.start, r.sample_index) for r in plan.rows] == [(tuple(prompt[8:]), 8, i) for i in range(3)]
    assert {r.pages[:2] for r in plan.rows} == {prefix.rows[0].pages}
    assert len({r.pages[2] for r in plan.rows}) == 3
    run(s, plan)
    drain(s)
    assert [c.sample_index for c in request.completions] == [0, 1, 2] and s.allocator.num_used == 0


def test_abort_frees_a_requests_pages_and_keeps_the_others():
    s = scheduler()
    doomed = s.add_request("doomed", list(range(7)), params(n=2))  # no sharing: 2 sequences
    run(s, s.schedule())
    kept = s.add_request("kept", [1, 2], params(max_tokens=1))
    s.abort_request(doomed)
    assert s.allocator.num_used == 0 and s.has_work()
    drain(s)
    assert kept.completions[0].token_ids == [TOKEN] and doomed.remaining == 2


def test_stop_tokens_end_a_sample_and_apply_checks_its_plan():
    s = scheduler()
    request = s.add_request("r", [1, 2], params(max_tokens=8, stop_token_ids=(TOKEN,)))
    plan = s.schedule()
    with pytest.raises(RuntimeError, match="not the one in flight"):
        s.apply(StepPlan(plan.kind, plan.rows), np.zeros((1, 1), np.int32), np.zeros((1, 1), np.float32))
    assert run(s, plan) == [request]
    assert (request.completions[0].token_ids, request.completions[0].finish_reason) == ([TOKEN], "stop")
    assert s.schedule() is None and s.stats.num_finished_requests == 1


def test_requests_the_pool_cannot_hold_are_refused():
    s = scheduler()
    with pytest.raises(ValueError, match="max_model_len"):
        s.add_request("r", [1] * 32, params())
    with pytest.raises(ValueError, match="token ids"):
        s.add_request("r", [100], params())


@pytest.mark.parametrize("mixed", [False, True])
def test_a_new_prompt_never_stalls_running_decodes_with_mixed_steps(mixed):
    """Budget 16: two decode rows (bucket 2) leave 14 tokens, so the new prompt's 19
    tokens go in chunks of 8 (the chunk bucket) beside the decodes; in each mixed call the
    decode rows then run the rest of their num_scheduler_steps (2) steps."""
    s = scheduler(max_num_seqs=3, batch_buckets=(1, 2, 4), prefill_chunk_buckets=(4, 8), mixed_steps=mixed)
    a = s.add_request("a", [1, 2, 3], params(max_tokens=8))
    b = s.add_request("b", [4, 5, 6], params(max_tokens=8))
    first = s.schedule()  # both prompts, one token each (a mixed call with no decode rows)
    assert first.kind is (StepKind.MIXED if mixed else StepKind.PREFILL)
    assert first.num_decode_rows == 0 and [r.num_steps for r in first.rows] == [1, 1]
    run(s, first)
    late = s.add_request("late", list(range(19)), params(max_tokens=2))
    plans = drain(s)
    chunks = [(r.start, len(r.tokens)) for p in plans for r in p.rows[p.num_decode_rows:]]
    assert chunks == [(0, 8), (8, 8), (16, 3)]  # the late prompt in the same chunks either way
    first = plans[0]
    if mixed:
        assert [p.kind for p in plans[:3]] == [StepKind.MIXED] * 3
        assert first.num_decode_rows == 2 and first.num_waiting_decodes == 0
        assert [(r.tokens, r.start, r.num_steps) for r in first.rows[:2]] == [((TOKEN,), 3, 2)] * 2
        assert s.stats.num_mixed_steps == 4 and s.stats.num_stalled_calls == 0 and s.stats.num_prefill_steps == 0
    else:
        assert [p.kind for p in plans[:3]] == [StepKind.PREFILL] * 3
        assert first.num_decode_rows == 0 and first.num_waiting_decodes == 2
        assert s.stats.num_stalled_calls == 3 and s.stats.num_mixed_steps == 0
    for request in (a, b, late):
        assert request.remaining == 0
    assert [len(r.completions[0].token_ids) for r in (a, b, late)] == [8, 8, 2]
    assert s.allocator.num_used == 0


def test_mixed_step_preemption_drops_the_decode_row_it_evicted():
    """5 usable pages: a (8 prompt tokens, 2 pages) decodes while b's 12-token prompt
    needs 3 more; the chunk's reservation preempts b itself first (the latest admitted),
    and a keeps decoding alone."""
    s = scheduler(num_pages=6, max_num_batched_tokens=32, mixed_steps=True)
    a = s.add_request("a", list(range(8)), params(max_tokens=10))
    run(s, s.schedule())
    s.add_request("b", list(range(20, 40)), params(max_tokens=2))
    plans = drain(s)
    assert s.stats.num_preemptions > 0
    for p in plans:  # no plan holds a row whose sequence lost its pages
        assert len(p.rows) >= 1 and all(len(r.pages) * 4 >= r.start + len(r.tokens) for r in p.rows)
    assert len(a.completions[0].token_ids) == 10
    assert s.allocator.num_used == 0
