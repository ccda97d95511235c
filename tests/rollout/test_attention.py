"""Paged attention: the reference equals dense attention over the same keys, and the
Pallas decode kernel (interpret mode on CPU) equals the reference."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.models.attention import segment_mask, xla_attention
from rljax.rollout import SamplingParams
from rljax.rollout.attention import paged_attention_reference, paged_decode_attention_pallas, paged_decode_attention_tpu

L, P, S, K, D, N = 2, 40, 4, 2, 16, 8
ON_GPU = jax.default_backend() == "gpu"


def scattered(seed: int, lengths: list[int], width: int):
    """Random dense keys / values per row, written into random distinct pages of a
    pool whose other pages hold garbage. Returns pools `[K, L, P, S, D]`, page table,
    dense k / v `[L, B, W*S, K, D]`."""
    rng = np.random.default_rng(seed)
    k_pool = rng.normal(size=(L, P, S, K, D)).astype(np.float32)
    v_pool = rng.normal(size=(L, P, S, K, D)).astype(np.float32)
    k_dense = rng.normal(size=(L, len(lengths), width * S, K, D)).astype(np.float32)
    v_dense = rng.normal(size=(L, len(lengths), width * S, K, D)).astype(np.float32)
    table = np.zeros((len(lengths), width), np.int32)
    free = list(rng.permutation(np.arange(1, P)))
    for b, n in enumerate(lengths):
        for j in range(-(-n // S)):
            page = free.pop()
            table[b, j] = page
            k_pool[:, page] = k_dense[:, b, j * S:(j + 1) * S]
            v_pool[:, page] = v_dense[:, b, j * S:(j + 1) * S]
    # the engine's layout: kv-heads-major [K, L, P, S, D]
    k_pool, v_pool = np.moveaxis(k_pool, 3, 0), np.moveaxis(v_pool, 3, 0)
    return jnp.asarray(k_pool), jnp.asarray(v_pool), jnp.asarray(table), k_dense, v_dense


def test_reference_equals_dense_attention_for_a_prefill_chunk():
    lengths, width, t = [13, 7, 16], 4, 5
    k_pool, v_pool, table, k_dense, v_dense = scattered(0, lengths, width)
    rng = np.random.default_rng(1)
    q = jnp.asarray(rng.normal(size=(len(lengths), t, N, D)).astype(np.float32))
    # The chunk is each row's last t tokens.
    positions = jnp.asarray([[n - t + i for i in range(t)] for n in lengths], jnp.int32)
    kv_lens = jnp.asarray(lengths, jnp.int32)
    seg = (np.arange(width * S)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
    full_mask = segment_mask(jnp.asarray(seg))  # [B, W*S, W*S] causal within the row
    mask = jnp.take_along_axis(full_mask, positions[:, :, None], axis=1)
    paged, dense = jax.jit(paged_attention_reference), jax.jit(xla_attention)
    for layer in range(L):
        got = paged(q, k_pool, v_pool, jnp.int32(layer), table, positions, kv_lens)
        want = dense(q, jnp.asarray(k_dense[layer]), jnp.asarray(v_dense[layer]), mask)
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_pallas_decode_kernel_equals_reference():
    # 12-page tables are padded to 16 (8 pages = 32 keys per kernel block): two blocks.
    width, lengths = 12, [45, 1, 33, 5, 0]  # the last row is batch padding: length 0
    k_pool, v_pool, table, _, _ = scattered(2, lengths, width)
    rng = np.random.default_rng(3)
    q = jnp.asarray(rng.normal(size=(len(lengths), 1, N, D)).astype(np.float32))
    kv_lens = jnp.asarray(lengths, jnp.int32)
    positions = jnp.maximum(kv_lens - 1, 0)[:, None]
    reference = jax.jit(paged_attention_reference)
    for layer in range(L):
        want = reference(q, k_pool, v_pool, jnp.int32(layer), table, positions, kv_lens)
        got = paged_decode_attention_pallas(q, k_pool, v_pool, jnp.int32(layer), table, positions, kv_lens,
                                            interpret=not ON_GPU)
        np.testing.assert_allclose(got[:4], want[:4], atol=1e-5)
        assert np.isfinite(np.asarray(got)).all()


def test_pallas_kernel_lowers_to_triton_for_cuda():
    """Pallas -> Triton lowering runs without a GPU (export for the cuda platform); the
    Triton -> PTX compile and the run itself need one (the test above, on a GPU)."""
    sd = jax.ShapeDtypeStruct
    args = (sd((4, 1, 8, 64), jnp.bfloat16), sd((2, 2, 24, 16, 64), jnp.bfloat16),
            sd((2, 2, 24, 16, 64), jnp.bfloat16), sd((), jnp.int32), sd((4, 8), jnp.int32),
            sd((4, 1), jnp.int32), sd((4,), jnp.int32))
    fn = jax.jit(functools.partial(paged_decode_attention_pallas, interpret=False))
    exported = jax.export.export(
        fn, platforms=["cuda"], disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
    )(*args)
    assert "xla.gpu.triton" in exported.mlir_module()


@pytest.mark.slow
def test_engine_with_pallas_decode_matches_reference_engine(llama, roomy_sampler):
    from rljax.rollout import Sampler

    from .conftest import random_prompts, sampler_config

    prompts = random_prompts([5, 12], seed=12)
    params = SamplingParams(temperature=0.0, max_tokens=6)
    with Sampler(llama, sampler_config(num_pages=64, attention="pallas", num_scheduler_steps=1)) as pallas:
        got = pallas.generate(prompts, params)
    want = roomy_sampler.generate(prompts, params)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    np.testing.assert_allclose([c.log_probs for c in got], [c.log_probs for c in want], atol=1e-5)


# ---- the TPU paged-attention kernel (TPU interpret mode on CPU) -----------------------------


def tpu_kernel_case(seed: int, heads: int):
    """Decode queries over scattered pages; pools rounded to bfloat16 (the kernel reads
    K / V through bfloat16, and a run's pools are bfloat16)."""
    width, lengths = 12, [45, 1, 33, 5, 0]  # the last row is batch padding: length 0
    k_pool, v_pool, table, _, _ = scattered(seed, lengths, width)
    k_pool, v_pool = k_pool.astype(jnp.bfloat16), v_pool.astype(jnp.bfloat16)
    rng = np.random.default_rng(seed + 1)
    q = jnp.asarray(rng.normal(size=(len(lengths), 1, heads, D)).astype(np.float32))
    kv_lens = jnp.asarray(lengths, jnp.int32)
    return q, k_pool, v_pool, table, jnp.maximum(kv_lens - 1, 0)[:, None], kv_lens


@pytest.mark.slow
@pytest.mark.parametrize("heads, cores", [(K, 1), (N, 1), (N, 2)])  # 1 or 4 query heads per kv head; megacore
def test_tpu_paged_kernel_equals_reference(heads, cores):
    """12-page tables with 4-token pages: blocks of 16 pages, the table padded with the
    layer's null page; rows of 45, 1, 33 and 5 keys. `cores=2`: a megacore chip (kv heads
    split over its 2 TensorCores, simulated)."""
    q, k_pool, v_pool, table, positions, kv_lens = tpu_kernel_case(4, heads)
    reference = jax.jit(paged_attention_reference)
    kernel = jax.jit(functools.partial(paged_decode_attention_tpu, interpret=True, cores=cores))
    for layer in range(L):
        want = reference(q, k_pool, v_pool, jnp.int32(layer), table, positions, kv_lens)
        got = kernel(q, k_pool, v_pool, jnp.int32(layer), table, positions, kv_lens)
        assert got.shape == want.shape == (5, 1, heads, D)
        np.testing.assert_allclose(got[:4], want[:4], atol=2e-5)
        np.testing.assert_array_equal(got[4], 0.0)  # an empty row: zeros, not NaN


@pytest.mark.slow
@pytest.mark.parametrize("tensor", [2, 1])
def test_tpu_paged_kernel_on_a_mesh(tensor):
    """On a 2-device mesh the kernel runs per shard in shard_map: pools split on kv heads
    over tensor=2 (as `cache_sharding` lays them out), or whole on both devices (fsdp=2,
    the sampler on a training mesh). Both equal the reference."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    from rljax.parallel import MeshConfig, make_mesh

    mesh = make_mesh(MeshConfig(data=1, fsdp=2 // tensor, tensor=tensor), jax.devices()[:2])
    q, k_pool, v_pool, table, positions, kv_lens = tpu_kernel_case(5, N)
    split = NamedSharding(mesh, P("tensor" if tensor > 1 else None, None, None, None, None))
    k_split, v_split = jax.device_put(k_pool, split), jax.device_put(v_pool, split)
    kernel = jax.jit(functools.partial(paged_decode_attention_tpu, interpret=True, mesh=mesh))
    got = kernel(q, k_split, v_split, jnp.int32(1), table, positions, kv_lens)
    want = paged_attention_reference(q, k_pool, v_pool, jnp.int32(1), table, positions, kv_lens)
    np.testing.assert_allclose(got[:4], want[:4], atol=2e-5)


@pytest.mark.slow
def test_engine_with_tpu_paged_decode_matches_reference_engine(llama):
    """The engine with `attention=pallas_tpu` (interpret mode) samples the reference
    engine's greedy tokens. Both pools are bfloat16, what the kernel reads."""
    from rljax.rollout import KVCacheConfig, Sampler

    from .conftest import random_prompts, sampler_config

    prompts = random_prompts([5, 12, 9], seed=13)
    params = SamplingParams(temperature=0.0, max_tokens=7)
    outs = {}
    for name in ("pallas_tpu", "reference"):
        config = sampler_config(num_pages=64, attention=name, num_scheduler_steps=2,
                                kv_cache=KVCacheConfig(page_size=4, num_pages=64, dtype="bfloat16"))
        with Sampler(llama, config) as sampler:
            outs[name] = sampler.generate(prompts, params)
    got, want = outs["pallas_tpu"], outs["reference"]
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert all(len(c.token_ids) == 7 for c in got)
    np.testing.assert_allclose([c.log_probs for c in got], [c.log_probs for c in want], atol=1e-4)


def test_auto_decode_attention_is_the_tpu_kernel_on_tpu_when_head_dim_fills_the_lanes():
    from rljax.models.attention import compiling_for
    from rljax.rollout.attention import choose_decode_attention, decode_attention

    assert choose_decode_attention("tpu", 128) == choose_decode_attention("tpu", 256) == "pallas_tpu"
    for backend, head_dim in [("tpu", 64), ("tpu", 96), ("gpu", 128), ("cpu", 128)]:
        assert choose_decode_attention(backend, head_dim) == "reference"
    assert decode_attention("auto", 128, 16) is paged_attention_reference  # on this CPU host
    with compiling_for("tpu"):  # what `rljax compile` traces under for a TPU topology
        tpu = decode_attention("auto", 128, 16)
        assert tpu.func is paged_decode_attention_tpu and tpu.keywords["interpret"] is False
        assert decode_attention("auto", 64, 16) is paged_attention_reference
        with pytest.raises(ValueError, match=r"pallas_tpu' needs head_dim a multiple of 128 on a TPU, got 64"):
            decode_attention("pallas_tpu", 64, 16)
    assert decode_attention("pallas_tpu", 64, 16).keywords["interpret"] is True  # off TPU: interpret mode
    with pytest.raises(ValueError, match=r"unknown paged attention 'flash'.*pallas_tpu"):
        decode_attention("flash", 128, 16)
