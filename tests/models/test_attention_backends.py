"""Attention backends against the `xla` oracle.

On CPU the Pallas kernels (`pallas_gpu`: Triton flash attention, `splash`: TPU splash
attention) run in Pallas interpret mode, forward and backward. cuDNN cannot run on CPU:
its argument plumbing (which mask / lengths reach `jax.nn.dot_product_attention`) is
checked by running the same code with `implementation="xla"`; the tests marked
`gpu` / `tpu` run the real kernels and are skipped elsewhere (launch/gpu_bench.sh runs
this file on the GPU first).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType

from rljax.models import ModelConfig, abstract_model, init_model
from rljax.models import attention as A

B, T, N, K, D = 2, 40, 4, 2, 16  # T not a block multiple: the Pallas kernels pad


def _qkv(dtype=jnp.float32, t=T, d=D, seed=0):
    ks = jax.random.split(jax.random.key(seed), 3)
    return (jax.random.normal(ks[0], (B, t, N, d), dtype), jax.random.normal(ks[1], (B, t, K, d), dtype),
            jax.random.normal(ks[2], (B, t, K, d), dtype))


def _packed(t=T):
    """Row 0: two packed segments then right padding; row 1: left padding, one segment."""
    seg = np.ones((B, t), np.int32)
    seg[0, 15:] = 2
    seg[0, 30:] = 0
    seg[1, :3] = 0
    return jnp.asarray(seg)


def _right_padded(t=T):
    seg = np.ones((B, t), np.int32)
    seg[0, 25:] = 0
    return jnp.asarray(seg)


def _valid(seg):
    return (seg != 0)[:, :, None, None]


def _loss(kernel, seg):
    """Sum of squares over non-padding queries: its gradient reaches q, k, v."""

    def loss(q, k, v):
        out = kernel(q, k, v, seg).astype(jnp.float32)
        return jnp.sum(jnp.where(_valid(seg), out, 0.0) ** 2)

    return loss


def _forward_and_grads(kernel, seg, q, k, v):
    """One jitted program: the kernel's output given segment ids and given the dense
    mask (what the decoder passes today), and the gradient of `_loss`."""

    @jax.jit
    def run(q, k, v):
        grads = jax.grad(_loss(kernel, seg), argnums=(0, 1, 2))(q, k, v)
        return kernel(q, k, v, seg), kernel(q, k, v, A.segment_mask(seg)), grads

    return run(q, k, v)


def _assert_matches_reference(kernel, seg, dtype=jnp.float32, atol=2e-5, grad_atol=1e-4):
    q, k, v = _qkv(dtype)
    ref, _, want = _forward_and_grads(A.xla_attention, seg, q, k, v)
    out, out_from_mask, got = _forward_and_grads(kernel, seg, q, k, v)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert bool(jnp.all(jnp.isfinite(out)))
    for o in (out, out_from_mask):
        diff = jnp.where(_valid(seg), o.astype(jnp.float32) - ref.astype(jnp.float32), 0.0)
        assert float(jnp.max(jnp.abs(diff))) < atol
    for name, g, w in zip("qkv", got, want):
        err = float(jnp.max(jnp.abs(g.astype(jnp.float32) - w.astype(jnp.float32))))
        assert err < grad_atol, (name, err)


# ---- interface --------------------------------------------------------------------------


def test_registry_names_and_unknown_kernel():
    assert {"xla", "cudnn", "pallas_gpu", "splash", "auto"} <= set(A.ATTENTION_KERNELS)
    with pytest.raises(ValueError, match="unknown attention kernel 'flash'"):
        A.get_attention("flash")


@pytest.mark.slow
def test_xla_takes_segment_ids_or_the_dense_mask_alike():
    q, k, v = _qkv()
    seg = _packed()
    xla = jax.jit(A.xla_attention)
    np.testing.assert_array_equal(xla(q, k, v, seg), xla(q, k, v, A.segment_mask(seg)))


def test_segments_from_mask_gives_back_the_mask():
    roundtrip = jax.jit(lambda seg: (A.segment_mask(seg), A.segment_mask(A.segments_from_mask(A.segment_mask(seg)))))
    rng = np.random.default_rng(0)
    for _ in range(5):  # arbitrary ids: 0 = padding anywhere, segments not contiguous
        mask, back = roundtrip(jnp.asarray(rng.integers(0, 4, size=(3, 24)), jnp.int32))
        np.testing.assert_array_equal(back, mask)


def test_segments_from_mask_rejects_other_masks():
    with pytest.raises(ValueError, match="segment mask"):
        A.segments_from_mask(jnp.ones((1, 1, 8), bool))  # a decode step's mask: use xla


def test_is_single_right_padded():
    single = jax.jit(A.is_single_right_padded)
    assert bool(single(_right_padded()))
    assert not bool(single(_packed()))  # packed and left padded
    assert bool(single(jnp.zeros((2, T), jnp.int32)))  # all padding
    assert not bool(single(jnp.asarray(np.repeat([[1, 2]], T // 2, axis=1).repeat(2, axis=0))))


# ---- kernels vs the oracle (CPU: interpret mode) ----------------------------------------


INTERPRETED = {  # the Pallas kernels in interpret mode on any backend (exact float32 math)
    "pallas_gpu": functools.partial(A.pallas_gpu_attention_impl, interpret=True),
    "splash": functools.partial(A.splash_attention_impl, interpret=True),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pallas_gpu", "splash"])
def test_pallas_kernel_matches_reference_interpret(name):
    """Forward and gradients on packed segments, left and right padding, GQA, and a T
    that is not a block multiple (under jit, with the kernel cache cold: nothing traced
    may leak into the cached splash kernel)."""
    A._splash_kernel.cache_clear()
    _assert_matches_reference(INTERPRETED[name], _packed())


@pytest.mark.slow
@pytest.mark.parametrize("seg_fn", [_packed, _right_padded], ids=["packed->mask path", "right-padded->lengths path"])
def test_cudnn_plumbing_with_the_xla_implementation(seg_fn):
    """The cudnn kernel's arguments (causal + lengths, or causal + same-segment mask,
    chosen by `lax.cond`) give the oracle's result when `jax.nn.dot_product_attention`
    runs its xla implementation. The cuDNN kernel itself runs only on GPU."""

    def kernel(q, k, v, seg):
        return A.cudnn_attention_impl(q, k, v, seg, implementation="xla")

    _assert_matches_reference(kernel, seg_fn())


@pytest.mark.slow
def test_cudnn_zeroes_padding_queries_pads_odd_lengths_and_rejects_fp32():
    q, k, v = _qkv(t=T - 1)  # odd T: padded to even (cuDNN's bias path needs it), cut back
    seg = _packed(T - 1)
    out = jax.jit(functools.partial(A.cudnn_attention_impl, implementation="xla"))(q, k, v, seg)
    assert out.shape == q.shape
    assert float(jnp.max(jnp.abs(jnp.where(_valid(seg), 0.0, out)))) == 0.0
    ref = A.xla_attention(q, k, v, seg)
    assert float(jnp.max(jnp.abs(jnp.where(_valid(seg), out - ref, 0.0)))) < 2e-5
    with pytest.raises(ValueError, match="bfloat16 / float16"):
        A.cudnn_attention(q, k, v, seg)


def test_choose_attention_by_platform_and_dtype():
    bf16 = jnp.bfloat16
    assert A.choose_attention("gpu", bf16, 128) == "cudnn"
    assert A.choose_attention("gpu", jnp.float16, 64) == "cudnn"
    assert A.choose_attention("gpu", jnp.float32, 128) == "xla"  # cuDNN flash is bf16/fp16 only
    assert A.choose_attention("gpu", bf16, 256) == "xla"
    assert A.choose_attention("tpu", jnp.float32, 128) == "splash"
    assert A.choose_attention("cpu", bf16, 128) == "xla"
    assert A.choose_attention("gpu", bf16, 128, self_attention=False) == "xla"
    q, k, v = _qkv()
    seg = _packed()
    np.testing.assert_array_equal(jax.jit(A.auto_attention)(q, k, v, seg), jax.jit(A.xla_attention)(q, k, v, seg))


@pytest.mark.slow
def test_auto_dispatches_to_the_chosen_kernel(monkeypatch):
    calls = []
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setitem(A.ATTENTION_KERNELS, "cudnn", lambda q, k, v, s: calls.append("cudnn") or q)
    q, k, v = _qkv(jnp.bfloat16)
    A.auto_attention(q, k, v, _packed())
    A.auto_attention(*_qkv(jnp.float32), _packed())  # fp32 on GPU: xla, not cudnn
    assert calls == ["cudnn"]


def test_auto_resolves_for_the_platform_being_compiled_for(monkeypatch):
    """`compiling_for("tpu")` (ahead-of-time compilation from a CPU host, `rljax compile`)
    makes `auto` pick splash and the Pallas kernels leave interpret mode; outside it the
    process's own backend decides again."""
    calls = []
    for name in list(A.ATTENTION_KERNELS):
        monkeypatch.setitem(A.ATTENTION_KERNELS, name, lambda q, k, v, s, name=name: calls.append(name) or q)
    # traced only, each call its own function (no cached trace): the choice is made when traced
    q, k, v = (jax.ShapeDtypeStruct(shape, jnp.bfloat16) for shape in ((B, T, N, D), (B, T, K, D), (B, T, K, D)))
    seg = jax.ShapeDtypeStruct((B, T), jnp.int32)
    with A.compiling_for("tpu"):
        assert A.target_backend() == "tpu"
        jax.eval_shape(lambda *a: A.auto_attention(*a), q, k, v, seg)
    assert A.target_backend() == jax.default_backend()  # the host's: cpu here, gpu on a GPU machine
    jax.eval_shape(lambda *a: A.auto_attention(*a), q, k, v, seg)
    assert calls == ["splash", A.choose_attention(jax.default_backend(), jnp.bfloat16, D)]
    assert calls[1] != "splash"


