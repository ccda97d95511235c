"""`rljax bench step`: one full GRPO step and where its time goes.

Builds an `RLConfig` in code (no YAML): a preset or `config.json` model shape with random
weights, rljax's character tokenizer (token ids beyond its ~100 characters decode to
nothing, so a large-vocabulary random model still runs), the synthetic arithmetic prompts
(`synthetic:arithmetic/rl?n=...`), the built-in reward scored in a worker process (in
every mode: an inline reward would be scored on the trainer's main thread, so in the
asynchronous modes a finished rollout would wait for the update to end), GRPO with the k3 KL loss (so the
reference forward runs; `--kl-coef 0`: none). `--path` runs real weights instead (an HF
folder or a .gguf file, with its tokenizer): two-digit additions asked as a question
under the model's chat template, graded on the last number; `--trl` then runs TRL's
`GRPOTrainer` on the same work in its own process (`rljax.bench.trl_step`) and prints the
two steps side by side with their ratio. `peak_GiB` is the memory
held so far (`perf/max_memory_GiB`: on CPU the process's peak resident set).
`RLTrainer.step()` runs `--steps` times, one row each; the
first compiles every program (sampler buckets, log-prob forward, update), and a later
step whose samples reach a new sampler bucket compiles that one (`sampler_programs`
counts them), so read the steps after the count stops growing. The `timing_s/*`
metrics split a step:

    gen            sampling (+ reward scoring) of data.batch_size x rollout.n samples
    old_log_prob   the actor's forward over the batch (old log-probs); none with one
                   update per batch, where the update gives them (`old_log_probs_from_update`)
    ref            the reference model's forward (KL loss)
    adv            the advantage stage: KL in the reward, advantages (`rljax.rl.advantage_stage`)
    update_actor   the actor's optimizer step(s)
    update_weights new weights into the sampler
    wait_rollout   (one_step_off, async) the trainer waiting for the rollout sampled in the background
    step           the whole iteration

`--mode sync one_step_off async` runs each scheduling mode (`trainer.mode`; one_step_off
and async put one rollout replica on a device of the first half and train on the second
half, `rljax.rl.async_producer`, `rljax.rl.async_stream`). `--engine-step-ms` makes every
sampler engine step last at least that long, in every mode (the same generation work
costs the same time whatever the mode); `--gen-seconds` (sync, one_step_off) stretches
each rollout and `--train-seconds` each step's update to at least that long. Each is a
sleep, which takes no core, so the overlap shows on a small CPU machine. In async mode a
step's generation is the time the replicas ran segments during it (`async/sampler_idle_fraction`). Per mode the
summary compares the step time with gen + train (what a sync step costs) and with the
ideal overlap max(gen, train): `speedup` = (gen + train) / step, `ideal` = (gen + train) /
max(gen, train), from the medians over the steps after the first `--skip` (compilation) but those
whose sampler compiled a program (a resumed partial rollout re-prefills at new bucket
sizes) and the last (which has no next rollout to overlap with); `vs_sync` is the sync
step time over the mode's, when both ran. Medians, not means: in async mode a program
the replicas start compiling in one step can hold up the next. Each mode runs with its default off-policy
correction (`rljax.rl.presets.MODE_PRESETS`): the asynchronous modes take the sampler's
log-probs as the old ones, so their steps have no old-log-prob forward and `vs_sync`
counts that saving along with the overlap.
"""

from __future__ import annotations

import argparse
import os
import tempfile

HELP = "One GRPO step (a random model or real weights, synthetic arithmetic) with its time split (timing_s/*)."

