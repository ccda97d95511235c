"""`rljax bench moe`: the dropless MoE dispatch (sort + `ragged_dot`, `rljax.models.moe.
dispatch`) against a dense reference that runs every expert on every token and weights
the results by the router (`dense_reference`, X / k times the FLOPs).

For each pass (forward; forward + backward w.r.t. the tokens and the expert weights) both
jitted functions are timed on the same random inputs (median of `--repeats` calls after
a warm-up) and compared: `speedup_x` = dense seconds / dispatch seconds, `max_rel_diff`
the largest difference of their outputs (or of any gradient) over that array's largest
magnitude. The routing comes from a random
router with `--top-k` renormalised weights.
"""

from __future__ import annotations

import argparse
import statistics
import time

HELP = "MoE dispatch (sort + ragged_dot) vs a dense all-experts reference: time and agreement."

COLUMNS = ["pass", "impl", "tokens", "experts", "top_k", "median_ms", "speedup_x", "max_rel_diff"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=int, default=2048, help="B * T tokens (default 2048)")
    parser.add_argument("--hidden", type=int, default=256, help="E (default 256)")
    parser.add_argument("--experts", type=int, default=16, help="X (default 16)")
    parser.add_argument("--top-k", type=int, default=2, help="k (default 2)")
    parser.add_argument("--expert-width", type=int, default=128, help="F, each expert's MLP width (default 128)")
    parser.add_argument("--dtype", default="float32", help="float32 | bfloat16 (default float32)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per function (default 5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench_results/moe.json", help="JSON output path")


def _time(fn, args, repeats: int) -> tuple[float, object]:
    import jax

    out = jax.block_until_ready(fn(*args))  # compile + warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main(args: argparse.Namespace) -> int:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from rljax.bench.report import print_table, write_json
    from rljax.models.moe import dense_reference, dispatch, route

    dtype = jnp.dtype(args.dtype)
    keys = jax.random.split(jax.random.key(args.seed), 5)
    e, x, f = args.hidden, args.experts, args.expert_width
    h = jax.random.normal(keys[0], (1, args.tokens, e), jnp.float32).astype(dtype)
    gate, up = (jax.random.normal(k, (x, e, f), jnp.float32).astype(dtype) / np.sqrt(e) for k in keys[1:3])
    down = (jax.random.normal(keys[3], (x, f, e), jnp.float32) / np.sqrt(f)).astype(dtype)
    router = jax.random.normal(keys[4], (e, x), jnp.float32)
    weights, experts, _ = route(h, router, args.top_k, renormalise=True)

    impls = {"dispatch": dispatch, "dense": dense_reference}
    rows = []
    for pass_name in ("fwd", "fwd+bwd"):
        results = {}
        for name, impl in impls.items():
            if pass_name == "fwd":
                fn = jax.jit(lambda h, g, u, d, impl=impl: impl(h, weights, experts, g, u, d))
            else:
                def loss(h, g, u, d, impl=impl):
                    return jnp.sum(impl(h, weights, experts, g, u, d).astype(jnp.float32) ** 2)

                fn = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
            seconds, out = _time(fn, (h, gate, up, down), args.repeats)
            results[name] = (seconds, out)
        diff = max(float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)))
                         / max(float(jnp.max(jnp.abs(b.astype(jnp.float32)))), 1e-30))
                   for a, b in zip(jax.tree.leaves(results["dispatch"][1]), jax.tree.leaves(results["dense"][1])))
        for name, (seconds, _) in results.items():
            rows.append({"pass": pass_name, "impl": name, "tokens": args.tokens, "experts": x, "top_k": args.top_k,
                         "median_ms": 1e3 * seconds,
                         "speedup_x": results["dense"][0] / seconds if name == "dispatch" else 1.0,
                         "max_rel_diff": diff})
    shape = {"tokens": args.tokens, "hidden": e, "experts": x, "top_k": args.top_k, "expert_width": f,
             "dtype": dtype.name}
    print(f"MoE dispatch vs dense reference, {shape}, backend={jax.default_backend()}")
    print_table(rows, COLUMNS)
    write_json(args.out, "moe", rows, {"shape": shape})
    return 0
