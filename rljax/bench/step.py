"""`rljax bench step`: one full GRPO step and where its time goes.

Builds an `RLConfig` in code (no YAML): a preset or `config.json` model shape with random
weights, rljax's character tokenizer (token ids beyond its ~100 characters decode to
nothing, so a large-vocabulary random model still runs), the synthetic arithmetic prompts
(`synthetic:arithmetic/rl?n=...`), an inline reward, GRPO with the k3 KL loss (so the
reference forward runs). `RLTrainer.step()` runs `--steps` times, one row each; the
first compiles every program (sampler buckets, log-prob forward, update), and a later
step whose samples reach a new sampler bucket compiles that one (`sampler_programs`
counts them), so read the steps after the count stops growing. The `timing_s/*`
metrics split a step:

    gen            sampling (+ reward scoring) of data.batch_size x rollout.n samples
    old_log_prob   the actor's forward over the batch (old log-probs)
    ref            the reference model's forward (KL loss)
    adv            the advantage stage: KL in the reward, advantages (`rljax.rl.advantage_stage`)
    update_actor   the actor's optimizer step(s)
    update_weights new weights into the sampler
    step           the whole iteration
"""

from __future__ import annotations

import argparse
import tempfile

HELP = "One GRPO step (random model, synthetic arithmetic) with its time split (timing_s/*)."

TIMING_KEYS = ("gen", "old_log_prob", "ref", "adv", "update_actor", "update_weights", "step")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from rljax.bench.train import add_model_arguments

    add_model_arguments(p)
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
    p.add_argument("--out", default="bench_results/step.json")


def build_config(args, run_dir: str):
    """The RLConfig of the benchmark run."""
    from rljax.bench.train import hf_config_dict
    from rljax.data.config import DataConfig
    from rljax.rl.config import ActorConfig, RewardConfig, RLConfig, RolloutConfig
    from rljax.train.optim import OptimConfig
    from rljax.train.run_config import ModelRunConfig, TrainerConfig

    rows = args.prompts * args.n
    pages_per_row = -(-(args.max_prompt_length + args.response_length) // 16)
    return RLConfig(
        model=ModelRunConfig(tokenizer="char", hf_config=hf_config_dict(args.model), param_dtype=args.param_dtype,
                           compute_dtype=args.dtype, remat=args.remat, attention=args.attention),
        data=DataConfig(format="rl", train_files=[f"synthetic:arithmetic/rl?n={max(64, 4 * args.prompts)}&seed=0"],
                        batch_size=args.prompts, max_prompt_length=args.max_prompt_length,
                        max_length=args.max_prompt_length + args.response_length, bucket_size=16),
        actor=ActorConfig(ppo_mini_batch_size=args.prompts, ppo_micro_batch_size_per_device=args.micro_batch_per_device,
                          use_kl_loss=True, kl_loss_type="low_var_kl", optim=OptimConfig(lr=1e-6)),
        rollout=RolloutConfig(n=args.n, temperature=1.0, response_length=args.response_length, max_num_seqs=rows,
                              max_num_batched_tokens=max(1024, 4 * args.max_prompt_length), page_size=16,
                              num_pages=1 + rows * pages_per_row + args.prompts),
        reward=RewardConfig(mode="inline"),
        trainer=TrainerConfig(algorithm="grpo", total_steps=args.steps, default_local_dir=run_dir,
                              experiment_name="bench_step", logger=["jsonl"], async_save=False,
                              resume_mode="disable", save_freq=0),
    )


def main(args: argparse.Namespace) -> int:
    import jax

    from rljax.bench.report import print_table, write_json
    from rljax.bench.train import model_config
    from rljax.models.attention import choose_attention
    from rljax.rl.trainer import RLTrainer

    config = model_config(args.model)
    attention = args.attention
    if attention == "auto":
        attention = f"auto->{choose_attention(jax.default_backend(), args.dtype, config.head_dim)}"
    rows = []
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = RLTrainer(build_config(args, run_dir))
        try:
            for i in range(args.steps):
                metrics = trainer.step()
                row = {"iter": i, "model": args.model, "rows": args.prompts * args.n, "attention": attention}
                row.update({k: metrics.get(f"timing_s/{k}") for k in TIMING_KEYS})
                row["tokens"] = metrics.get("perf/total_num_tokens")
                row["tok_s"] = metrics.get("perf/throughput", 0.0) * jax.device_count()
                row["mfu"] = metrics.get("perf/mfu")
                row["response_len"] = metrics.get("response_length/mean")
                row["log_prob_diff_max"] = metrics.get("training/rollout_probs_diff_max")
                row["sampler_programs"] = trainer.generation.num_compiled_programs  # grows: gen compiled
                rows.append(row)
        finally:
            trainer.close()
    print(f"model={args.model} params={config.num_params() / 1e6:.1f}M backend={jax.default_backend()} "
          f"prompts={args.prompts} n={args.n} response_length={args.response_length} dtype={args.dtype} "
          f"remat={args.remat} (step 0 includes compilation)")
    print_table(rows, ["iter", "rows", "attention", *TIMING_KEYS, "tokens", "tok_s", "mfu", "response_len",
                       "log_prob_diff_max", "sampler_programs"])
    write_json(args.out, "step", rows, {"args": {k: v for k, v in vars(args).items() if not k.startswith("_")}})
    return 0
