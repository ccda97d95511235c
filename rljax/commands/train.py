"""`rljax train CONFIG [key.sub=value ...]`: run or resume a training run.

`trainer.algorithm` picks the trainer: `sft`, `rm` and `dpo` run the supervised loop
(`rljax.train.loop`, config `RunConfig`); the RL algorithms (`grpo`, `ppo`, `dapo`, ...,
`rljax.rl.config.RL_ALGORITHMS`) run the RL loop (`rljax.rl.trainer`, config `RLConfig`,
where `algorithm.adv_estimator` and `actor.policy_loss.loss_mode` choose the method); any
other name is an error that lists them.

The whole config is checked before anything is built (`rljax.config.validate`, with the
device count): a mistake is one line naming the key, within seconds.
"""

from __future__ import annotations

HELP = "Train (SFT, reward model, DPO, PPO/GRPO and relatives) from a YAML config with dotted overrides."


def add_arguments(parser) -> None:
    parser.add_argument("config", help="YAML config file (see configs/)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. optim.lr=1e-5 trainer.total_steps=50")


def algorithm_of(path: str, overrides: list[str]) -> str | None:
    """`trainer.algorithm` as the file and the overrides set it (None when unset)."""
    import yaml

    from rljax.config import ConfigError, read_yaml

    trainer = read_yaml(path).get("trainer") or {}
    algorithm = trainer.get("algorithm") if isinstance(trainer, dict) else None
    for item in overrides:
        key, _, text = item.partition("=")
        if key.strip() == "trainer.algorithm":
            try:
                algorithm = yaml.safe_load(text)
            except yaml.YAMLError:
                raise ConfigError(f"override {item!r}: the value is not valid YAML") from None
    return None if algorithm is None else str(algorithm)


def config_class(path: str, overrides: list[str]) -> type:
    """`RunConfig` or `RLConfig`, by `trainer.algorithm` (unset: `sft`, unless the file has
    RL sections); an unknown algorithm is a `ConfigError` listing the valid ones."""
    import dataclasses

    from rljax.config import ConfigError, read_yaml
    from rljax.rl.config import RL_ALGORITHMS, RLConfig
    from rljax.train.run_config import SUPERVISED_ALGORITHMS, RunConfig, unknown_algorithm

    algorithm = algorithm_of(path, overrides)
    if algorithm is None:
        supervised = {f.name for f in dataclasses.fields(RunConfig)}
        rl_only = sorted((set(read_yaml(path)) - supervised) & {f.name for f in dataclasses.fields(RLConfig)})
        if rl_only:
            raise ConfigError(f"trainer.algorithm: not set, and {path} has RL sections ({', '.join(rl_only)}); "
                              f"set it to one of {', '.join(RL_ALGORITHMS)}")
        return RunConfig
    if algorithm in SUPERVISED_ALGORITHMS:
        return RunConfig
    if algorithm in RL_ALGORITHMS:
        return RLConfig
    raise unknown_algorithm(algorithm, RL_ALGORITHMS)


def main(args) -> int:
    from rljax.config import load_config, validate

    cls = config_class(args.config, args.overrides)
    cfg = load_config(cls, args.config, args.overrides)  # every value checked: no device needed

    from rljax.distributed import initialize

    initialize()  # jax.distributed from RLJAX_* / TPU environment; no-op for one process
    import jax

    validate(cfg, num_devices=jax.device_count())  # mesh and batch sizes, before anything is built
    from rljax.train.run_config import RunConfig

    if cls is RunConfig:
        from rljax.train.loop import train as run
    else:
        from rljax.rl.trainer import train_rl as run
    run(cfg)
    return 0
