"""`rljax train CONFIG [key.sub=value ...]`: run or resume a training run.

`trainer.algorithm` picks the trainer: `sft`, `rm` and `dpo` run the supervised loop
(`rljax.train.loop`, config `RunConfig`); anything else (`grpo`, `ppo`, `dapo`, ...) runs
the RL loop (`rljax.rl.trainer`, config `RLConfig`, where `algorithm.adv_estimator` and
`actor.policy_loss.loss_mode` choose the method).
"""

from __future__ import annotations

HELP = "Train (SFT, reward model, DPO, PPO/GRPO and relatives) from a YAML config with dotted overrides."

SUPERVISED = ("sft", "rm", "dpo")


def add_arguments(parser) -> None:
    parser.add_argument("config", help="YAML config file (see configs/)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. optim.lr=1e-5 trainer.total_steps=50")


def algorithm_of(path: str, overrides: list[str]) -> str:
    import yaml

    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    algorithm = (raw.get("trainer") or {}).get("algorithm", "sft")
    for item in overrides:
        if item.startswith("trainer.algorithm="):
            algorithm = item.split("=", 1)[1]
    return algorithm


def main(args) -> int:
    from rljax.distributed import initialize

    initialize()  # jax.distributed from RLJAX_* / TPU environment; no-op for one process
    from rljax.config import ConfigError, load_config
    from rljax.distributed import initialize

    initialize()
    try:
        if algorithm_of(args.config, args.overrides) in SUPERVISED:
            from rljax.train.loop import train
            from rljax.train.run_config import RunConfig

            cfg, run = load_config(RunConfig, args.config, args.overrides), train
        else:
            from rljax.rl.config import RLConfig
            from rljax.rl.trainer import train_rl

            cfg, run = load_config(RLConfig, args.config, args.overrides), train_rl
    except ConfigError as e:
        raise SystemExit(f"config error: {e}") from None
    run(cfg)
    return 0
