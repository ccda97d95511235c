"""The run config of the supervised trainers (SFT, reward model, DPO): one typed tree.

    model:   what to train (an HF folder, or an HF-style config for a random model)
    data:    rljax.data.DataConfig
    optim:   rljax.train.optim.OptimConfig
    trainer: the loop (steps, micro-batches, logging, validation, checkpoints)
    mesh:    rljax.parallel.MeshConfig
    dpo, rm: objective options

`trainer.algorithm` picks the config kind: one of `SUPERVISED_ALGORITHMS` here, one of
`RL_ALGORITHMS` for `rljax.rl.config.RLConfig` (both in `rljax.train.run_sections`, with
the `model` and `trainer` sections both kinds share). Every value is checked at load
(`rljax.config.check_config`); `validate(cfg, num_devices)` adds the device-count checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rljax.config import ConfigError
from rljax.data.config import DataConfig
from rljax.parallel import MeshConfig
from rljax.train.objectives import DPOConfig, RMConfig
from rljax.train.optim import OptimConfig
from rljax.train.run_sections import (
    RL_ALGORITHMS,
    SUPERVISED_ALGORITHMS,
    SUPERVISED_DATA_FORMAT,
    ModelRunConfig,
    TrainerConfig,
    batch_size_key,
    check_algorithm,
    data_parallel_size,
    unknown_algorithm,
)

__all__ = ["RunConfig", "ModelRunConfig", "TrainerConfig", "SUPERVISED_ALGORITHMS", "unknown_algorithm"]


@dataclass(frozen=True)
class RunConfig:
    """The supervised run (SFT, reward model, DPO): one field per top-level YAML section."""

    model: ModelRunConfig = field(default_factory=ModelRunConfig)  # what to train
    data: DataConfig = field(default_factory=DataConfig)  # files, format, lengths, batch size
    optim: OptimConfig = field(default_factory=OptimConfig)  # optimizer and learning-rate schedule
    trainer: TrainerConfig = field(default_factory=TrainerConfig)  # the loop; trainer.algorithm: sft | rm | dpo
    mesh: MeshConfig = field(default_factory=MeshConfig)  # device mesh (data x fsdp x tensor)
    dpo: DPOConfig = field(default_factory=DPOConfig)  # DPO loss options (trainer.algorithm=dpo)
    rm: RMConfig = field(default_factory=RMConfig)  # reward-model loss options (trainer.algorithm=rm)

    def check(self) -> None:
        """What needs more than one section (run by `rljax.config.check_config` after every
        section's own checks; keys here are full dotted keys)."""
        algorithm = self.trainer.algorithm
        check_algorithm(algorithm, "supervised", SUPERVISED_ALGORITHMS, RL_ALGORITHMS, "an RL")
        wanted = SUPERVISED_DATA_FORMAT[algorithm]
        if self.data.format != wanted:
            raise ConfigError(f"data.format: {self.data.format!r}, but trainer.algorithm={algorithm} reads "
                              f"{wanted!r} data")
        batch, micro = self.data.batch_size, self.trainer.micro_batch_size
        if micro and batch % micro:
            raise ConfigError(f"trainer.micro_batch_size={micro} does not divide {batch_size_key(self.data)}={batch}")

    def check_run(self, num_devices: int | None = None) -> None:
        """Before the run: the resume checkpoint, and batch sizes against the data-parallel
        size of the mesh on `num_devices` (when given)."""
        self.trainer.check_run()
        if num_devices is None:
            return
        ways = data_parallel_size(self.mesh, num_devices)
        batch, micro = self.data.batch_size, self.trainer.micro_batch_size
        for key, size in ((batch_size_key(self.data), batch), ("trainer.micro_batch_size", micro or batch)):
            if size % ways:
                raise ConfigError(f"{key} of size {size} is not divisible by the data-parallel size {ways} "
                                  f"(mesh data x fsdp on {num_devices} devices)")
