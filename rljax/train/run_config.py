"""The run config of the supervised trainers (SFT, reward model, DPO): one typed tree.

    model:   what to train (an HF folder, or an HF-style config for a random model)
    data:    rljax.data.DataConfig
    optim:   rljax.train.optim.OptimConfig
    trainer: the loop (steps, micro-batches, logging, validation, checkpoints)
    mesh:    rljax.parallel.MeshConfig
    dpo, rm: objective options

`trainer.algorithm` picks the config kind: one of `SUPERVISED_ALGORITHMS` here, one of
`rljax.rl.config.RL_ALGORITHMS` for `RLConfig`. Every value is checked at load
(`rljax.config.check_config`); `validate(cfg, num_devices)` adds the device-count checks.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from rljax.config import ConfigError, FieldError, NonNegFloat, NonNegInt, PositiveInt, check_name
from rljax.data.config import DataConfig
from rljax.parallel import MeshConfig, ShardingError
from rljax.train.objectives import DPOConfig, RMConfig
from rljax.train.optim import OptimConfig

# supervised algorithm -> the data format it reads (rljax.train.tasks.TASKS has the same keys)
SUPERVISED_DATA_FORMAT: dict[str, str] = {"sft": "sft", "rm": "preference", "dpo": "preference"}
SUPERVISED_ALGORITHMS: tuple[str, ...] = tuple(SUPERVISED_DATA_FORMAT)

LOGGERS = Literal["console", "jsonl", "tensorboard"]  # rljax.tracking.Tracker's loggers
RESUME_MODES = ("auto", "disable")  # or a path


def _float_dtype_problem(name: str) -> str | None:
    import jax.numpy as jnp

    try:
        dtype = jnp.dtype(name)
    except TypeError:
        return f"unknown dtype {name!r} (e.g. float32, bfloat16, float16)"
    if not jnp.issubdtype(dtype, jnp.floating):
        return f"{name!r} is not a floating-point dtype"
    return None


@dataclass
class ModelSection:
    path: str = ""  # HF folder (config.json + safetensors); empty: random init from hf_config
    hf_config: dict[str, Any] = field(default_factory=dict)  # HF config.json keys for a random model
    tokenizer: str = ""  # tokenizer folder; empty: `path`; "char": rljax's own character tokenizer
    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    remat: str = "none"  # none | full | save_dots
    attention: str = "xla"
    init_seed: NonNegInt = 0

    def check(self) -> None:
        from rljax.models.attention import ATTENTION_KERNELS
        from rljax.models.transformer import REMAT_POLICIES

        for name, value, registry in (("remat", self.remat, REMAT_POLICIES),
                                      ("attention", self.attention, ATTENTION_KERNELS)):
            problem = check_name(value, registry)
            if problem:
                raise FieldError(name, problem)
        for name in ("param_dtype", "compute_dtype"):
            problem = _float_dtype_problem(getattr(self, name))
            if problem:
                raise FieldError(name, problem)


@dataclass
class TrainerConfig:
    algorithm: str = "sft"  # sft | rm | dpo (RunConfig); grpo, ppo, dapo, ... (RLConfig)
    total_steps: PositiveInt = 100
    micro_batch_size: NonNegInt = 0  # rows per micro-batch (global); 0: the whole mini-batch at once
    seed: NonNegInt = 0
    save_freq: NonNegInt = 0  # steps between checkpoints; 0: only at the end
    max_to_keep: PositiveInt = 3
    async_save: bool = True
    resume_mode: str = "auto"  # auto | disable | <path to a run dir or checkpoint>
    test_freq: NonNegInt = 0  # steps between validations; 0: never (but at the end if val_files)
    default_local_dir: str = "runs"  # runs go to <default_local_dir>/<experiment_name>
    project_name: str = "rljax"
    experiment_name: str = "run"
    logger: list[LOGGERS] = field(default_factory=lambda: ["console", "jsonl", "tensorboard"])
    peak_flops_per_device: NonNegFloat = 0.0  # for perf/mfu; 0: look up the device kind
    # stop after this many consecutive optimizer steps skipped as non-finite; 0: never
    max_consecutive_skipped_steps: NonNegInt = 5
    resume_fallback: bool = True  # damaged latest checkpoint: resume from the previous one; false: stop

    def check(self) -> None:
        if not self.experiment_name:
            raise FieldError("experiment_name", "must not be empty")

    def check_run(self) -> None:
        """What the machine must have: the checkpoint `resume_mode` names (checked before a
        run starts, not when a saved config is read back)."""
        if self.resume_mode not in RESUME_MODES and not os.path.exists(self.resume_mode):
            raise ConfigError(f"trainer.resume_mode: no such run directory or checkpoint {self.resume_mode!r} "
                              f"(or one of {', '.join(RESUME_MODES)})")


def unknown_algorithm(algorithm: str, rl_algorithms: tuple[str, ...]) -> ConfigError:
    """The error for a `trainer.algorithm` of neither kind, listing both kinds' names."""
    listing = f"supervised: {', '.join(SUPERVISED_ALGORITHMS)}; RL: {', '.join(rl_algorithms)}"
    return ConfigError(f"trainer.algorithm: {check_name(algorithm, (*SUPERVISED_ALGORITHMS, *rl_algorithms), listing=listing)}")