TIMING_KEYS = ("gen", "old_log_prob", "ref", "adv", "update_actor", "update_weights", "wait_rollout", "step")
MODES = ("sync", "one_step_off", "async")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from rljax.bench.train import add_model_arguments

    add_model_arguments(p)
    p.add_argument("--path", default="",
                   help="real weights and tokenizer instead of --model: an HF folder or a .gguf file (model.path); "
                        "the prompts are then \"What is {expression}? Answer with the number only.\" under its "
                        "chat template")
    p.add_argument("--kl-coef", type=float, default=0.001,
                   help="actor.kl_loss_coef of the low-var KL loss; 0: no KL, so no reference model or forward")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step (data.train_batch_size)")
    p.add_argument("--n", type=int, default=4, help="samples per prompt (rollout.n)")
    p.add_argument("--response-length", type=int, default=64)
    p.add_argument("--max-prompt-length", type=int, default=64)
    p.add_argument("--dtype", default="bfloat16", help="compute dtype")
    p.add_argument("--param-dtype", default="float32")
    p.add_argument("--remat", default="none", choices=["none", "full", "save_dots"])
    p.add_argument("--attention", default="auto")
    p.add_argument("--micro-batch-per-device", type=int, default=0,
                   help="actor.ppo_micro_batch_size_per_device (0: the whole mini-batch)")
    p.add_argument("--steps", type=int, default=2, help="RL steps; the first compiles")
    p.add_argument("--seed", type=int, default=0,
                   help="rollout.seed and trainer.seed (sampling, train state), and TRL's seed with --trl; "
                        "the prompts stay the same")
    p.add_argument("--mode", nargs="+", choices=MODES, default=["sync"],
                   help="trainer.mode(s) to run, one after the other")
    p.add_argument("--gen-seconds", type=float, default=0.0,
                   help="each rollout lasts at least this long (a sleep after sampling and scoring)")
    p.add_argument("--engine-step-ms", type=float, default=0.0,
                   help="every sampler engine step lasts at least this long (a sleep after it), in every mode")
    p.add_argument("--max-staleness", type=int, default=1, help="async.max_staleness (--mode async)")
    p.add_argument("--train-seconds", type=float, default=0.0,
                   help="each step's actor update lasts at least this long (a sleep after it)")
    p.add_argument("--skip", type=int, default=1, help="steps left out of the per-mode summary (compilation)")
    p.add_argument("--trl", action="store_true",
                   help="with --path: also run TRL's GRPOTrainer on the same work in its own process "
                        "(pip install rljax[trl]) and print both steps side by side with their ratio")
    p.add_argument("--out", default="bench_results/step.json")


