"""Compile time of the decoder forward (and forward+backward) against depth.

Layers are scanned, so a 24-layer model should compile about as fast as a 2-layer one.
"""

from __future__ import annotations

import time

HELP = "Compile time of the forward / forward+backward for several depths (scan check)."


def add_arguments(parser) -> None:
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 24])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--out", default="bench_results/compile.json")


def main(args) -> int:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from rljax.bench.report import print_table, write_json
    from rljax.models import ModelConfig, init_model

    rows = []
    for layers in args.layers:
        config = ModelConfig(
            model_type="qwen2", vocab_size=512, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
            num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
            head_dim=args.hidden // 4, qkv_bias=True,
        )
        graphdef, state = nnx.split(init_model(config))
        ids = jnp.zeros((args.batch, args.seq_len), jnp.int32)

        def forward(state, ids):
            return nnx.merge(graphdef, state)(ids)

        def loss(state, ids):
            return forward(state, ids).mean()

        row = {"layers": layers}
        for name, fn in (("forward_s", forward), ("fwd_bwd_s", jax.grad(loss))):
            start = time.perf_counter()
            jax.jit(fn).lower(state, ids).compile()
            row[name] = time.perf_counter() - start
        rows.append(row)
    print_table(rows, ["layers", "forward_s", "fwd_bwd_s"])
    write_json(args.out, "compile", rows)
    return 0
