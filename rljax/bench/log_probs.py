"""`rljax bench log_probs`: memory of token log-probs from hidden states, chunked vs unchunked.

For each dtype pair hidden/unembed (bf16/bf16; bf16 hidden with an fp32 master unembed;
fp32/fp32), pass (forward; forward + backward w.r.t. hidden and unembed) and
implementation (unchunked: [B, T, V] fp32 logits; chunked: `lax.map` over sequence chunks
with `jax.checkpoint`), the jitted function is lowered and compiled on abstract inputs
(nothing is allocated or run) and XLA's compiled memory analysis is read: `temp` is the
scratch memory of the program (where the logits live), `args` and
`out` its inputs and outputs, and `peak` = args + out - alias + temp, an upper bound of
the live bytes. `xla_peak` is XLA's own `peak_memory_in_bytes` where the backend fills it
in (GPU/TPU; on CPU it only counts arguments and outputs).
"""

from __future__ import annotations

import argparse
import time

HELP = "Peak memory of chunked vs unchunked log-probs from hidden states (XLA memory analysis)."

COLUMNS = ["dtype", "pass", "impl", "chunk", "temp_MiB", "args_MiB", "out_MiB", "peak_MiB", "xla_peak_MiB",
           "saving_x", "compile_s"]  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=int, default=8, help="B (default 8)")
    parser.add_argument("--seq-len", type=int, default=4096, help="T (default 4096)")
    parser.add_argument("--vocab", type=int, default=151936, help="V (default 151936, Qwen2/3)")
    parser.add_argument("--hidden", type=int, default=896, help="H (default 896, Qwen2.5-0.5B)")
    parser.add_argument("--chunk-size", type=int, default=None, help="positions per chunk (default: library default)")
    parser.add_argument(
        "--dtypes",
        default="bfloat16/bfloat16,bfloat16/float32,float32/float32",
        help="comma-separated HIDDEN/UNEMBED dtype pairs (bf16 hidden with fp32 master unembed is the mixed case)",
    )
    parser.add_argument("--output", default="bench_results/log_probs.json", help="JSON output path")


def _mib(n: int) -> float:
    return n / 2**20


def _measure(fn, args) -> dict:
    import jax

    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    seconds = time.perf_counter() - start
    stats = compiled.memory_analysis()
    temp, arg, out = stats.temp_size_in_bytes, stats.argument_size_in_bytes, stats.output_size_in_bytes
    xla_peak = getattr(stats, "peak_memory_in_bytes", 0) or 0
    return {
        "temp_MiB": _mib(temp),
        "args_MiB": _mib(arg),
        "out_MiB": _mib(out),
        "peak_MiB": _mib(arg + out - stats.alias_size_in_bytes + temp),
        "xla_peak_MiB": _mib(xla_peak),
        "compile_s": seconds,
    }


def main(args: argparse.Namespace) -> int:
    import jax
    import jax.numpy as jnp

    from rljax.algos.log_probs import DEFAULT_CHUNK_SIZE, log_probs_from_hidden
    from rljax.bench.report import print_table, write_json

    chunk_size = args.chunk_size or DEFAULT_CHUNK_SIZE
    shape = {"batch": args.batch, "seq_len": args.seq_len, "vocab": args.vocab, "hidden": args.hidden}
    print(f"log-probs from hidden states, {shape}, backend={jax.default_backend()}")

    rows = []
    for pair in [d.strip() for d in args.dtypes.split(",") if d.strip()]:
        hidden_name, _, unembed_name = pair.partition("/")
        hidden_dtype, unembed_dtype = jnp.dtype(hidden_name), jnp.dtype(unembed_name or hidden_name)
        dtype_label = f"{hidden_dtype.name}/{unembed_dtype.name}"
        abstract = (
            jax.ShapeDtypeStruct((args.batch, args.seq_len, args.hidden), hidden_dtype),
            jax.ShapeDtypeStruct((args.hidden, args.vocab), unembed_dtype),
            jax.ShapeDtypeStruct((args.batch, args.seq_len), jnp.int32),
        )
        for pass_name in ("fwd", "fwd+bwd"):
            by_impl = {}
            for impl, chunk in (("unchunked", None), ("chunked", chunk_size)):

                def forward(hidden, unembed, input_ids, chunk=chunk):
                    return log_probs_from_hidden(hidden, unembed, input_ids, chunk_size=chunk)

                if pass_name == "fwd":
                    fn = forward
                else:

                    def fn(hidden, unembed, input_ids, forward=forward):
                        loss = lambda h, w: jnp.sum(forward(h, w, input_ids))  # noqa: E731
                        return jax.grad(loss, argnums=(0, 1))(hidden, unembed)

                row = {"dtype": dtype_label, "pass": pass_name, "impl": impl, "chunk": chunk, **_measure(fn, abstract)}
                by_impl[impl] = row
                rows.append(row)
            by_impl["chunked"]["saving_x"] = by_impl["unchunked"]["peak_MiB"] / max(
                by_impl["chunked"]["peak_MiB"], 1e-9
            )

    print_table(rows, COLUMNS)
    write_json(args.output, "log_probs", rows, {"shape": shape, "chunk_size": chunk_size})
    return 0
