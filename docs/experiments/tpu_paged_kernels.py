"""Which TPU paged-attention kernel the sampler's decode step uses: compiled cost for a v5e.

Compiles, for one v5e chip (libtpu's topology description; no TPU needed), one decode
step's attention for one layer at a Qwen2.5-0.5B-like shape (14 query heads, 2 kv heads,
64 decode rows, 2048-token page tables of 16-token pages, 24 layers of pool, bf16), with
head_dim 64 (Qwen2.5-0.5B's own) and 128:

  paged    `jax.experimental.pallas.ops.tpu.paged_attention` on separate key and value
           pools `[K, L, P, S, D]` viewed as `[K, L*P, S, D]`
  ragged   `jax.experimental.pallas.ops.tpu.ragged_paged_attention` (mixed prefill +
           decode rows) on the `[L*P, S, 2K, D]` combined K/V pool it requires (rljax's
           pool, `[L, P, S, 2K, D]`, and what `attention: pallas_tpu` runs)
  xla      the reference: gather the pages through the table, mask, attend

and prints what the compiler reports (`cost_analysis`: FLOPs and HBM bytes, which are 0
for the work inside a Mosaic kernel; `memory_analysis`: temporaries) beside the K/V
bytes a kernel must read for full rows. Run: `JAX_PLATFORMS=cpu python
docs/experiments/tpu_paged_kernels.py` (a minute or two). The figures and the choice
are recorded in docs/design.md ("TPU paged attention for the sampler").
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import SingleDeviceSharding

from rljax.rollout.attention import paged_attention_reference, paged_decode_attention_tpu
from rljax.tpu.topology import parse_slice, slice_devices

ROWS, HEADS, KV_HEADS, LAYERS, PAGE, CONTEXT = 64, 14, 2, 24, 16, 2048
WIDTH = CONTEXT // PAGE  # pages per row
PAGES = ROWS * WIDTH + 1  # one layer's pool: every row full, plus the null page


def compile_one(fn, *args):
    start = time.perf_counter()
    device = next(iter(args[0].sharding.device_set))
    # the abstract mesh tells Pallas the TPU generation (else it asks the default device: this CPU)
    mesh = jax.sharding.Mesh(np.array([device]), ("x",)).abstract_mesh
    try:
        with jax.sharding.use_abstract_mesh(mesh):
            compiled = jax.jit(fn).lower(*args).compile()
    except Exception as e:  # noqa: BLE001 - report, do not stop
        return {"error": f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:160]}"}
    cost = compiled.cost_analysis() or {}
    cost = cost[0] if isinstance(cost, list) else cost
    m = compiled.memory_analysis()
    return {"flops": float(cost.get("flops", 0.0)), "bytes": float(cost.get("bytes accessed", 0.0)),
            "temp": m.temp_size_in_bytes, "seconds": time.perf_counter() - start,
            "custom_call": "tpu_custom_call" in compiled.as_text()}


def main() -> None:
    device = slice_devices(parse_slice("v5e-1"))[0]
    on = SingleDeviceSharding(device)

    def sds(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=on)

    print(f"v5e, one decode step's attention, one layer: {ROWS} rows x {HEADS} heads ({KV_HEADS} kv), "
          f"{WIDTH} pages x {PAGE} tokens per row, pool of {LAYERS} layers x {PAGES} pages, bf16")
    print(f"{'kernel':<8}{'D':>5}{'compiles':>10}{'Mosaic':>8}{'XLA GFLOP':>11}{'XLA GB':>9}{'temp MB':>9}"
          f"{'K/V GB read':>13}{'compile s':>11}")
    for d in (64, 128):
        kv_read = 2 * ROWS * CONTEXT * KV_HEADS * d * 2  # keys + values of full rows, bf16
        q = sds((ROWS, 1, HEADS, d), jnp.bfloat16)
        pool = sds((KV_HEADS, LAYERS, PAGES, PAGE, d), jnp.bfloat16)  # rljax's [K, L, P, S, D]
        table, lens, layer = sds((ROWS, WIDTH), jnp.int32), sds((ROWS,), jnp.int32), sds((), jnp.int32)
        rows = {
            "paged": compile_one(lambda q, k, v, l, t, n: paged_decode_attention_tpu(q, k, v, l, t, n[:, None] - 1, n),
                                 q, pool, pool, layer, table, lens),
            "xla": compile_one(lambda q, k, v, l, t, n: paged_attention_reference(q, k, v, l, t, n[:, None] - 1, n),
                               q, pool, pool, layer, table, lens),
        }
        try:
            from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention

            combined = sds((LAYERS * PAGES, PAGE, 2 * KV_HEADS, d), jnp.bfloat16)  # [L*P, S, 2K, D]

            def ragged(q, kv, t, n):
                cu = jnp.arange(ROWS + 1, dtype=jnp.int32)  # one query token per row
                return ragged_paged_attention(q[:, 0], kv, n, t, cu, jnp.array([ROWS], jnp.int32), sm_scale=d**-0.5,
                                              # explicit blocks: its tuned table reads the local device's kind
                                              num_kv_pages_per_block=16, num_queries_per_block=8)

            rows["ragged"] = compile_one(ragged, q, combined, table, lens)
        except ImportError:
            rows["ragged"] = {"error": "not in this jax"}
        for name, r in rows.items():
            if "error" in r:
                print(f"{name:<8}{d:>5}{'no':>10}  {r['error']}")
                continue
            print(f"{name:<8}{d:>5}{'yes':>10}{'yes' if r['custom_call'] else 'no':>8}{r['flops'] / 1e9:>11.3f}"
                  f"{r['bytes'] / 1e9:>9.3f}{r['temp'] / 1e6:>9.1f}{kv_read / 1e9:>13.3f}{r['seconds']:>11.1f}")


if __name__ == "__main__":
    main()
