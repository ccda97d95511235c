import jax
import numpy as np
import pytest

from rljax.evaluation import nll_sums, perplexity, perplexity_from_sums


def test_known_values():
    lp = np.log(np.array([[0.5, 0.5, 0.1], [0.25, 0.9, 0.9]], np.float32))
    mask = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    per_seq, corpus = perplexity(lp, mask)
    np.testing.assert_allclose(per_seq, [2.0, 4.0], rtol=1e-6)
    # corpus: token mean over 3 tokens, not the mean of per-sequence perplexities
    np.testing.assert_allclose(corpus, np.exp(-(2 * np.log(0.5) + np.log(0.25)) / 3), rtol=1e-6)


def test_masked_positions_may_hold_anything():
    lp = np.array([[-1.0, -np.inf, np.nan]], np.float32)
    per_seq, corpus = perplexity(lp, np.array([[1, 0, 0]]))
    np.testing.assert_allclose(per_seq, [np.e], rtol=1e-6)
    assert np.isfinite(corpus)


def test_empty_row_is_nan_and_ignored_by_corpus():
    lp = np.full((2, 2), -2.0, np.float32)
    per_seq, corpus = perplexity(lp, np.array([[1, 1], [0, 0]]))
    assert np.isnan(per_seq[1])
    np.testing.assert_allclose(corpus, np.exp(2.0), rtol=1e-6)


def test_streaming_sums_equal_one_batch_and_jit():
    rng = np.random.RandomState(0)
    lp = -rng.rand(6, 5).astype(np.float32) * 3
    mask = (rng.rand(6, 5) > 0.3).astype(np.float32)
    _, whole = jax.jit(perplexity)(lp, mask)
    parts = [nll_sums(lp[i : i + 2], mask[i : i + 2]) for i in range(0, 6, 2)]
    nll = np.concatenate([p[0] for p in parts])
    tokens = np.concatenate([p[1] for p in parts])
    np.testing.assert_allclose(perplexity_from_sums(nll, tokens), whole, rtol=1e-6)


def test_shape_mismatch():
    with pytest.raises(ValueError):
        perplexity(np.zeros((2, 3)), np.zeros((2, 4)))
