"""What kind of run a config is: the rule `rljax train`, `rljax export` and `rljax eval`
share, and the config class each kind reads.

`trainer.algorithm` names a supervised algorithm (`sft`, `rm`, `dpo`: `RunConfig`, the
loop `rljax.train.loop`) or an RL one (`grpo`, `ppo`, ...: `RLConfig`, the trainer
`rljax.rl.trainer`). Unset, a config is supervised unless it has RL sections (then the
algorithm must be set). The rule lives here, above both loops, because it names both
config classes; the loops and the run scaffold below them (`rljax.runs`) import neither.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Literal

from rljax.checkpoint import resolve_checkpoint
from rljax.config import ConfigError
from rljax.rl.config import RL_ALGORITHMS, RLConfig
from rljax.runs import raw_algorithm, saved_config
from rljax.train.run_config import SUPERVISED_ALGORITHMS, RunConfig, unknown_algorithm

RunKind = Literal["supervised", "rl"]

# kind -> the config class its runs read
RUN_CONFIGS: dict[str, type] = {"supervised": RunConfig, "rl": RLConfig}

# top-level sections only an RL config has (actor, rollout, reward, ...)
RL_SECTIONS = frozenset(f.name for f in dataclasses.fields(RLConfig)) - {f.name for f in dataclasses.fields(RunConfig)}


def run_kind(raw: dict, source: str = "the config") -> RunKind:
    """"supervised" or "rl" for a raw config mapping (a YAML file's, or a run folder's
    `config.yaml`): by `trainer.algorithm`; unset, "supervised" unless `raw` has RL
    sections, which is a `ConfigError` (`source` names the file). An unknown algorithm is a
    `ConfigError` listing both kinds'."""
    algorithm = raw_algorithm(raw)
    if algorithm is None:
        rl_only = sorted(RL_SECTIONS & set(raw))
        if rl_only:
            raise ConfigError(f"trainer.algorithm: not set, and {source} has RL sections ({', '.join(rl_only)}); "
                              f"set it to one of {', '.join(RL_ALGORITHMS)}")
        return "supervised"
    if algorithm in SUPERVISED_ALGORITHMS:
        return "supervised"
    if algorithm in RL_ALGORITHMS:
        return "rl"
    raise unknown_algorithm(algorithm, RL_ALGORITHMS)


def kind_of(path: str, overrides: list[str]) -> str:
    """The run kind (`run_kind`) of the file at `path`, with
    `trainer.algorithm` as the overrides set it."""
    import yaml

    from rljax.config import read_yaml

    raw = read_yaml(path)
    for item in overrides:
        key, _, text = item.partition("=")
        if key.strip() == "trainer.algorithm":
            try:
                algorithm = yaml.safe_load(text)
            except yaml.YAMLError:
                raise ConfigError(f"override {item!r}: the value is not valid YAML") from None
            trainer = raw.get("trainer")
            raw = {**raw, "trainer": {**(trainer if isinstance(trainer, dict) else {}), "algorithm": algorithm}}
    return run_kind(raw, path)


def config_class(path: str, overrides: list[str]) -> type:
    """`RunConfig` or `RLConfig`, by the run kind (unset `trainer.algorithm`: `sft`, unless
    the file has RL sections); an unknown algorithm is a `ConfigError` listing the valid ones."""
    return RUN_CONFIGS[kind_of(path, overrides)]


def checkpoint_kind(path: str) -> RunKind:
    """The run kind of the run `path` names (a run directory, its checkpoints/ or one step
    directory), read from the `config.yaml` the run wrote."""
    run_dir = os.path.dirname(resolve_checkpoint(path)[0])
    return run_kind(saved_config(run_dir), os.path.join(run_dir, "config.yaml"))
