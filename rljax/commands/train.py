"""`rljax train CONFIG [key.sub=value ...]`: run or resume a training run."""

from __future__ import annotations

HELP = "Train (SFT, reward model, DPO) from a YAML config with dotted overrides."


def add_arguments(parser) -> None:
    parser.add_argument("config", help="YAML config file (see configs/)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. optim.lr=1e-5 trainer.total_steps=50")


def main(args) -> int:
    from rljax.config import ConfigError, load_config
    from rljax.train.loop import train
    from rljax.train.run_config import RunConfig

    try:
        cfg = load_config(RunConfig, args.config, args.overrides)
    except ConfigError as e:
        raise SystemExit(f"config error: {e}") from None
    train(cfg)
    return 0