@pytest.mark.skipif(jax.device_count() < 4, reason="needs 4 devices")
def test_pallas_kernel_under_a_mesh_runs_per_shard():
    """With a (data, fsdp, tensor) mesh active the Pallas call runs inside shard_map
    (batch over fsdp, heads over tensor) and still equals the oracle."""
    mesh = jax.make_mesh((1, 2, 2), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3,
                         devices=jax.devices()[:4])
    q, k, v = _qkv()
    seg = _packed()
    with jax.set_mesh(mesh):
        out = jax.jit(INTERPRETED["pallas_gpu"])(q, k, v, seg)
    ref = jax.jit(A.xla_attention)(q, k, v, seg)  # one program, not one per operation
    np.testing.assert_allclose(jnp.where(_valid(seg), out, 0), jnp.where(_valid(seg), ref, 0), atol=2e-5)


@pytest.mark.slow
def test_decoder_with_a_pallas_kernel_matches_xla(monkeypatch):
    """The whole decoder (scan over layers) with the Pallas GPU kernel in
    interpret mode gives the xla decoder's logits on packed rows."""
    config = ModelConfig(model_type="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         qkv_bias=True)
    t = 16
    ids = jax.random.randint(jax.random.key(1), (B, t), 0, 64)
    seg = jnp.asarray([[1] * 6 + [2] * 7 + [0] * 3, [0] * 2 + [1] * 14])

    monkeypatch.setitem(A.ATTENTION_KERNELS, "pallas_gpu", INTERPRETED["pallas_gpu"])
    state = jax.jit(lambda: nnx.state(init_model(config)))()  # one compile instead of eager ops

    def logits(attention):
        graphdef = nnx.graphdef(abstract_model(config, attention=attention))
        return jax.jit(lambda s: nnx.merge(graphdef, s)(ids, segment_ids=seg))(state)

    ref, out = logits("xla"), logits("pallas_gpu")
    keep = (seg != 0)[:, :, None]
    np.testing.assert_allclose(jnp.where(keep, out, 0), jnp.where(keep, ref, 0), atol=1e-4)


# ---- the real kernels (run by launch/gpu_bench.sh on a GPU, or on a TPU) ------------------

on_gpu = pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU (cuDNN / Triton)")
on_tpu = pytest.mark.skipif(jax.default_backend() != "tpu", reason="needs a TPU (Mosaic)")


@on_gpu
@pytest.mark.parametrize("seg_fn", [_packed, _right_padded], ids=["packed", "right-padded"])
@pytest.mark.parametrize("name", ["cudnn", "pallas_gpu", "auto"])
def test_gpu_kernel_matches_reference_bf16(name, seg_fn):
    q, k, v = _qkv(jnp.bfloat16, t=256, d=64)
    seg = jnp.asarray(np.repeat(np.asarray(seg_fn()), 256 // T + 1, axis=1)[:, :256])
    kernel = A.get_attention(name)
    ref = A.xla_attention(q, k, v, seg).astype(jnp.float32)
    out = kernel(q, k, v, seg).astype(jnp.float32)
    assert float(jnp.max(jnp.abs(jnp.where(_valid(seg), out - ref, 0)))) < 2e-2
    want = jax.grad(_loss(A.xla_attention, seg), argnums=(0, 1, 2))(q, k, v)
    got = jax.grad(_loss(kernel, seg), argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(got, want):
        w = w.astype(jnp.float32)
        rel = float(jnp.max(jnp.abs(g.astype(jnp.float32) - w)) / (jnp.max(jnp.abs(w)) + 1e-6))
        assert rel < 5e-2


@on_tpu
def test_splash_on_tpu_matches_reference():
    q, k, v = _qkv(jnp.float32, t=256, d=128)
    seg = jnp.asarray(np.repeat(np.asarray(_packed()), 256 // T + 1, axis=1)[:, :256])
    out = A.splash_attention_impl(q, k, v, seg, interpret=False)
    ref = A.xla_attention(q, k, v, seg)
    assert float(jnp.max(jnp.abs(jnp.where(_valid(seg), out - ref, 0)))) < 1e-2
