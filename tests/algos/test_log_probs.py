"""Aligned token log-probs / entropy (vs torch), SFT loss, and chunked == unchunked."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.algos import (
    compute_entropy_loss,
    entropy_from_logits,
    log_probs_from_hidden,
    sft_loss,
    sft_loss_from_logits,
    token_entropy,
    token_log_probs,
)

B, T, V, H = 2, 5, 11, 4
RNG = np.random.default_rng(0)
LOGITS = RNG.normal(size=(B, T, V)).astype(np.float32)
IDS = RNG.integers(0, V, size=(B, T))


def test_token_log_probs_against_torch():
    ours = jax.jit(functools.partial(token_log_probs, temperature=0.8))(LOGITS, IDS)
    logp = torch.log_softmax(torch.tensor(LOGITS) / 0.8, dim=-1)
    theirs = np.zeros((B, T), np.float32)
    for b in range(B):
        for t in range(1, T):  # token t is predicted by position t - 1
            theirs[b, t] = logp[b, t - 1, IDS[b, t]]
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    assert np.all(np.asarray(ours)[:, 0] == 0.0)


def test_entropy_against_torch():
    ours, aligned = jax.jit(lambda z: (entropy_from_logits(z), token_entropy(z)))(LOGITS)
    theirs = torch.distributions.Categorical(logits=torch.tensor(LOGITS)).entropy().numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    # uniform logits: log V; huge logits stay finite (logsumexp form)
    special = np.array([[0.0, 0.0, 0.0], [1e4, 0.0, -1e4]], np.float32)
    np.testing.assert_allclose(jax.jit(entropy_from_logits)(special), [np.log(3), 0.0], atol=1e-6)
    np.testing.assert_allclose(np.asarray(aligned)[:, 1:], theirs[:, :-1], rtol=1e-5, atol=1e-6)
    mask = np.array([[0, 1, 1, 0, 0], [0, 1, 0, 0, 0]])
    loss, grad = jax.jit(jax.value_and_grad(compute_entropy_loss))(LOGITS, mask)
    assert float(loss) == pytest.approx((theirs[0, 1] + theirs[0, 2] + theirs[1, 1]) / 3, rel=1e-5)
    z = torch.tensor(LOGITS, requires_grad=True)
    ent_t = torch.distributions.Categorical(logits=z).entropy()
    ((ent_t * torch.tensor(mask)).sum() / mask.sum()).backward()
    np.testing.assert_allclose(grad, z.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_sft_loss_against_torch_cross_entropy():
    mask = np.array([[0, 0, 1, 1, 1], [0, 1, 1, 0, 0]])  # aligned with IDS: targets are tokens 2..4 and 1..2
    loss, metrics = jax.jit(sft_loss_from_logits)(LOGITS, IDS, mask)
    ce = torch.nn.functional.cross_entropy(
        torch.tensor(LOGITS[:, :-1]).reshape(-1, V), torch.tensor(IDS[:, 1:]).reshape(-1), reduction="none"
    ).reshape(B, T - 1)
    expected = (ce * torch.tensor(mask[:, 1:])).sum() / mask.sum()
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)
    assert float(metrics["sft/num_tokens"]) == 5.0
    # gradient w.r.t. the logits, against torch autograd of the same cross-entropy
    grad = jax.jit(jax.grad(lambda z: sft_loss_from_logits(z, IDS, mask)[0]))(LOGITS)
    z = torch.tensor(LOGITS, requires_grad=True)
    ce_t = torch.nn.functional.cross_entropy(
        z[:, :-1].reshape(-1, V), torch.tensor(IDS[:, 1:]).reshape(-1), reduction="none"
    )
    ((ce_t.reshape(B, T - 1) * torch.tensor(mask[:, 1:])).sum() / mask.sum()).backward()
    np.testing.assert_allclose(grad, z.grad.numpy(), rtol=1e-5, atol=1e-6)
    # seq-mean-token-mean: mean over the 2 sequences of their per-token mean NLL
    sft_seq = functools.partial(sft_loss, loss_agg_mode="seq-mean-token-mean")
    loss2, _ = jax.jit(lambda z, m: sft_seq(token_log_probs(z, IDS), m))(LOGITS, mask)
    per_seq = (ce * torch.tensor(mask[:, 1:])).sum(-1) / torch.tensor(mask.sum(-1))
    assert float(loss2) == pytest.approx(float(per_seq.mean()), rel=1e-5)


# ---------------------------------------------------------------- from hidden states
HB, HT, HH, HV = 2, 8, 6, 13  # 8 positions per row: chunks of 3 need padding, chunks of 4 do not


def _hidden_data(seed):
    rng = np.random.default_rng(seed)
    hidden = rng.normal(size=(HB, HT, HH)).astype(np.float32)
    unembed = (rng.normal(size=(HH, HV)) * 0.5).astype(np.float32)
    ids = rng.integers(0, HV, size=(HB, HT))
    cot = rng.normal(size=(HB, HT)).astype(np.float32)  # a cotangent, so gradients test every entry
    return hidden, unembed, ids, cot


@functools.cache
def _hidden_fn(chunk_size, temperature=1.0):
    def f(hidden, unembed, ids, cot):
        lp, ent = log_probs_from_hidden(
            hidden, unembed, ids, temperature=temperature, chunk_size=chunk_size, compute_entropy=True
        )
        return jnp.sum(cot * lp) + 0.3 * jnp.sum(cot * ent), (lp, ent)

    return jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))


def test_hidden_unchunked_equals_logits_path():
    hidden, unembed, ids, cot = _hidden_data(0)
    (_, (lp, ent)), _ = _hidden_fn(None, 0.7)(hidden, unembed, ids, cot)
    logits = np.einsum("bth,hv->btv", hidden, unembed)
    ref_lp, ref_ent = jax.jit(lambda z: (token_log_probs(z, ids, 0.7), token_entropy(z, 0.7)))(logits)
    np.testing.assert_allclose(lp, ref_lp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, ref_ent, rtol=1e-5, atol=1e-5)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([3, 4]))
def test_chunked_equals_unchunked_values_and_gradients(seed, chunk_size):
    data = _hidden_data(seed)
    (v0, (lp0, ent0)), (gh0, gw0) = _hidden_fn(None, 0.7)(*data)
    (v1, (lp1, ent1)), (gh1, gw1) = _hidden_fn(chunk_size, 0.7)(*data)
    for a, b in ((v0, v1), (lp0, lp1), (ent0, ent1), (gh0, gh1), (gw0, gw1)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert float(jnp.abs(gw1).sum()) > 0


def test_chunked_bf16_close_to_fp32():
    hidden, unembed, ids, cot = _hidden_data(1)
    (_, (lp32, _)), (_, gw32) = _hidden_fn(None)(hidden, unembed, ids, cot)
    h16, w16 = jnp.asarray(hidden, jnp.bfloat16), jnp.asarray(unembed, jnp.bfloat16)
    (_, (lp16, _)), (gh16, gw16) = _hidden_fn(3)(h16, w16, ids, cot)
    assert lp16.dtype == jnp.float32 and gh16.dtype == jnp.bfloat16 and gw16.dtype == jnp.bfloat16
    np.testing.assert_allclose(lp16, lp32, atol=0.05)
    rel = jnp.linalg.norm(gw16.astype(jnp.float32) - gw32) / jnp.linalg.norm(gw32)
    assert float(rel) < 0.02


def test_chunked_on_a_sharded_batch():
    # batch rows sharded over the 8 test devices: same values and gradients as on one device
    devices = jax.devices()
    if len(devices) < 2:
        pytest.skip("needs several devices")
    n = len(devices)
    rng = np.random.default_rng(3)
    hidden = rng.normal(size=(n, 6, HH)).astype(np.float32)
    unembed = (rng.normal(size=(HH, HV)) * 0.5).astype(np.float32)
    ids = rng.integers(0, HV, size=(n, 6))
    mesh = jax.sharding.Mesh(np.array(devices), ("data",))
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))

    def f(hidden, unembed, ids):
        return jnp.sum(log_probs_from_hidden(hidden, unembed, ids, chunk_size=4) ** 2)

    fn = jax.jit(jax.value_and_grad(f, argnums=(0, 1)))
    v0, (gh0, gw0) = fn(hidden, unembed, ids)
    v1, (gh1, gw1) = fn(jax.device_put(hidden, rows), unembed, jax.device_put(ids, rows))
    np.testing.assert_allclose(v1, v0, rtol=1e-5)
    np.testing.assert_allclose(gh1, gh0, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gw1, gw0, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- chunk size from a byte budget
def test_positions_per_chunk_by_hand():
    from rljax.algos.log_probs import DEFAULT_CHUNK_SIZE, LOGITS_CHUNK_BYTES, logits_chunk_bytes, positions_per_chunk

    assert (LOGITS_CHUNK_BYTES, DEFAULT_CHUNK_SIZE) == (2**30, 256)
    assert logits_chunk_bytes("cpu") == 256 * 2**20 and logits_chunk_bytes("tpu") == logits_chunk_bytes("gpu") == 2**30
    assert positions_per_chunk(112, 64, 49152, 256 * 2**20) == 19  # 21 fit: 6 chunks of 19
    # 64 rows x 49,152 (SmolLM2) = 12 MiB a position: 85 fit in 1 GiB, so 2 chunks of 56 over
    # 112 positions (not 85 + 27: the last chunk would pad 58 positions)
    assert positions_per_chunk(112, 64, 49152) == 56
    assert positions_per_chunk(112, 16, 49152) is None  # all 112 fit (341 would)
    assert positions_per_chunk(1536, 4, 152064) == 256  # 441 would fit: at most 256, 6 chunks
    assert positions_per_chunk(1000, 4, 152064) == 250  # 4 chunks of 250, not 3 x 256 + 232
    assert positions_per_chunk(4096, 8, 151936, budget=4 * 8 * 151936 - 1) == 1  # not even one: one
    assert positions_per_chunk(10, 1, 1, budget=40) is None


def _temp_bytes(chunk_size, rows=64, length=112, vocab=49152, hidden=8, chunk_bytes=2**30):
    def f(h, w, ids):
        return jnp.sum(log_probs_from_hidden(h, w, ids, chunk_size=chunk_size, chunk_bytes=chunk_bytes))

    args = (jax.ShapeDtypeStruct((rows, length, hidden), jnp.float32),
            jax.ShapeDtypeStruct((hidden, vocab), jnp.float32),
            jax.ShapeDtypeStruct((rows, length), jnp.int32))
    return jax.jit(jax.grad(f, argnums=(0, 1))).lower(*args).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("chunk_bytes,chunk", [(2**30, 56), (256 * 2**20, 19)])
def test_auto_chunks_keep_the_logits_within_the_budget(chunk_bytes, chunk):
    # SmolLM2's vocabulary at micro-batch 64: [64, 112, V] fp32 logits are 1.31 GiB; the
    # default chunks keep the backward's temporaries to two chunks (a chunk's logits and
    # their gradient: `rljax plan`'s term), against two full copies
    full, block = 64 * 112 * 49152 * 4, 64 * chunk * 49152 * 4
    assert _temp_bytes(None) > 2 * full
    assert _temp_bytes("auto", chunk_bytes=chunk_bytes) < 2.1 * block
