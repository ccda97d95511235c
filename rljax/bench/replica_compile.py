"""The rollout replicas' sampler compiles, with and without sharing programs.

One RL-shaped rollout (P prompts of mixed lengths x n samples, so each replica reaches
several buckets; no prefix cache, so a repeat reaches the same ones) runs on
`devices / tp` replicas built fresh for each round:
- "own": `rollout.share_programs: false`, every replica compiles each program it reaches;
- "shared": the first replica to reach a shape compiles it, the others load it
  (`rljax.rollout.program_share`).

Per mode: the distinct programs the replicas reach (by shape), backend compiles and
loads over all replicas, the seconds inside them (summed
over the replicas' threads, which compile side by side), the wall time of the first
rollout (it holds every compile) and of a second, identical one (none), and whether the
two modes sample the same tokens. An untimed round first compiles what both modes share
(the weight hand-off, jax's first-use programs); then the modes alternate for `--repeats`
rounds and the table keeps each mode's fastest. jax's persistent compilation cache must
be off (it would answer compiles in both modes).
"""

from __future__ import annotations

import time

HELP = "Sampler compiles on rollout replicas: each replica compiling its own vs same-shaped replicas sharing."

COLUMNS = ["replicas", "mode", "distinct_programs", "programs_compiled", "programs_loaded", "compile_s", "load_s", "first_rollout_s",
           "second_rollout_s", "same_tokens"]


def add_arguments(p) -> None:
    from rljax.bench.sampler import PRESETS

    p.add_argument("--preset", default="small", choices=sorted(PRESETS), help="model shape (random weights)")
    p.add_argument("--tp", type=int, nargs="+", default=[1, 2], help="devices per replica (devices / tp replicas)")
    p.add_argument("--prompts-per-replica", type=int, default=4)
    p.add_argument("--n", type=int, default=4, help="samples per prompt")
    p.add_argument("--prompt-len", type=int, nargs=2, default=[8, 96], help="prompt lengths drawn from [lo, hi]")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=2, help="rounds of both modes (after one untimed round)")
    p.add_argument("--seed", type=int, default=0, help="draws the prompts and the sampling noise")
    p.add_argument("--out", default="bench_results/replica_compile.json")


def main(args) -> int:
    import jax
    import numpy as np
    from flax import nnx

    from rljax.bench.report import print_table, write_json
    from rljax.bench.sampler import _rljax_model
    from rljax.rl.replica_rollout import ReplicatedRollout
    from rljax.rollout import KVCacheConfig, Sampler, SamplerConfig, SamplingParams
    from rljax.rollout.program_share import PROCESS_SHARE
    from rljax.rollout.replicas import ReplicaLayout

    if jax.config.jax_compilation_cache_dir:
        raise SystemExit(f"jax's persistent compilation cache is on ({jax.config.jax_compilation_cache_dir}): "
                         "unset JAX_COMPILATION_CACHE_DIR, it answers compiles in both modes")
    devices = jax.devices()
    for tp in args.tp:
        if len(devices) % tp:
            raise SystemExit(f"--tp {tp} does not divide the {len(devices)} devices")
    lo, hi = args.prompt_len
    model_len = -(-(hi + args.max_tokens) // 16) * 16
    model = _rljax_model(args.preset, "float32", model_len)
    graphdef, state = nnx.split(model)
    params = SamplingParams(n=args.n, temperature=1.0, max_tokens=args.max_tokens, ignore_eos=True, seed=args.seed)

    def round_(tp: int, share: bool, prompts: list) -> dict:
        replicas = len(devices) // tp
        config = SamplerConfig(max_num_seqs=args.prompts_per_replica * args.n, max_model_len=model_len,
                               kv_cache=KVCacheConfig(page_size=16), share_programs=share,
                               enable_prefix_caching=False)  # the second rollout: the first's shapes
        PROCESS_SHARE.clear()
        rollout = ReplicatedRollout(nnx.merge(graphdef, state), ReplicaLayout.create(devices, tp),
                                    lambda m: Sampler(m, config), args.max_tokens)
        try:
            generate = {r: (lambda items, s=s: s.generate(items, params)) for r, s in rollout.samplers.items()}
            seconds, tokens = [], None
            for _ in range(2):
                start = time.perf_counter()
                completions = rollout.generate_everywhere(generate, prompts)
                seconds.append(time.perf_counter() - start)
                tokens = [c.token_ids for c in completions]
            stats = [s.stats() for s in rollout.samplers.values()]
        finally:
            rollout.close()
        total = lambda key: sum(s[key] for s in stats)  # noqa: E731
        return {"tp": tp, "replicas": f"{replicas} x tp={tp}", "mode": "shared" if share else "own",
                "programs_compiled": total("programs_compiled"), "programs_loaded": total("programs_loaded"),
                "programs_cached": total("programs_cached"),
                "distinct_programs": len({shape for s in stats for shape in s["compiled_shapes"]}),
                "compile_s": total("compile_s"),
                "load_s": total("program_load_s"), "first_rollout_s": seconds[0], "second_rollout_s": seconds[1],
                "tokens": tokens}

    rng = np.random.default_rng(args.seed)
    vocab = model.config.vocab_size
    rows = []
    for tp in args.tp:
        count = args.prompts_per_replica * len(devices) // tp
        prompts = [rng.integers(1, vocab, size=int(rng.integers(lo, hi + 1))).tolist() for _ in range(count)]
        round_(tp, True, prompts)  # untimed: the hand-off and jax's first-use programs
        best: dict[str, dict] = {}
        for _ in range(args.repeats):
            for share in (False, True):
                row = round_(tp, share, prompts)
                if row["mode"] not in best or row["first_rollout_s"] < best[row["mode"]]["first_rollout_s"]:
                    best[row["mode"]] = row
        own, shared = best["own"], best["shared"]
        own["same_tokens"] = None  # the reference
        shared["same_tokens"] = shared["tokens"] == own["tokens"]
        rows += [own, shared]
        shared["first_rollout_vs_own"] = own["first_rollout_s"] / shared["first_rollout_s"]
    for row in rows:
        del row["tokens"]
    print(f"preset={args.preset} ({model.config.num_params() / 1e6:.1f}M params, float32); "
          f"{args.prompts_per_replica} prompts of {lo}-{hi} tokens x n={args.n} per replica, {args.max_tokens} "
          f"tokens each; {len(devices)} {jax.default_backend()} devices; fastest of {args.repeats} rounds per mode")
    print_table(rows, COLUMNS + ["first_rollout_vs_own"])
    write_json(args.out, "replica_compile", rows, {"preset": args.preset, "n": args.n, "seed": args.seed,
                                                   "prompt_len": args.prompt_len, "max_tokens": args.max_tokens})
    return 0
