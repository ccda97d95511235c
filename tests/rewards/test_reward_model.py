"""ScalarHeadScorer (bucketed, jitted, batched) against calling the model directly.

The tiny model has few distinct parameter shapes and the sequences few distinct lengths:
on CPU every new shape is a compile, and compiles dominate this file's run time."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.data.tokenizer import build_char_tokenizer
from rljax.models import init_model
from rljax.models.heads import ScalarHeadModel
from rljax.rewards import RewardModelScorer, ScalarHeadScorer
from tests.tiny_models import char_qwen2

CONFIG = char_qwen2()  # the RL reward-model tests' shapes: their random-init programs are shared


@pytest.fixture(scope="module")
def rm():
    return ScalarHeadModel(init_model(CONFIG, seed=0), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def tok():
    tok = build_char_tokenizer()
    assert len(tok) <= CONFIG.vocab_size
    return tok


@nnx.jit
def _call(model, ids, mask):
    return model(ids, mask)


def direct(model, seq):
    """The model called on the one unpadded sequence (jitted: eager dispatch compiles
    every primitive separately, which is slower on CPU)."""
    ids = jnp.asarray(np.asarray(seq, np.int32)[None])
    return float(_call(model, ids, jnp.ones_like(ids))[0])


@pytest.mark.slow
def test_scores_match_direct_call(rm):
    rng = np.random.RandomState(0)
    seqs = [rng.randint(1, CONFIG.vocab_size, size=n).tolist() for n in (5, 12, 8, 12, 5)]
    scorer = ScalarHeadScorer(rm, pad_id=0, batch_size=2, buckets=(8, 16))
    assert isinstance(scorer, RewardModelScorer)
    scores = scorer.score(seqs)
    assert scores.shape == (5,) and scores.dtype == np.float32
    np.testing.assert_allclose(scores, [direct(rm, s) for s in seqs], rtol=1e-5, atol=1e-5)
    # Sorted by length, padded to buckets {8, 16} x one batch size: two programs.
    assert scorer.num_compiled_programs == 2
    np.testing.assert_allclose(scorer.score(seqs[::-1]), scores[::-1], rtol=1e-6, atol=1e-6)
    assert scorer.num_compiled_programs == 2
    # The pad id only fills masked positions.
    scorer.pad_id = 7
    np.testing.assert_allclose(scorer.score(seqs), scores, rtol=1e-5, atol=1e-5)


def test_update_params(rm):
    scorer = ScalarHeadScorer(rm, pad_id=0, batch_size=2, buckets=(8,))
    seq = [3, 4, 5, 6, 7]
    other = ScalarHeadModel(init_model(CONFIG, seed=1), rngs=nnx.Rngs(1))
    before = scorer.score([seq])
    scorer.update_params(other)
    after = scorer.score([seq])
    np.testing.assert_allclose(after, [direct(other, seq)], rtol=1e-5, atol=1e-5)
    assert not np.allclose(before, after)


def test_texts_messages_and_errors(rm, tok):
    scorer = ScalarHeadScorer(rm, tok, batch_size=2, buckets=(32,))
    assert scorer.pad_id == tok.pad_token_id
    msgs = [[{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}]]
    text = tok.apply_chat_template(msgs[0], tokenize=False)
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) <= 32
    from_msgs = scorer.score_messages(msgs)
    np.testing.assert_allclose(from_msgs, scorer.score([ids]))
    np.testing.assert_allclose(scorer.score_texts([text]), from_msgs)
    with pytest.raises(ValueError, match="empty"):
        scorer.score([[]])
    with pytest.raises(ValueError, match="longer than the largest bucket"):
        scorer.score([[1] * 40])
    with pytest.raises(ValueError, match="no tokenizer"):
        ScalarHeadScorer(rm, pad_id=0).score_texts(["x"])