def build_config(args, run_dir: str, mode: str = "sync"):
    """The RLConfig of the benchmark run; `one_step_off`: one rollout replica of one
    device of the first half, the second half trains."""
    from rljax.bench.real_prompts import real_model_spec
    from rljax.bench.train import hf_config_dict
    from rljax.data.config import DataConfig
    from rljax.rl.config import ActorConfig, AsyncConfig, RewardConfig, RLConfig, RLTrainerConfig, RolloutConfig
    from rljax.train.optim import OptimConfig
    from rljax.train.run_config import ModelRunConfig

    rows = args.prompts * args.n
    pages_per_row = -(-(args.max_prompt_length + args.response_length) // 16)
    if args.path:  # a real model: its tokenizer and chat template, a question it can answer
        model = ModelRunConfig(path=args.path, param_dtype=args.param_dtype, compute_dtype=args.dtype,
                               remat=args.remat, attention=args.attention)
        source = real_model_spec(max(64, 4 * args.prompts))
    else:
        source = f"synthetic:arithmetic/rl?n={max(64, 4 * args.prompts)}&seed=0"
        model = ModelRunConfig(tokenizer="char", hf_config=hf_config_dict(args.model), param_dtype=args.param_dtype,
                               compute_dtype=args.dtype, remat=args.remat, attention=args.attention)
    return RLConfig(
        model=model,
        data=DataConfig(format="rl", train_files=[source],
                        batch_size=args.prompts, max_prompt_length=args.max_prompt_length,
                        max_length=args.max_prompt_length + args.response_length, bucket_size=16),
        actor=ActorConfig(ppo_mini_batch_size=args.prompts, ppo_micro_batch_size_per_device=args.micro_batch_per_device,
                          use_kl_loss=args.kl_coef > 0, kl_loss_coef=args.kl_coef, kl_loss_type="low_var_kl",
                          optim=OptimConfig(lr=1e-6)),
        rollout=RolloutConfig(n=args.n, temperature=1.0, response_length=args.response_length, max_num_seqs=rows,
                              max_num_batched_tokens=max(1024, 4 * args.max_prompt_length), page_size=16,
                              num_pages=1 + rows * pages_per_row + args.prompts,
                              tensor_parallel_size=0 if mode == "sync" else 1, seed=args.seed,
                              data_parallel_size=0 if mode == "sync" else 1),
        reward=RewardConfig(mode="process", num_workers=1),
        trainer=RLTrainerConfig(algorithm="grpo", total_steps=args.steps, default_local_dir=run_dir,
                                experiment_name="bench_step", logger=["jsonl"], async_save=False,
                                resume_mode="disable", save_freq=0, mode=mode, seed=args.seed),
        async_=AsyncConfig(rollout_devices=4, max_staleness=args.max_staleness),  # one replica of one device
        # the mode's default off-policy correction, as a YAML config resolves it (rljax.rl.presets)
        algorithm=RLConfig.defaults_for({"trainer": {"mode": mode}}).algorithm,
    )


def stretch(fn, seconds: float):
    """`fn`, made to last at least `seconds` per call (sleeping after it)."""
    import time

    if seconds <= 0:
        return fn

    def stretched(*args, **kwargs):
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        time.sleep(max(0.0, seconds - (time.perf_counter() - start)))
        return out

    return stretched


def sampler_engines(trainer) -> list:
    """The engines of the trainer's sampler or rollout replicas."""
    g = trainer.generation
    samplers = [g.sampler] if g.replicas is None else list(g.replicas.samplers.values())
    return [s.engine for s in samplers]


def summary(mode: str, rows: list[dict], skip: int) -> dict:
    """Median step, generation and training seconds of `rows` after the first `skip`, less
    the steps whose sampler compiled a program (`sampler_programs` grew) and the last; the
    training is the step less the rollout (sync: its generation; one_step_off: the wait
    for it) and the weight update; speedup and ideal as in the module docstring."""
    import numpy as np

    compiled = {i for i in range(1, len(rows))
                if rows[i].get("sampler_programs", 0) > rows[i - 1].get("sampler_programs", 0)}
    kept = [r for i, r in enumerate(rows[:-1]) if i >= skip and i not in compiled]  # the last: no next rollout
    kept = kept or rows
    for r in kept:
        if mode == "async":  # the replicas' busy share of the step
            r["gen"] = r["step"] * (1.0 - r["sampler_idle"])
    step = float(np.median([r["step"] for r in kept]))
    gen = float(np.median([r["gen"] for r in kept]))
    blocked = [r["gen"] if mode == "sync" else r["wait_rollout"] for r in kept]
    train = float(np.median([r["step"] - b - (r["update_weights"] or 0.0) for r, b in zip(kept, blocked)]))
    if mode == "sync":  # the trainer idles while the sampler generates, the sampler for the rest of the step
        idle = {"trainer_idle": float(np.median([r["gen"] / r["step"] for r in kept])),
                "sampler_idle": float(np.median([1.0 - r["gen"] / r["step"] for r in kept]))}
    else:
        idle = {"trainer_idle": float(np.median([r["trainer_idle"] for r in kept])),
                "sampler_idle": float(np.median([r["sampler_idle"] for r in kept]))}
    return {"mode": mode, "steps": len(kept), "step": step, "gen": gen, "train": train, **idle,
            "speedup": (gen + train) / step, "ideal": (gen + train) / max(gen, train)}


def main(args: argparse.Namespace) -> int:
    import jax

    from rljax.bench.report import print_table, write_json
    from rljax.bench.train import model_config
    from rljax.models.attention import choose_attention
    from rljax.rl.trainer import RLTrainer

    if args.path:
        from rljax.models import read_config

        config = read_config(args.path)  # an HF folder's config.json or a GGUF file's metadata
    else:
        config = model_config(args.model)
    name = os.path.basename(args.path.rstrip("/")) if args.path else args.model
    attention = args.attention
    if attention == "auto":
        attention = f"auto->{choose_attention(jax.default_backend(), args.dtype, config.head_dim)}"
    rows, summaries = [], []
    if args.trl and (not args.path or args.mode != ["sync"]):
        raise SystemExit("rljax bench step: --trl runs TRL on real weights next to the sync step: give --path "
                         "and no other --mode")
    for mode in args.mode:
        mode_rows = []
        with tempfile.TemporaryDirectory() as run_dir:
            trainer = RLTrainer(build_config(args, run_dir, mode))
            if args.gen_seconds and mode == "async":
                raise SystemExit("rljax bench step: --gen-seconds stretches whole rollouts, which --mode async has "
                                 "not; use --engine-step-ms")
            trainer.run_rollout = stretch(trainer.run_rollout, args.gen_seconds)
            for engine in sampler_engines(trainer):
                engine.step = stretch(engine.step, args.engine_step_ms / 1000)
            trainer.actor.update = stretch(trainer.actor.update, args.train_seconds)
            try:
                for i in range(args.steps):
                    metrics = trainer.step()
                    row = {"mode": mode, "iter": i, "model": name, "rows": args.prompts * args.n,
                           "attention": attention}
                    row.update({k: metrics.get(f"timing_s/{k}") for k in TIMING_KEYS})
                    row["micro_batches"] = metrics.get("actor/micro_batches")  # run of the update's (packing)
                    row["trainer_idle"] = metrics.get("async/trainer_idle_fraction")
                    row["sampler_idle"] = metrics.get("async/sampler_idle_fraction")
                    row["staleness"] = metrics.get("async/staleness/max")
                    row["tokens"] = metrics.get("perf/total_num_tokens")
                    row["tok_s"] = metrics.get("perf/throughput", 0.0) * jax.device_count()
                    row["mfu"] = metrics.get("perf/mfu")
                    row["response_len"] = metrics.get("response_length/mean")
                    row["log_prob_diff_max"] = metrics.get("training/rollout_probs_diff_max")
                    row["sampler_programs"] = trainer.generation.num_compiled_programs  # grows: gen compiled
                    row["peak_GiB"] = metrics.get("perf/max_memory_GiB")
                    mode_rows.append(row)
            finally:
                trainer.close()
        rows += mode_rows
        summaries.append(summary(mode, mode_rows, args.skip))
    print(f"model={name} params={config.num_params() / 1e6:.1f}M backend={jax.default_backend()} "
          f"prompts={args.prompts} n={args.n} response_length={args.response_length} dtype={args.dtype} "
          f"remat={args.remat} (step 0 includes compilation)")
    print_table(rows, ["mode", "iter", "rows", "attention", *TIMING_KEYS, "micro_batches", "trainer_idle",
                       "sampler_idle", "staleness", "tokens", "tok_s", "mfu", "response_len", "log_prob_diff_max",
                       "sampler_programs", "peak_GiB"])
    sync = next((m["step"] for m in summaries if m["mode"] == "sync"), None)
    for m in summaries:
        m["vs_sync"] = None if sync is None else sync / m["step"]
    print(f"\nper mode, steps after the first {args.skip} (gen-seconds={args.gen_seconds}, "
          f"train-seconds={args.train_seconds}):")
    print_table(summaries, ["mode", "steps", "step", "gen", "train", "trainer_idle", "sampler_idle", "speedup",
                            "ideal", "vs_sync"])
    extra = {"args": {k: v for k, v in vars(args).items() if not k.startswith("_")}, "summary": summaries}
    if args.trl:
        extra["trl"] = side_by_side(args, rows)
    write_json(args.out, "step", rows, extra)
    return 0


def side_by_side(args, rows: list[dict]) -> dict:
    """TRL's GRPOTrainer on the same work (`rljax.bench.trl_step`), medians over the steps
    after the first `--skip`, next to rljax's sync steps; prints both and the ratios."""
    import statistics

    import jax

    from rljax.bench import trl_step
    from rljax.bench.report import print_table

    trl_rows = trl_step.run({"path": args.path, "dtype": args.dtype, "prompts": args.prompts, "n": args.n,
                             "response_length": args.response_length,
                             # rljax's micro-batch over all its devices (0: the whole batch at once)
                             "micro_batch": args.micro_batch_per_device * jax.device_count(),
                             "kl_coef": args.kl_coef, "remat": args.remat, "steps": args.steps, "seed": args.seed,
                             "use_cpu": jax.default_backend() == "cpu",
                             "out_dir": tempfile.mkdtemp(prefix="rljax-trl-")})

    def med(values):
        values = [v or 0.0 for v in values]
        return statistics.median(values) if values else None

    ours = [r for r in rows if r["mode"] == "sync"][args.skip:] or [r for r in rows if r["mode"] == "sync"]
    theirs = trl_rows[args.skip:] or trl_rows
    table = [
        {"system": "rljax", "step": med(r["step"] for r in ours), "gen": med(r["gen"] for r in ours),
         "log_probs": med((r["old_log_prob"] or 0) + (r["ref"] or 0) for r in ours),
         "update": med(r["update_actor"] for r in ours), "hand_off": med(r["update_weights"] for r in ours),
         "peak_GiB": max(r["peak_GiB"] or 0 for r in rows)},
        {"system": "trl", "step": med(r["step"] for r in theirs), "gen": med(r["gen"] + r["reward"] for r in theirs),
         "log_probs": med(r["log_probs"] for r in theirs), "update": med(r["update"] for r in theirs),
         "hand_off": 0.0, "peak_GiB": max(r["peak_GiB"] for r in trl_rows)},
    ]
    ratio = {"step_trl_over_rljax": table[1]["step"] / table[0]["step"],
             "peak_trl_over_rljax": table[1]["peak_GiB"] / table[0]["peak_GiB"] if table[0]["peak_GiB"] else None}
    print(f"\nside by side with TRL's GRPOTrainer (medians of steps after the first {args.skip}; gen includes "
          "reward scoring; log_probs: old-policy + reference forwards):")
    print_table(table, ["system", "step", "gen", "log_probs", "update", "hand_off", "peak_GiB"])
    print(f"TRL step / rljax step = {ratio['step_trl_over_rljax']:.2f}; "
          f"TRL peak / rljax peak = {ratio['peak_trl_over_rljax'] or float('nan'):.2f}")
    return {"rows": trl_rows, "table": table, **ratio}
