"""`rljax bench sampler`: generation throughput of the rljax sampler next to
`transformers` `generate` on the same model, same prompts and lengths: a random-weight
preset (`--preset`), or a real model (`--model`: an HF folder or a `.gguf` file, which
both load from the same file, transformers with its own GGUF dequantization).

For each batch size: tokens/s of both (prefill + decode, greedy, every sequence
generating exactly `--new-tokens`), their ratio, the decode step time next to the
"matmul floor" (the same model's one-token forward with no cache: the weight matmuls
every engine's decode step pays, so `hf step time / floor` bounds any ratio), and on GPU the
fraction of the HBM-bandwidth roofline (weights + KV read per decode step / step time /
bandwidth).

Then the workloads where a serving engine earns its keep
(`rljax.bench.engine_workloads`): RL-shaped (`--rl-prompts` prompts of mixed lengths x
`--rl-n` samples, responses ending at a stop token or `--rl-max-tokens`, `--rl-concurrency`
sequences in flight) and agent-shaped (`--agent-episodes` episodes of `--agent-turns`
turns with tool outputs between them), each on the rljax engine with split steps and with
mixed steps, with split steps on the `reference` paged attention (`dense`, where
`--attention` is another), and on `transformers` `generate`: sampled tokens/s and the time
decodes spent waiting on prefills.

With `--model` the prompts are still random token ids (throughput does not depend on
them: every sequence generates exactly `--new-tokens`), and the RL workload's stop set
is no longer drawn to a mean length (a trained model's next token is far from uniform);
`--rl-prompts 0` / `--agent-episodes 0` leave them out.

Last, the KV pages a group of n=8 samples holds with and without prefix sharing.
Timings exclude compilation (a warm-up run comes first) and block on results.
"""

from __future__ import annotations

import os
import tempfile
import time

HELP = "Sampler throughput (rljax vs transformers generate), KV memory with prefix sharing."

# name -> (transformers config class name, kwargs)
PRESETS: dict[str, tuple[str, dict]] = {
    "tiny": ("LlamaConfig", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, vocab_size=256)),
    "small": ("LlamaConfig", dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=4096)),
    "qwen2.5-0.5b": ("Qwen2Config", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                         tie_word_embeddings=True, rope_theta=1000000.0)),
    "qwen3-0.6b": ("Qwen3Config", dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                       num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                       vocab_size=151936, tie_word_embeddings=True, rope_theta=1000000.0)),
}


def add_arguments(p) -> None:
    p.add_argument("--preset", default="small", choices=sorted(PRESETS), help="model shape (random weights)")
    p.add_argument("--model", default="", help="a real model instead of --preset: an HF folder or a .gguf file")
    p.add_argument("--batch-sizes", default="1,32", help="comma-separated batch sizes")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--dtype", default="float32", help="model dtype for both (float32 | bfloat16)")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--attention", default="auto", choices=["auto", "reference", "blocked", "pallas"])
    p.add_argument("--rl-prompts", type=int, default=16, help="prompts of the RL-shaped workload (0: skip it)")
    p.add_argument("--rl-n", type=int, default=8, help="samples per prompt of the RL-shaped workload")
    p.add_argument("--rl-max-tokens", type=int, default=128, help="response cap of the RL-shaped workload")
    p.add_argument("--rl-mean-len", type=int, default=48, help="sets the stop set's size (vocab / this)")
    p.add_argument("--rl-concurrency", type=int, default=32, help="sequences in flight, both systems")
    p.add_argument("--agent-episodes", type=int, default=32, help="episodes of the agent-shaped workload (0: skip it)")
    p.add_argument("--agent-turns", type=int, default=3, help="turns per episode of the agent-shaped workload")
    p.add_argument("--agent-tool-tokens", default="16,64", help="min,max tokens of a tool output (agent workload)")
    p.add_argument("--share-n", type=int, default=8, help="n for the prefix-sharing memory rows")
    p.add_argument("--share-prompts", type=int, default=4, help="prompts for the prefix-sharing rows")
    p.add_argument("--share-prompt-len", type=int, default=256, help="prompt length for the prefix-sharing rows")
    p.add_argument("--bandwidth", type=float, default=4.3e12, help="HBM bytes/s for the roofline (GPU)")
    p.add_argument("--no-hf", action="store_true", help="skip transformers (rljax only)")
    p.add_argument("--torch-threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per point, interleaved (best is kept)")
    p.add_argument("--out", default="bench_results/sampler.json")


