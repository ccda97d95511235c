"""Paged attention: the reference equals dense attention over the same keys, the blocked
attention and the Pallas decode kernel (interpret mode on CPU) equal the reference, and the TPU ragged kernel's
arguments, built from rows and from mixed steps, give the reference's outputs under JAX's
own reference of that kernel."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.models.attention import segment_mask, xla_attention
from rljax.rollout import SamplingParams
from rljax.rollout.attention import (
    interleave_kv,
    paged_attention_blocked,
    paged_attention_reference,
    paged_attention_tpu,
    paged_decode_attention_pallas,
    ragged_attention_reference,
    ragged_attention_tpu,
)

L, P, S, K, D, N = 2, 40, 4, 2, 16, 8
ON_GPU = jax.default_backend() == "gpu"


def scattered(seed: int, lengths: list[int], width: int):
    """Random dense keys / values per row, written into random distinct pages of a
    pool whose other pages hold garbage. Returns the pool `[L, P, S, 2K, D]`, page table,
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
    # the engine's layout: keys and values interleaved per kv head, [L, P, S, 2K, D]
    pool = interleave_kv(jnp.asarray(k_pool), jnp.asarray(v_pool))
    assert (pool[..., 1::2, :] == v_pool).all() and (pool[..., 0::2, :] == k_pool).all()
    return pool, jnp.asarray(table), k_dense, v_dense


def test_reference_equals_dense_attention_for_a_prefill_chunk():
    lengths, width, t = [13, 7, 16], 4, 5
    pool, table, k_dense, v_dense = scattered(0, lengths, width)
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
        got = paged(q, pool, jnp.int32(layer), table, positions, kv_lens)
        want = dense(q, jnp.asarray(k_dense[layer]), jnp.asarray(v_dense[layer]), mask)
        np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("block_keys", [8, 128])
@pytest.mark.parametrize("t", [1, 5])
def test_blocked_attention_equals_reference(monkeypatch, block_keys, t):
    """Blocks of 2 pages (5 blocks over the 10 live pages of the longest row, the last one
    partly empty) and of the whole table; a row whose length fills its last page, a row
    shorter than a block and a padding row of length 0 (zeros, not NaN)."""
    import rljax.rollout.attention as attention

    monkeypatch.setattr(attention, "BLOCK_KEYS", block_keys)
    width, lengths = 12, [37, 8, 20, 6, 0]
    pool, table, _, _ = scattered(4, lengths, width)
    q = jnp.asarray(np.random.default_rng(5).normal(size=(len(lengths), t, N, D)).astype(np.float32))
    kv_lens = jnp.asarray(lengths, jnp.int32)
    positions = jnp.maximum(kv_lens[:, None] - t + jnp.arange(t)[None], 0)
    for layer in range(L):
        args = (q, pool, jnp.int32(layer), table, positions, kv_lens)
        want = jax.jit(paged_attention_reference)(*args)
        got = jax.jit(paged_attention_blocked)(*args)
        np.testing.assert_allclose(got[:4], want[:4], atol=1e-5)
        np.testing.assert_array_equal(got[4], 0.0)


def test_blocked_attention_stops_after_the_longest_live_row(monkeypatch):
    """Pages listed past the block that holds the longest row's last key are never read:
    filled with NaN they leave the output unchanged (the reference, which gathers the
    whole table, turns NaN)."""
    import rljax.rollout.attention as attention

    monkeypatch.setattr(attention, "BLOCK_KEYS", 2 * S)  # 2 pages per block
    width, lengths = 12, [15, 9, 3]  # the longest row: 4 pages, 2 blocks; columns 4.. unread
    pool, table, _, _ = scattered(6, lengths, width)
    q = jnp.asarray(np.random.default_rng(7).normal(size=(len(lengths), 1, N, D)).astype(np.float32))
    kv_lens = jnp.asarray(lengths, jnp.int32)
    args = (q, pool, jnp.int32(0), table, kv_lens[:, None] - 1, kv_lens)
    clean = paged_attention_blocked(*args)
    poisoned_pages = np.setdiff1d(np.arange(1, P), np.asarray(table))[:width - 4]
    nan_pool = pool.at[:, poisoned_pages].set(jnp.nan)
    nan_table = table.at[:, 4:].set(jnp.asarray(poisoned_pages[: width - 4], jnp.int32)[None])
    np.testing.assert_array_equal(paged_attention_blocked(q, nan_pool, jnp.int32(0), nan_table, *args[4:]), clean)
    assert np.isnan(np.asarray(paged_attention_reference(q, nan_pool, jnp.int32(0), nan_table, *args[4:]))).all()


