"""`rljax bench train`: tokens/s and MFU of the actor update (forward + backward +
AdamW), optionally next to the same update in `transformers` + PyTorch.

The update is `rljax.train.steps.make_train_step` with the SFT objective (token-mean
cross-entropy from chunked log-probs) on a random-weight model of a preset shape or an HF
`config.json`, on random token rows of `--seq-len` (one segment per row, or `--segments`
packed ones). The step is compiled ahead of time (`compile_s`; XLA's memory plan per
device gives `temp_GiB`, the activations and other scratch, and `args_GiB`, the state and
batch); the first run (`first_s`), `--warmup` untimed steps, then `--steps` timed ones,
each ended by `jax.block_until_ready` on the state and metrics; the median step is
reported (and the best). `peak_mem_GiB` is the device's measured peak (GPU / TPU). With `--torch` the
timed steps of both systems alternate, so that load from other processes (a shared CPU)
hits both alike; `ratio` = torch step time / rljax step time (> 1: rljax is faster).

FLOPs (model FLOPs, `ModelConfig.flops_per_token`, recomputation under remat not
counted):

    flops/token = 3 * (2 * N + 2 * L * T * h * d)

N = non-embedding parameters + the unembedding (vocab x hidden), L layers, T the
sequence length, h query heads of size d (causal attention: half of the 4 T h d of
scores and values per layer). MFU = tokens/s * flops/token / (devices * peak FLOP/s),
the peak from `--peak-flops` or the device kind (`rljax.train.setup.PEAK_FLOPS`).

With `--torch` the same shape runs through `AutoModelForCausalLM` (sdpa attention,
`labels=input_ids` loss, AdamW, clip-norm 1.0) with the same precision recipe: weights
in `--param-dtype`, matmuls in `--dtype` (torch.autocast when they differ), gradient
checkpointing when `--remat` is not none, the same micro-batches.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

HELP = "Actor-update tokens/s and MFU (forward+backward+AdamW); --torch for transformers side by side."

# Model shapes (HF config.json keys); weights are random.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True),
    "small": dict(model_type="qwen2", hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=4096, tie_word_embeddings=True),
    "qwen2.5-0.5b": dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                         tie_word_embeddings=True, rope_theta=1000000.0, max_position_embeddings=32768),
    "qwen2.5-1.5b": dict(model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                         tie_word_embeddings=True, rope_theta=1000000.0, max_position_embeddings=32768),
    "qwen2.5-7b": dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                       tie_word_embeddings=False, rope_theta=1000000.0, max_position_embeddings=32768),
    # a mixture of experts at `tiny`'s size: 8 experts of width 64, top 2 (routing replay: bench mismatch)
    "tiny-moe": dict(model_type="qwen3_moe", hidden_size=64, intermediate_size=128, moe_intermediate_size=64,
                     num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512,
                     tie_word_embeddings=True),
}

COLUMNS = ["system", "model", "params_M", "batch", "seq_len", "micro", "dtype", "remat", "attention", "step_s",
           "best_s", "tok_s", "tflops", "mfu", "compile_s", "first_s", "temp_GiB", "args_GiB", "peak_mem_GiB",
           "ratio"]  # fmt: skip


def hf_config_dict(model: str) -> dict[str, Any]:
    """The HF config dict of a preset name, or read from a config.json (or its folder)."""
    if model in PRESETS:
        return dict(PRESETS[model])
    path = os.path.join(model, "config.json") if os.path.isdir(model) else model
    if not os.path.isfile(path):
        raise SystemExit(f"--model {model!r}: not a preset ({', '.join(PRESETS)}) nor a config.json path")
    with open(path) as f:
        return json.load(f)


def model_config(model: str):
    from rljax.models import ModelConfig

    return ModelConfig.from_hf_dict(hf_config_dict(model))


def add_model_arguments(p: argparse.ArgumentParser, default: str = "tiny") -> None:
    p.add_argument("--model", default=default,
                   help=f"preset ({', '.join(PRESETS)}) or an HF config.json path (random weights)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--batch", type=int, default=8, help="rows per optimizer step (global)")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--dtype", default="bfloat16", help="compute dtype (bfloat16 | float32)")
    p.add_argument("--param-dtype", default="float32", help="parameter / optimizer dtype")
    p.add_argument("--remat", default="none", choices=["none", "full", "save_dots"])
    p.add_argument("--attention", default="auto", help="xla | cudnn | pallas_gpu | splash | auto")
    p.add_argument("--micro-batches", type=int, default=1, help="gradient-accumulation micro-batches per step")
    p.add_argument("--segments", type=int, default=1, help="packed segments per row (1: one full-length sequence)")
    p.add_argument("--steps", type=int, default=5, help="timed steps (median reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps after the compiling one")
    p.add_argument("--peak-flops", type=float, default=0.0, help="peak FLOP/s per device (0: by device kind)")
    p.add_argument("--torch", action="store_true", help="also run transformers + PyTorch on the same device")
    p.add_argument("--torch-threads", type=int, default=0,
                   help="torch CPU threads (0: torch's default; 1 avoids OpenMP stalls on a loaded, shared CPU)")
    p.add_argument("--out", default="bench_results/train.json")


def flops_formula(config, seq_len: int) -> str:
    n = config.num_params(include_embedding=False) + config.vocab_size * config.hidden_size
    return (f"flops/token = 3*(2*N + 2*L*T*h*d) = 3*(2*{n:,} + 2*{config.num_hidden_layers}*{seq_len}*"
            f"{config.num_attention_heads}*{config.head_dim}) = {config.flops_per_token(seq_len):.4g}")


def make_batch(batch: int, seq_len: int, vocab: int, segments: int, seed: int = 0) -> dict:
    """Random rows in the SFT data contract: `segments` equal packed segments per row,
    positions restarting in each, loss on every token but each segment's first."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, size=(batch, seq_len), dtype=np.int32)
    seg_len = -(-seq_len // segments)
    idx = np.arange(seq_len)
    seg = np.broadcast_to((idx // seg_len + 1).astype(np.int32), (batch, seq_len)).copy()
    pos = np.broadcast_to((idx % seg_len).astype(np.int32), (batch, seq_len)).copy()
    loss_mask = (pos != 0).astype(np.float32)
    return {"input_ids": ids, "positions": pos, "segment_ids": seg, "loss_mask": loss_mask}


@dataclass
class Runner:
    """One system's prepared update: `step()` runs one optimizer step and waits for it."""

    system: str
    attention: str
    step: Callable[[], None]
    devices: int
    peak: float
    peak_mem: Callable[[], float | None]
    first_s: float = 0.0
    times: list[float] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    def timed(self) -> None:
        start = time.perf_counter()
        self.step()
        self.times.append(time.perf_counter() - start)

    def row(self, args, config) -> dict:
        tokens = args.batch * args.seq_len
        step_s = statistics.median(self.times)
        flops = tokens * config.flops_per_token(args.seq_len) / step_s
        return {
            "system": self.system, "model": os.path.basename(args.model.rstrip("/")),
            "params_M": config.num_params() / 1e6, "batch": args.batch, "seq_len": args.seq_len,
            "micro": args.micro_batches, "dtype": args.dtype, "remat": args.remat, "attention": self.attention,
            "step_s": step_s, "best_s": min(self.times), "tok_s": tokens / step_s,
            "tflops": flops / self.devices / 1e12, "mfu": flops / (self.devices * self.peak) if self.peak else None,
            "first_s": self.first_s, "peak_mem_GiB": self.peak_mem(), **self.extra,
        }


def _jax_peak_mem_gib() -> float | None:
    import jax

    stats = jax.local_devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return peak / 2**30 if peak else None


def prepare_rljax(args, config) -> Runner:
    """The jitted actor update on a mesh over every device (fsdp), its state donated."""
    import jax

    from rljax.models import DTypePolicy, init_model
    from rljax.models.attention import choose_attention
    from rljax.parallel import MeshConfig, batch_sharding, check_batch, make_mesh, shard_local_batch, sharded_init
    from rljax.train.objectives import sft_objective
    from rljax.train.optim import OptimConfig, make_optimizer
    from rljax.train.setup import init_sharded_train_state, peak_flops, place, train_state_shardings
    from rljax.train.steps import make_train_step

    mesh = make_mesh(MeshConfig())
    check_batch(args.batch // args.micro_batches, mesh, "rows per micro-batch")
    policy = DTypePolicy(args.param_dtype, args.dtype)
    attention = args.attention
    if attention == "auto":
        attention = choose_attention(jax.default_backend(), policy.compute, config.head_dim)
    model = sharded_init(lambda: init_model(config, policy=policy, remat=args.remat, attention=attention), mesh)
    graphdef, params = place(model, mesh)
    del model
    optimizer, schedule = make_optimizer(OptimConfig(lr=1e-5), total_steps=1000)
    holder = {"state": init_sharded_train_state(params, optimizer, 0, mesh)}
    update = make_train_step(graphdef, sft_objective(), optimizer, schedule, args.micro_batches,
                             state_sharding=train_state_shardings(params, optimizer, mesh),
                             batch_sharding=batch_sharding(mesh))
    batch = shard_local_batch(make_batch(args.batch, args.seq_len, config.vocab_size, args.segments), mesh)
    start = time.perf_counter()
    compiled = update.lower(holder["state"], batch, None, None).compile()
    compile_s = time.perf_counter() - start
    memory = compiled.memory_analysis()
    runner = Runner("rljax", attention, lambda: None, jax.device_count(), args.peak_flops or peak_flops(),
                    _jax_peak_mem_gib, extra={"compile_s": compile_s})
    if memory is not None:  # XLA's plan per device: temp = activations + scratch, args = state + batch
        runner.extra["temp_GiB"] = memory.temp_size_in_bytes / 2**30
        runner.extra["args_GiB"] = memory.argument_size_in_bytes / 2**30

    def step():
        holder["state"], metrics = compiled(holder["state"], batch, None, None)
        jax.block_until_ready((holder["state"], metrics))
        runner.extra["loss"] = metrics["train/loss"]

    runner.step = step
    return runner


def prepare_torch(args, config) -> Runner:
    """The same update in transformers + PyTorch (on CUDA when there is one)."""
    import torch
    import transformers

    from rljax.train.setup import peak_flops

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    hf = config.to_hf_dict()
    hf.pop("architectures", None)
    hf_config = transformers.AutoConfig.for_model(hf.pop("model_type"), **hf)
    hf_config.use_cache = False
    param_dtype, compute_dtype = getattr(torch, args.param_dtype), getattr(torch, args.dtype)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_config, attn_implementation="sdpa", dtype=param_dtype)
    model = model.to(device).train()
    if args.remat != "none":  # transformers 5 renamed it; 4.x has only the old name
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01, fused=device == "cuda")
    ids = torch.as_tensor(make_batch(args.batch, args.seq_len, config.vocab_size, 1)["input_ids"],
                          dtype=torch.long, device=device)
    micro = ids.chunk(args.micro_batches)
    autocast = param_dtype != compute_dtype

    def step():
        for part in micro:
            with torch.autocast(device, dtype=compute_dtype, enabled=autocast):
                loss = model(input_ids=part, labels=part).loss / len(micro)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()

    def peak_mem():
        return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None

    peak = args.peak_flops or (peak_flops() if device == "cuda" else 0.0)
    return Runner("torch", "sdpa", step, 1, peak, peak_mem, extra={"torch_threads": torch.get_num_threads()})


def measure(runners: list[Runner], warmup: int, steps: int) -> None:
    """First (compiling) step and warm-up per system, then the timed steps interleaved
    across systems so that load from other processes hits them alike."""
    for r in runners:
        start = time.perf_counter()
        r.step()
        r.first_s = time.perf_counter() - start
        for _ in range(warmup):
            r.step()
    for _ in range(steps):
        for r in runners:
            r.timed()


def main(args: argparse.Namespace) -> int:
    import jax

    from rljax.bench.report import print_table, write_json

    if args.seq_len % args.segments or args.batch % args.micro_batches:
        raise SystemExit("--seq-len must divide by --segments and --batch by --micro-batches")
    config = model_config(args.model)
    print(f"model={args.model} params={config.num_params() / 1e6:.1f}M backend={jax.default_backend()} "
          f"devices={jax.device_count()}")
    print(flops_formula(config, args.seq_len))
    runners = [prepare_rljax(args, config)]
    if args.torch:
        try:
            runners.append(prepare_torch(args, config))
        except Exception as e:  # noqa: BLE001 - a missing torch must not lose the rljax row
            print(f"torch setup failed: {type(e).__name__}: {e}")
    try:
        measure(runners, args.warmup, args.steps)
    except Exception as e:  # noqa: BLE001 - e.g. torch running out of memory next to rljax
        if len(runners) == 1:
            raise
        print(f"interleaved run failed ({type(e).__name__}: {e}); timing rljax alone")
        runners = runners[:1]
        runners[0].times.clear()
        measure(runners, 0, args.steps)
    rows = [r.row(args, config) for r in runners]
    rows[0]["loss"] = float(rows[0]["loss"])
    if len(rows) > 1:
        rows[1]["ratio"] = rows[1]["step_s"] / rows[0]["step_s"]  # rljax speed-up over torch
    print_table(rows, [c for c in COLUMNS if any(c in r for r in rows)])
    extra = {"flops_per_token": config.flops_per_token(args.seq_len),
             "flops_formula": flops_formula(config, args.seq_len),
             "args": {k: v for k, v in vars(args).items() if not k.startswith("_")}}
    write_json(args.out, "train", rows, extra)
    return 0