def _hf_model(preset: str, dtype: str, path: str, max_len: int):
    import torch
    import transformers

    cls_name, kwargs = PRESETS[preset]
    config = getattr(transformers, cls_name)(
        **kwargs, max_position_embeddings=max(max_len, 128), eos_token_id=None, bos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(path)
    return model


def hf_pretrained(path: str, dtype: str):
    """transformers' model of an HF folder or a `.gguf` file (dequantized by transformers)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rljax.models.gguf import is_gguf

    if is_gguf(path):
        folder, name = os.path.split(os.path.abspath(path))
        return AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=getattr(torch, dtype)).eval()
    return AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()


def _matmul_floor(model, batch: int) -> float:
    """Seconds of the model's forward over one token per row with no cache: the weight
    matmuls every decode step does whatever its attention (a floor for any engine)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda state, ids: nnx.merge(graphdef, state)(ids))
    ids = jnp.zeros((batch, 1), jnp.int32)
    jax.block_until_ready(forward(state, ids))
    best = float("inf")
    for _ in range(20):
        best = min(best, _time(lambda: jax.block_until_ready(forward(state, ids))))
    return best


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()  # both return finished results (rljax: host lists; transformers: synchronized)
    return time.perf_counter() - t0


def _engine_workloads(args, model, hf, torch_device, rng, vocab: int) -> list[dict]:
    """The RL-shaped and agent-shaped rows (`rljax.bench.engine_workloads`)."""
    from rljax.bench.engine_workloads import compare, make_workload, max_context
    from rljax.rollout import KVCacheConfig

    rows = []
    for kind, count in (("rl", args.rl_prompts), ("agent", args.agent_episodes)):
        if not count:
            continue
        n = args.rl_n if kind == "rl" else 1
        if args.rl_concurrency % n:
            raise SystemExit(f"--rl-concurrency ({args.rl_concurrency}) must be a multiple of --rl-n ({n})")
        lo, hi = (int(x) for x in args.agent_tool_tokens.split(","))
        w = make_workload(kind, rng, vocab, count, args.prompt_len, n, args.agent_turns, args.rl_max_tokens,
                          args.rl_mean_len, args.rl_concurrency if kind == "rl" else count, (lo, hi))
        config = dict(max_num_seqs=w.concurrency, max_num_batched_tokens=max(512, args.prompt_len * 4),
                      max_model_len=-(-max_context(w) // args.page_size) * args.page_size,
                      kv_cache=KVCacheConfig(page_size=args.page_size), attention=args.attention,
                      enable_prefix_caching=kind == "agent")  # rl: repeated runs of the same prompts
        rows.append(compare(model, w, config, None if args.no_hf else hf, torch_device, args.repeats))
    return rows


def _rljax_model(preset: str, dtype: str, max_len: int):
    """The preset as a random rljax Decoder (no torch: `--no-hf`)."""
    from flax import nnx

    from rljax.models import DTypePolicy, ModelConfig
    from rljax.models.transformer import Decoder

    cls_name, kwargs = PRESETS[preset]
    model_type = {"LlamaConfig": "llama", "Qwen2Config": "qwen2", "Qwen3Config": "qwen3"}[cls_name]
    config = ModelConfig.from_hf_dict({"model_type": model_type, **kwargs,
                                       "max_position_embeddings": max(max_len, 128)})
    return Decoder(config, policy=DTypePolicy(param_dtype=dtype, compute_dtype=dtype), rngs=nnx.Rngs(0))


def main(args) -> int:
    import importlib

    import jax
    import numpy as np

    from rljax.bench.engine_workloads import COLUMNS
    from rljax.bench.report import print_table, write_json
    from rljax.models import load_hf
    from rljax.rollout import KVCacheConfig, Sampler, SamplerConfig, SamplingParams

    torch = None if args.no_hf else importlib.import_module("torch")  # --no-hf runs without torch
    if torch is not None and args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    load_before = os.getloadavg()[0]
    p_len, n_new = args.prompt_len, args.new_tokens
    max_len = max(p_len, args.share_prompt_len) + n_new
    backend = jax.default_backend()
    rng = np.random.default_rng(0)

    tool_max = int(args.agent_tool_tokens.split(",")[-1])
    model_len = max(max_len, p_len * 3 // 2 + args.agent_turns * (args.rl_max_tokens + tool_max))
    hf, torch_device = None, None
    if args.model:
        model = load_hf(args.model, dtype=args.dtype)
        hf = None if torch is None else hf_pretrained(args.model, args.dtype)
        torch_device = None if torch is None else "cuda" if torch.cuda.is_available() else "cpu"
        hf = hf if hf is None else hf.to(torch_device)
    elif torch is None:
        model = _rljax_model(args.preset, args.dtype, model_len)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            hf = _hf_model(args.preset, args.dtype, tmp, model_len)
            model = load_hf(tmp, dtype=args.dtype)
        torch_device = "cuda" if torch.cuda.is_available() else "cpu"
        hf = hf.to(torch_device)
    cfg = model.config
    vocab = cfg.vocab_size
    max_seqs = max(max(batch_sizes), args.share_n * args.share_prompts)
    sampler = Sampler(model, SamplerConfig(
        max_num_seqs=max_seqs,
        max_num_batched_tokens=max(512, p_len * 4),
        max_model_len=-(-max_len // args.page_size) * args.page_size,
        kv_cache=KVCacheConfig(page_size=args.page_size),
        attention=args.attention,
        enable_prefix_caching=False,  # repeated runs of the same prompts: no free prefills
    ))
    greedy = SamplingParams(temperature=0.0, max_tokens=n_new, ignore_eos=True)
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)

    param_bytes = sum(x.nbytes for x in jax.tree.leaves(sampler.engine.state))
    kv_bytes_per_token = sampler.engine.cache_shape.bytes_per_token

    rows = []
    for b in batch_sizes:
        prompts = rng.integers(0, vocab, size=(b, p_len)).tolist()

        def hf_generate(max_new: int):
            ids = torch.tensor(prompts, dtype=torch.long, device=torch_device)
            mask = torch.ones_like(ids)
            with torch.no_grad():
                out = hf.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new,
                                  min_new_tokens=max_new, pad_token_id=0)
            if torch_device == "cuda":
                torch.cuda.synchronize()
            assert out.shape[1] == p_len + max_new
            return out

        sampler.generate(prompts, greedy)  # warm-up: compiles every shape this run uses
        sampler.generate(prompts, one)
        if not args.no_hf:
            hf_generate(4)
        # Interleave the two systems so that load from other processes hits both alike.
        t_full = t_one = t_hf = float("inf")
        for _ in range(args.repeats):
            t_full = min(t_full, _time(lambda: sampler.generate(prompts, greedy)))
            t_one = min(t_one, _time(lambda: sampler.generate(prompts, one)))
            if not args.no_hf:
                t_hf = min(t_hf, _time(lambda: hf_generate(n_new)))
        step_s = max(t_full - t_one, 1e-9) / max(n_new - 1, 1)
        row = {
            "batch": b,
            "prompt_len": p_len,
            "new_tokens": n_new,
            "rljax_tok_s": b * n_new / t_full,
            "rljax_s": t_full,
            "decode_step_ms": step_s * 1e3,
            "matmul_floor_ms": _matmul_floor(model, b) * 1e3,
        }
        if backend == "gpu":
            mean_ctx = p_len + n_new / 2
            step_bytes = param_bytes + b * mean_ctx * kv_bytes_per_token
            row["roofline_frac"] = step_bytes / step_s / args.bandwidth
        if not args.no_hf:
            row["hf_tok_s"] = b * n_new / t_hf
            row["hf_s"] = t_hf
            row["ratio"] = row["rljax_tok_s"] / row["hf_tok_s"]
        rows.append(row)

    rl_rows = _engine_workloads(args, model, hf, torch_device, rng, vocab)

    # KV memory of a group of n samples, with and without prefix sharing.
    share_len = args.share_prompt_len
    share_prompts = rng.integers(0, vocab, size=(args.share_prompts, share_len)).tolist()
    sampled = SamplingParams(n=args.share_n, temperature=1.0, max_tokens=n_new, ignore_eos=True, seed=0)
    memory = []
    for share in (True, False):
        sampler.engine.share_prefix = share
        sampler.reset_peak_memory()
        sampler.generate(share_prompts, sampled)
        stats = sampler.stats()
        memory.append({
            "prefix_sharing": share,
            "n": args.share_n,
            "prompts": args.share_prompts,
            "prompt_len": share_len,
            "new_tokens": n_new,
            "peak_pages": stats["peak_pages_used"],
            "peak_kv_MiB": stats["peak_pages_used"] * sampler.engine.cache_shape.bytes_per_page / 2**20,
        })
    stats = sampler.stats()
    sampler.close()

    load = (load_before, os.getloadavg()[0])
    what = f"model={args.model}" if args.model else f"preset={args.preset}"
    print(f"{what} backend={backend} dtype={args.dtype} params={cfg.num_params() / 1e6:.1f}M "
          f"page_size={args.page_size} attention={args.attention} torch_threads={torch.get_num_threads() if torch else '-'} "
          f"cpus={os.cpu_count()} load_avg(start, end)=({load[0]:.1f}, {load[1]:.1f})")
    cols = ["batch", "prompt_len", "new_tokens", "rljax_tok_s", "hf_tok_s", "ratio", "decode_step_ms",
            "matmul_floor_ms"]
    if backend == "gpu":
        cols.append("roofline_frac")
    print_table(rows, [c for c in cols if any(c in r for r in rows)])
    print()
    if rl_rows:
        print_table(rl_rows, [c for c in COLUMNS if c in rl_rows[0]])
        print()
    print_table(memory, ["prefix_sharing", "n", "prompts", "prompt_len", "new_tokens", "peak_pages", "peak_kv_MiB"])
    print(f"compiled programs: {stats['num_compiled_programs']} {stats['compiled_shapes']}")
    extra = {"workloads": rl_rows, "memory": memory, "compiled_programs": stats["num_compiled_programs"],
             "compiled_shapes": stats["compiled_shapes"], "preset": None if args.model else args.preset,
             "model": args.model or None, "dtype": args.dtype,
             "torch_threads": torch.get_num_threads() if torch else None, "torch_device": torch_device, "cpus": os.cpu_count(),
             "load_avg": load}
    write_json(args.out, "sampler", rows, extra)
    return 0