def test_pallas_decode_kernel_equals_reference():
    # 12-page tables are padded to 16 (8 pages = 32 keys per kernel block): two blocks.
    width, lengths = 12, [45, 1, 33, 5, 0]  # the last row is batch padding: length 0
    pool, table, _, _ = scattered(2, lengths, width)
    rng = np.random.default_rng(3)
    q = jnp.asarray(rng.normal(size=(len(lengths), 1, N, D)).astype(np.float32))
    kv_lens = jnp.asarray(lengths, jnp.int32)
    positions = jnp.maximum(kv_lens - 1, 0)[:, None]
    reference = jax.jit(paged_attention_reference)
    for layer in range(L):
        want = reference(q, pool, jnp.int32(layer), table, positions, kv_lens)
        got = paged_decode_attention_pallas(q, pool, jnp.int32(layer), table, positions, kv_lens,
                                            interpret=not ON_GPU)
        np.testing.assert_allclose(got[:4], want[:4], atol=1e-5)
        assert np.isfinite(np.asarray(got)).all()


def test_pallas_kernel_lowers_to_triton_for_cuda():
    """Pallas -> Triton lowering runs without a GPU (export for the cuda platform); the
    Triton -> PTX compile and the run itself need one (the test above, on a GPU)."""
    sd = jax.ShapeDtypeStruct
    args = (sd((4, 1, 8, 64), jnp.bfloat16), sd((2, 24, 16, 4, 64), jnp.bfloat16), sd((), jnp.int32),
            sd((4, 8), jnp.int32), sd((4, 1), jnp.int32), sd((4,), jnp.int32))
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


# ---- the TPU ragged paged-attention kernel's arguments -------------------------------------


def test_ragged_reference_equals_jax_reference_of_the_tpu_kernel():
    """Our jnp ragged attention (the CPU path of `pallas_tpu`) equals JAX's own reference
    of the ragged kernel (`ref_ragged_paged_attention`) on the kernel's arguments: two
    decode rows, a 7-token chunk starting mid-sequence, a 3-token chunk from position 0,
    and a sequence past `num_seqs`; grouped-query heads (N = 4K)."""
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ref_ragged_paged_attention

    pool, table, _, _ = scattered(6, [45, 1, 33, 3, 8], 12)
    flat = pool.reshape(L * P, *pool.shape[2:])
    ids = table + P  # layer 1's pages
    cu_q_lens = jnp.asarray([0, 1, 2, 9, 12, 12], jnp.int32)
    kv_lens, num_seqs = jnp.asarray([45, 1, 33, 3, 8], jnp.int32), jnp.asarray([4], jnp.int32)
    q = jnp.asarray(np.random.default_rng(7).normal(size=(16, N, D)).astype(np.float32))
    want = ref_ragged_paged_attention(q, flat, kv_lens, ids, cu_q_lens, num_seqs, sm_scale=D**-0.5)
    got = jax.jit(ragged_attention_reference)(q, flat, kv_lens, ids, cu_q_lens, num_seqs)
    np.testing.assert_allclose(got[:12], want[:12], atol=2e-6)
    np.testing.assert_array_equal(got[12:], 0.0)  # queries past the last sequence


@pytest.mark.parametrize("t", [1, 5])
def test_rows_through_the_ragged_kernel_equal_the_reference(t):
    """`pallas_tpu`'s row form (decode steps, t = 1; prefill chunks with padding, t = 5)
    builds ragged arguments whose outputs under JAX's reference of the kernel equal our
    paged reference on the real queries: a row's length is its first position + T, the
    table grows null columns for the padding queries. Rows: full-length, one token, a
    short chunk ending near its last page, and batch padding."""
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ref_ragged_paged_attention

    lengths, width = [45, 1, 47, 0], 12  # row 2: 2 real queries at 45, 46; its padding runs past 48 keys
    pool, table, _, _ = scattered(8, lengths, width)
    n_real = [min(t, 5), 1, min(t, 2), 0]
    starts = [n - k for n, k in zip(lengths, n_real)]
    positions = jnp.asarray([[s + min(i, max(k - 1, 0)) for i in range(t)] for s, k in zip(starts, n_real)], jnp.int32)
    kv_lens = jnp.asarray(lengths, jnp.int32)
    q = jnp.asarray(np.random.default_rng(9).normal(size=(len(lengths), t, N, D)).astype(np.float32))
    want = paged_attention_reference(q, pool, jnp.int32(1), table, positions, kv_lens)
    for on_tpu in (False, True):  # ours on the CPU path; JAX's reference standing in for the kernel
        if on_tpu:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr("jax.experimental.pallas.ops.tpu.ragged_paged_attention.ragged_paged_attention",
                              lambda *a, sm_scale, num_kv_pages_per_block, num_queries_per_block:
                              ref_ragged_paged_attention(*a, sm_scale=sm_scale))  # eager: its loop needs num_seqs
                got = paged_attention_tpu(q, pool, jnp.int32(1), table, positions, kv_lens, on_tpu=True)
        else:
            got = jax.jit(functools.partial(paged_attention_tpu, on_tpu=False))(q, pool, jnp.int32(1), table, positions,
                                                                                kv_lens)
        for b, k in enumerate(n_real):
            np.testing.assert_allclose(got[b, :k], want[b, :k], atol=2e-6)


