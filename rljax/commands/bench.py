"""`rljax bench NAME ...`: benchmarks, one module per name under rljax/bench/."""

from __future__ import annotations

import importlib

HELP = "Run a benchmark; prints one table and writes JSON."

# name -> module under rljax.bench. Each defines HELP, add_arguments(p), main(args).
BENCHES: dict[str, str] = {
    "sampler": "sampler",
    "compile": "compile",
    "log_probs": "log_probs",
    "train": "train",
    "mismatch": "mismatch",
    "step": "step",
    "agent": "agent",
    "rollout": "rollout",
    "lora": "lora",
    "lora_learning": "lora_learning",
    "moe": "moe",
    "code-reward": "code_reward",
    "replica-compile": "replica_compile",
}


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="bench", metavar="BENCH")
    sub.required = True
    for name, module_name in BENCHES.items():
        module = importlib.import_module(f"rljax.bench.{module_name}")
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_bench_main=module.main)


def main(args) -> int:
    return int(args._bench_main(args) or 0)