def check_algorithm(algorithm: str, kind: str, own: tuple[str, ...], other: tuple[str, ...], other_kind: str) -> None:
    """`trainer.algorithm` against the algorithms of this config kind (`own`); one of the
    other kind's is named as such."""
    if algorithm in own:
        return
    if algorithm in other:
        raise ConfigError(f"trainer.algorithm: {algorithm!r} is {other_kind} algorithm, not one of the {kind} "
                          f"algorithms ({', '.join(own)})")
    raise unknown_algorithm(algorithm, own if kind == "RL" else other)


def check_mesh_shape(mesh: MeshConfig) -> None:
    """The mesh sizes, without devices: each >= 1 or -1, at most one -1."""
    dims = [mesh.data, mesh.fsdp, mesh.tensor]
    try:
        mesh.shape(math.prod(d for d in dims if d > 0))
    except ShardingError as e:
        raise ConfigError(f"mesh: {e}") from None


def data_parallel_size(mesh: MeshConfig, num_devices: int) -> int:
    """data x fsdp of the mesh on `num_devices` devices (a `ConfigError` naming the mesh)."""
    try:
        data, fsdp, _ = mesh.shape(num_devices)
    except ShardingError as e:
        raise ConfigError(f"mesh: {e}") from None
    return data * fsdp


def batch_size_key(data: DataConfig) -> str:
    """The key the user set the batch size with (verl's `train_batch_size` or `batch_size`)."""
    return "data.train_batch_size" if data.train_batch_size is not None else "data.batch_size"


@dataclass
class RunConfig:
    model: ModelSection = field(default_factory=ModelSection)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    dpo: DPOConfig = field(default_factory=DPOConfig)
    rm: RMConfig = field(default_factory=RMConfig)

    def check(self) -> None:
        """What needs more than one section (keys here are full dotted keys)."""
        from rljax.algos.preference import DPO_LOSS_REGISTRY
        from rljax.rl.config import RL_ALGORITHMS

        algorithm = self.trainer.algorithm
        check_algorithm(algorithm, "supervised", SUPERVISED_ALGORITHMS, RL_ALGORITHMS, "an RL")
        wanted = SUPERVISED_DATA_FORMAT[algorithm]
        if self.data.format != wanted:
            raise ConfigError(f"data.format: {self.data.format!r}, but trainer.algorithm={algorithm} reads "
                              f"{wanted!r} data")
        batch, micro = self.data.batch_size, self.trainer.micro_batch_size
        if micro and batch % micro:
            raise ConfigError(f"trainer.micro_batch_size={micro} does not divide {batch_size_key(self.data)}={batch}")
        check_mesh_shape(self.mesh)
        if algorithm == "dpo":
            problem = check_name(self.dpo.loss_type, DPO_LOSS_REGISTRY)
            if problem:
                raise ConfigError(f"dpo.loss_type: {problem}")
            if not self.dpo.beta > 0:
                raise ConfigError(f"dpo.beta: must be > 0, got {self.dpo.beta:g}")
            if not 0 <= self.dpo.label_smoothing <= 0.5:
                raise ConfigError(f"dpo.label_smoothing: must be in [0, 0.5], got {self.dpo.label_smoothing:g}")

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
