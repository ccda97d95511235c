"""`rljax bench lora`: full fine-tuning against LoRA (each `--ranks`) on one model shape:
the train step's per-device memory and its step time.

Per mode the SFT train step (`rljax.train.steps.make_train_step`, the step every
trainer uses) is compiled ahead of time on the fsdp mesh over all devices. Memory is
XLA's plan for that program per device (`args_GiB`: the train state, base weights and
batch it reads; `temp_GiB`: activations, gradients and scratch; `state_GiB`: train state
alone, params + AdamW moments, from the arrays' shards) plus, on GPU / TPU, the measured
peak. With `--compile-only` nothing is allocated (abstract arrays), so a 1.5B shape is
sized on a CPU. Otherwise `--steps` steps are timed after one warm-up (median), and
`ratio` = full step time / this mode's step time.
"""

from __future__ import annotations

import argparse
import statistics
import time

from rljax.bench.train import add_model_arguments, make_batch, model_config

HELP = "Full fine-tuning vs LoRA: per-device memory of the train step and its step time."

COLUMNS = ["mode", "model", "trained_M", "batch", "seq_len", "args_GiB", "temp_GiB", "state_GiB", "peak_mem_GiB",
           "compile_s", "step_s", "ratio"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p, default="small")
    p.add_argument("--ranks", default="8,64", help="LoRA ranks to compare with full fine-tuning")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--dtype", default="float32", help="compute dtype")
    p.add_argument("--param-dtype", default="float32")
    p.add_argument("--remat", default="none", choices=["none", "full", "save_dots"])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--compile-only", action="store_true", help="memory plan only: abstract arrays, nothing run")
    p.add_argument("--out", default="bench_results/lora.json")


def _gib(n) -> float:
    return n / 2**30


def run_mode(args, config, rank: int) -> dict:
    import jax
    from flax import nnx

    from rljax.models import DTypePolicy, init_model
    from rljax.models.lora import LoRAConfig, add_adapters, split_trainable
    from rljax.parallel import MeshConfig, batch_sharding, make_mesh, shard_local_batch, state_shardings
    from rljax.train.objectives import sft_objective
    from rljax.train.optim import OptimConfig, make_optimizer
    from rljax.train.setup import train_state_shardings
    from rljax.train.steps import init_train_state, make_train_step

    mesh = make_mesh(MeshConfig())
    policy = DTypePolicy(args.param_dtype, args.dtype)

    def create():
        decoder = init_model(config, policy=policy, remat=args.remat)
        if rank:
            add_adapters(decoder, LoRAConfig(rank=rank, alpha=2.0 * rank))
        return decoder

    with jax.set_mesh(mesh):
        abstract = nnx.eval_shape(create)
        graphdef, state = nnx.split(abstract)
        shardings = state_shardings(state, mesh)
        trainable, base = split_trainable(abstract, jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), state, shardings))
        optimizer, schedule = make_optimizer(OptimConfig(lr=1e-5), 1000)
        state_sharding = train_state_shardings(trainable, optimizer, mesh)
        abstract_state = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                                      jax.eval_shape(lambda p: init_train_state(p, optimizer), trainable),
                                      state_sharding)
        host_batch = make_batch(args.batch, args.seq_len, config.vocab_size, 1)
        abstract_batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sharding(mesh))
                          for k, v in host_batch.items()}
        step = make_train_step(graphdef, sft_objective(), optimizer, schedule, 1, state_sharding=state_sharding,
                               batch_sharding=batch_sharding(mesh))
        start = time.perf_counter()
        compiled = step.lower(abstract_state, abstract_batch, None, base).compile()
        compile_s = time.perf_counter() - start
        memory = compiled.memory_analysis()
        state_bytes = sum(_shard_bytes(s) for s in jax.tree.leaves(abstract_state))
        row = {"mode": f"lora r{rank}" if rank else "full", "model": args.model,
               "trained_M": sum(x.size for x in jax.tree.leaves(trainable)) / 1e6,
               "batch": args.batch, "seq_len": args.seq_len,
               "args_GiB": _gib(memory.argument_size_in_bytes) if memory else None,
               "temp_GiB": _gib(memory.temp_size_in_bytes) if memory else None,
               "state_GiB": _gib(state_bytes), "compile_s": compile_s}
        if args.compile_only:
            return row
        from rljax.parallel import sharded_init

        model = sharded_init(create, mesh)
        trainable, base = split_trainable(model)
        train_state = jax.jit(lambda p: init_train_state(p, optimizer), out_shardings=state_sharding)(trainable)
        batch = shard_local_batch(host_batch, mesh)
        train_state, metrics = compiled(train_state, batch, None, base)  # warm-up
        jax.block_until_ready((train_state, metrics))
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            train_state, metrics = compiled(train_state, batch, None, base)
            jax.block_until_ready((train_state, metrics))
            times.append(time.perf_counter() - t0)
        row["step_s"] = statistics.median(times)
        stats = jax.devices()[0].memory_stats() or {}
        if "peak_bytes_in_use" in stats:
            row["peak_mem_GiB"] = _gib(stats["peak_bytes_in_use"])
    return row


def _shard_bytes(s) -> int:
    """Bytes of one device's shard of the abstract array `s`."""
    import math

    import numpy as np

    shape = s.sharding.shard_shape(s.shape)
    return math.prod(shape) * np.dtype(s.dtype).itemsize


def main(args: argparse.Namespace) -> int:
    from rljax.bench.report import print_table, write_json

    config = model_config(args.model)
    rows = [run_mode(args, config, 0)]
    for rank in (int(r) for r in args.ranks.split(",") if r):
        rows.append(run_mode(args, config, rank))
    full = rows[0].get("step_s")
    for row in rows:
        if full and row.get("step_s"):
            row["ratio"] = full / row["step_s"]
    print_table(rows, COLUMNS)
    write_json(args.out, "lora", rows)
    return 0
