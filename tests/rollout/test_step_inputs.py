"""Packing a StepPlan into typed call inputs: padding to the buckets, padded rows and
page-table entries on the null page, positions and sampling fields per row. Nothing is
compiled."""

import jax
import numpy as np

from rljax.rollout import SamplingParams
from rljax.rollout.buckets import Buckets
from rljax.rollout.scheduler import Row
from rljax.rollout.step_inputs import DecodeInputs, pack_decode, pack_prefill

BUCKETS = Buckets(rows=(2, 4), chunk=(4, 8), width=(4, 8))


def row(tokens, start, pages, num_steps=1, **params) -> Row:
    p = SamplingParams(**params)
    return Row(tuple(tokens), start, num_steps, tuple(pages), p, seed=2**32 + 7, sample_index=1)


def test_prefill_rows_are_padded_to_the_buckets():
    rows = [row([11, 12, 13], 4, [3, 5]), row([21, 22, 23, 24, 25], 0, [6, 7], temperature=0.5, top_k=3,
                                             stream=2**32 + 9)]
    x = pack_prefill(rows, BUCKETS)
    assert x.tokens.shape == (2, 8) and x.page_table.shape == (2, 4) and x.label == "[2x8, W=4]"
    np.testing.assert_array_equal(x.tokens[0], [11, 12, 13, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(x.positions[0], [4, 5, 6, 6, 6, 6, 6, 6])  # padding repeats the last
    np.testing.assert_array_equal(x.valid[1], [True] * 5 + [False] * 3)
    np.testing.assert_array_equal(x.page_table, [[3, 5, 0, 0], [6, 7, 0, 0]])
    np.testing.assert_array_equal(x.kv_lens, [7, 5])
    np.testing.assert_array_equal(x.last_index, [2, 4])
    s = x.sampling
    np.testing.assert_array_equal(s.temperature, [1.0, 0.5])
    np.testing.assert_array_equal(s.top_k, [0, 3])
    np.testing.assert_array_equal(s.seeds, [7, 7])  # the seed modulo 2**32
    np.testing.assert_array_equal(s.streams, [[0, 0], [1, 9]])  # high and low 32 bits
    np.testing.assert_array_equal(s.sample_index, [1, 1])


def test_decode_padding_rows_run_no_steps_on_the_null_page():
    rows = [row([9], 17, range(1, 6), num_steps=3), row([8], 2, [6], num_steps=1), row([7], 0, [2], num_steps=2)]
    x = pack_decode(rows, BUCKETS)
    assert isinstance(x, DecodeInputs) and x.label == "[4x1, W=8]"
    np.testing.assert_array_equal(x.tokens, [9, 8, 7, 0])
    np.testing.assert_array_equal(x.positions, [17, 2, 0, 0])
    np.testing.assert_array_equal(x.n_steps, [3, 1, 2, 0])
    np.testing.assert_array_equal(x.page_table[3], [0] * 8)
    np.testing.assert_array_equal(x.sampling.temperature[3], 0.0)  # greedy: no noise drawn for padding
    # one pytree: every array is a leaf that jit sees
    assert len(jax.tree.leaves(x)) == 4 + 7


def test_mixed_inputs_pad_decode_rows_and_chunks_apart():
    from rljax.rollout.scheduler import StepKind, StepPlan
    from rljax.rollout.step_inputs import MixedInputs, pack_step, result_rows

    rows = (row([9], 17, range(1, 6)), row([8], 2, [6]), row([7], 0, [2]),  # three decode rows, one step each
            row([11, 12, 13], 4, [3, 5]), row([21, 22, 23, 24, 25], 0, [6, 7]))  # two chunks
    plan = StepPlan(StepKind.MIXED, rows, num_decode_rows=3)
    x = pack_step(plan, BUCKETS)
    assert isinstance(x, MixedInputs) and x.label == "[4x1+16(2x8), W=8+4]"
    np.testing.assert_array_equal(x.decode.n_steps, [1, 1, 1, 0])
    c = x.chunks  # the chunks flat: 3 + 5 tokens, padded to 16
    np.testing.assert_array_equal(c.tokens[:9], [11, 12, 13, 21, 22, 23, 24, 25, 0])
    np.testing.assert_array_equal(c.positions[:8], [4, 5, 6, 0, 1, 2, 3, 4])
    np.testing.assert_array_equal(c.valid, [True] * 8 + [False] * 8)
    np.testing.assert_array_equal(c.token_row[:8], [0, 0, 0, 1, 1, 1, 1, 1])
    np.testing.assert_array_equal(c.token_col[:8], [0, 1, 2, 0, 1, 2, 3, 4])
    np.testing.assert_array_equal(c.query_index, [[0, 1, 2, 2, 2, 2, 2, 2], [3, 4, 5, 6, 7, 7, 7, 7]])
    np.testing.assert_array_equal(c.last_index, [2, 7])
    np.testing.assert_array_equal(c.kv_lens, [7, 5])
    np.testing.assert_array_equal(c.page_table, [[3, 5, 0, 0], [6, 7, 0, 0]])
    # outputs come back as [4 decode rows + 2 chunk rows]; the plan's rows are 0, 1, 2, 4 and 5
    np.testing.assert_array_equal(result_rows(plan, x), [0, 1, 2, 4, 5])