def test_ragged_tpu_attention_on_a_mesh():
    """On a 2-device mesh the ragged attention runs per shard in shard_map, the pool split
    on kv heads over tensor=2 (as `cache_sharding` lays it out): equal to the unsharded
    call."""
    from jax.sharding import NamedSharding, PartitionSpec as P_

    from rljax.parallel import MeshConfig, make_mesh

    mesh = make_mesh(MeshConfig(data=1, fsdp=1, tensor=2), jax.devices()[:2])
    pool, table, _, _ = scattered(10, [45, 1, 33, 5], 12)
    split = jax.device_put(pool, NamedSharding(mesh, P_(None, None, None, "tensor", None)))
    q = jnp.asarray(np.random.default_rng(11).normal(size=(8, N, D)).astype(np.float32))
    args = (jnp.int32(1), table, jnp.asarray([0, 1, 2, 6, 8], jnp.int32), jnp.asarray([45, 1, 33, 5], jnp.int32),
            jnp.asarray([4], jnp.int32))
    got = jax.jit(functools.partial(ragged_attention_tpu, on_tpu=False, mesh=mesh))(q, split, *args)
    want = ragged_attention_tpu(q, pool, *args, on_tpu=False)
    np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("mixed_steps", [False, True])
@pytest.mark.parametrize("kernel", ["pallas_tpu", "blocked"])
def test_engine_with_the_tpu_kernel_arguments_matches_reference_engine(llama, monkeypatch, kernel, mixed_steps):
    """The engine with `attention=pallas_tpu` (off TPU: the ragged reference on the
    kernel's arguments, for decode, prefill and, with mixed steps, the mixed call's
    ragged rows), and with `blocked` (decode rows in blocks of 2 pages here: up to 6
    blocks), samples the reference engine's greedy tokens and log-probs."""
    import rljax.rollout.attention as attention
    from rljax.rollout import Sampler

    from .conftest import random_prompts, sampler_config

    monkeypatch.setattr(attention, "BLOCK_KEYS", 8)
    prompts = random_prompts([5, 12, 9, 17], seed=13)
    params = SamplingParams(temperature=0.0, max_tokens=7)
    outs = {}
    for name in (kernel, "reference"):
        config = sampler_config(num_pages=64, attention=name, num_scheduler_steps=2, mixed_steps=mixed_steps,
                                max_num_seqs=2)
        with Sampler(llama, config) as sampler:
            outs[name] = sampler.generate(prompts, params)
            if mixed_steps:
                assert sampler.engine.scheduler.stats.num_mixed_steps > 0
    got, want = outs[kernel], outs["reference"]
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert all(len(c.token_ids) == 7 for c in got)
    np.testing.assert_allclose([c.log_probs for c in got], [c.log_probs for c in want], atol=1e-5)


