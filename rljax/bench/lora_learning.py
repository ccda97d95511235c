"""`rljax bench lora_learning`: does LoRA learn, over several seeds? LoRA SFT and LoRA GRPO
on tiny tasks, one run per seed, the metric that shows learning first -> last.

- SFT: `--sft-config` (default `configs/sft_tiny.yaml`: a tiny random model, 2-digit
  arithmetic) with adapters on every projection; metric `train/loss`, first and last
  step.
- GRPO: a tiny random model (hidden 32, 1 layer, character tokenizer) on single-digit
  arithmetic prompts, rewarded by the fraction of digits in its response (a reward a
  random model can climb within a few steps, written next to the results); metric
  `critic/score/mean`, mean of the first three and of the last three steps.

A seed sets the base model's init, the adapters' init, the train state's seed (and with
it the mini-batch order and LoRA dropout's masks) and, for GRPO, the rollout's random
streams. Each run is a real run (`rljax.train.loop.train`, `rljax.rl.trainer.train_rl`)
under `--out`'s folder; the table gives each seed and the mean and (sample) standard
deviation over seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

HELP = "LoRA SFT and LoRA GRPO on tiny tasks over several seeds: first -> last of the learning metric."

DIGIT_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Fraction of the response's characters that are digits."""
    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)
'''

GRPO_BASE = {
    "model": {"tokenizer": "char", "hf_config": {"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64,
                                                  "num_hidden_layers": 1, "num_attention_heads": 2,
                                                  "num_key_value_heads": 1, "tie_word_embeddings": True,
                                                  "initializer_range": 0.2}},
    "data": {"train_files": ["synthetic:arithmetic/rl?n=512&seed=0&digits=1"], "train_batch_size": 8,
             "max_prompt_length": 32, "bucket_size": 16},
    "rollout": {"n": 8, "response_length": 8, "max_num_seqs": 64, "num_pages": 256, "page_size": 8},
    "actor": {"ppo_mini_batch_size": 8, "optim": {"lr": 3.0e-2, "weight_decay": 0.0}},
    "algorithm": {"adv_estimator": "grpo"},
    "reward": {"mode": "inline"},
    "trainer": {"algorithm": "grpo", "logger": ["jsonl"], "async_save": False, "save_freq": 0, "test_freq": 0},
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, one run each per task")
    p.add_argument("--tasks", default="sft,grpo", help="sft, grpo or both")
    p.add_argument("--rank", type=int, default=8, help="model.lora.rank (alpha = 2 x rank)")
    p.add_argument("--dropout", type=float, default=0.0, help="model.lora.dropout")
    p.add_argument("--sft-config", default="configs/sft_tiny.yaml")
    p.add_argument("--sft-steps", type=int, default=16)
    p.add_argument("--sft-lr", type=float, default=1e-2)
    p.add_argument("--grpo-steps", type=int, default=10)
    p.add_argument("--out", default="bench_results/lora_learning.json")


def _lora(args, seed: int) -> list[str]:
    return [f"model.lora.rank={args.rank}", f"model.lora.alpha={2 * args.rank}", f"model.lora.dropout={args.dropout}",
            f"model.lora.init_seed={seed}", f"model.init_seed={seed}", f"trainer.seed={seed}"]


def run_sft(args, seed: int, root: str) -> tuple[float, float]:
    from rljax.config import load_config
    from rljax.train.loop import train
    from rljax.train.run_config import RunConfig

    # a frozen random unembedding of std 0.02 bounds the logits near 0: a wider init leaves the adapters room
    cfg = load_config(RunConfig, args.sft_config, [
        f"trainer.default_local_dir={root}", f"trainer.experiment_name=sft_seed{seed}", "trainer.logger=[jsonl]",
        "trainer.async_save=false", "trainer.save_freq=0", "trainer.test_freq=0", "data.batch_size=16",
        f"trainer.total_steps={args.sft_steps}", f"optim.lr={args.sft_lr}", "model.hf_config.initializer_range=0.2",
        *_lora(args, seed)])
    train(cfg)
    with open(os.path.join(root, f"sft_seed{seed}", "metrics.jsonl")) as f:
        losses = [row["train/loss"] for row in map(json.loads, f) if "train/loss" in row]
    return losses[0], losses[-1]


def run_grpo(args, seed: int, root: str) -> tuple[float, float]:
    import yaml

    from rljax.config import load_config
    from rljax.rl.config import RLConfig
    from rljax.rl.trainer import train_rl

    reward = os.path.join(root, "digit_reward.py")
    with open(reward, "w") as f:
        f.write(DIGIT_REWARD)
    path = os.path.join(root, "grpo.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(GRPO_BASE, f)
    cfg = load_config(RLConfig, path, [
        f"trainer.default_local_dir={root}", f"trainer.experiment_name=grpo_seed{seed}",
        f"trainer.total_steps={args.grpo_steps}", f"reward.custom_reward_function.path={reward}",
        f"rollout.seed={seed}", *_lora(args, seed)])
    scores = [h["critic/score/mean"] for h in train_rl(cfg)]
    return statistics.mean(scores[:3]), statistics.mean(scores[-3:])


TASKS = {"sft": ("train/loss, step 1 -> last", run_sft),
         "grpo": ("critic/score/mean, steps 1-3 -> last 3", run_grpo)}


def _spread(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} +- {sd:.3f}"


def main(args) -> int:
    seeds = [int(s) for s in args.seeds.split(",")]
    tasks = [t.strip() for t in args.tasks.split(",")]
    for task in tasks:
        if task not in TASKS:
            raise ValueError(f"--tasks: unknown task {task!r}; choose from {list(TASKS)}")
    root = os.path.splitext(args.out)[0] + "_runs"
    os.makedirs(root, exist_ok=True)
    rows, summary = [], []
    for task in tasks:
        metric, run = TASKS[task]
        results = []
        for seed in seeds:
            first, last = run(args, seed, root)
            results.append((first, last))
            rows.append({"task": task, "seed": seed, "metric": metric, "first": first, "last": last})
            print(f"{task} seed {seed}: {metric}: {first:.4f} -> {last:.4f}", flush=True)
        firsts, lasts = [r[0] for r in results], [r[1] for r in results]
        summary.append({"task": task, "metric": metric, "seeds": len(seeds), "first": _spread(firsts),
                        "last": _spread(lasts), "change": _spread([b - a for a, b in results])})
    print(f"\nLoRA rank {args.rank}, dropout {args.dropout:g}; mean +- sd over seeds {seeds}")
    print("| task | metric | first | last | last - first |\n|---|---|---|---|---|")
    for s in summary:
        print(f"| {s['task']} | {s['metric']} | {s['first']} | {s['last']} | {s['change']} |")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        settings = {k: v for k, v in vars(args).items() if not k.startswith("_")}
        json.dump({"args": settings, "rows": rows, "summary": summary}, f, indent=1, default=str)
    return 0