def test_auto_attention_is_the_tpu_kernel_on_tpu_with_the_pool_padded_to_the_lanes():
    from rljax.models.attention import compiling_for
    from rljax.rollout.attention import cache_head_dim, choose_paged_attention, paged_attention

    assert choose_paged_attention("tpu") == "pallas_tpu"  # any head_dim: the pool is padded (below)
    assert choose_paged_attention("cpu") == "blocked" and choose_paged_attention("gpu") == "reference"
    assert [cache_head_dim("pallas_tpu", d) for d in (64, 96, 128, 200)] == [128, 128, 128, 256]
    assert [cache_head_dim(name, 64) for name in ("reference", "blocked", "pallas")] == [64, 64, 64]
    auto = paged_attention("auto", 128, 16)  # on this CPU host
    assert (auto.name, auto.decode, auto.prefill) == ("blocked", paged_attention_blocked, paged_attention_reference)
    with compiling_for("tpu"):  # what `rljax compile` traces under for a TPU topology
        tpu = paged_attention("auto", 64, 16)
        assert tpu.name == "pallas_tpu" and tpu.decode.func is paged_attention_tpu
        assert tpu.decode.keywords["on_tpu"] is True and tpu.ragged.func is ragged_attention_tpu
    assert paged_attention("pallas_tpu", 64, 16).decode.keywords["on_tpu"] is False  # off TPU: the reference
    with pytest.raises(ValueError, match=r"unknown paged attention 'flash'.*pallas_tpu"):
        paged_attention("flash", 128, 16)


def test_a_pool_padded_past_head_dim_gives_the_same_attention():
    """`pallas_tpu` pads the pool's head_dim to the 128 lanes: keys and values padded with
    zeros and q padded (on a TPU) or the pages cut to q's head_dim (the reference) give the
    unpadded attention, scaled by q's own head_dim."""
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ref_ragged_paged_attention

    pool, table, _, _ = scattered(12, [45, 1, 33, 5], 12)  # D = 16
    padded = jnp.pad(pool, ((0, 0),) * 4 + ((0, 128 - D),))
    q = jnp.asarray(np.random.default_rng(13).normal(size=(4, 1, N, D)).astype(np.float32))
    kv_lens = jnp.asarray([45, 1, 33, 5], jnp.int32)
    args = (jnp.int32(0), table, kv_lens[:, None] - 1, kv_lens)
    want = paged_attention_reference(q, pool, *args)
    np.testing.assert_allclose(paged_attention_tpu(q, padded, *args, on_tpu=False), want, atol=2e-6)
    with pytest.MonkeyPatch.context() as patch:  # JAX's reference of the kernel, as the kernel sees the padding
        patch.setattr("jax.experimental.pallas.ops.tpu.ragged_paged_attention.ragged_paged_attention",
                      lambda *a, sm_scale, num_kv_pages_per_block, num_queries_per_block:
                      ref_ragged_paged_attention(*a, sm_scale=sm_scale))
        np.testing.assert_allclose(paged_attention_tpu(q, padded, *args, on_tpu=True), want, atol=2e-6)


@pytest.mark.parametrize("rows", [1, 4])
def test_blocked_decode_program_updates_the_pool_in_place(llama, monkeypatch, rows):
    """The compiled decode program with `blocked` attention (on this CPU, what `auto`
    runs, here in blocks of 2 pages) holds no copy of a pool-sized array. A one-row batch
    is the case to watch: there XLA turns the step's key / value scatter into a
    dynamic-update-slice, and a loop over the pages that reads a reshaped view of the
    pool copies the whole pool in every layer of every step."""
    import re

    import rljax.rollout.attention as attention
    from rljax.rollout import Sampler
    from rljax.rollout.scheduler import StepKind
    from rljax.rollout.step_inputs import pack_step

    from .conftest import random_prompts, sampler_config

    monkeypatch.setattr(attention, "BLOCK_KEYS", 8)  # 2 pages per block
    config = sampler_config(num_pages=64, attention="blocked", batch_buckets=(rows,), max_num_seqs=rows)
    with Sampler(llama, config) as sampler:
        device = sampler.engine.device
        plan = {}
        run = device.run

        def spy(step_plan):
            if step_plan.kind == StepKind.DECODE:
                plan.setdefault("decode", step_plan)
            return run(step_plan)

        device.run = spy
        sampler.generate(random_prompts([9] * rows, seed=3), SamplingParams(temperature=0.0, max_tokens=6))
        inputs = pack_step(plan["decode"], device.buckets)
        text = device.programs[StepKind.DECODE].lower(device.state, device.pool.kv, inputs).compile().as_text()
    layers, pages, page, two_k, d = device.pool.kv.shape
    pool_sized = re.compile(rf"= f32\[({layers},{pages},{page},{two_k},{d}|{layers * pages},{page},{two_k},{d})\]\S* "
                            r"(\S+)\(")
    ops = {m.group(2) for m in pool_sized.finditer(text)}
    assert ops and not ops & {"copy", "transpose", "gather"}, ops
