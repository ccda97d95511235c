"""What both run configs share: the algorithm names, the `model:` and `trainer:` sections,
and the checks of mesh shape and batch sizes.

`RunConfig` (`rljax.train.run_config`, supervised) and `RLConfig` (`rljax.rl.config`) both
import from here, and neither imports the other: `trainer.algorithm` of one kind is
checked against the other kind's names (`check_algorithm`) with both sets defined here.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from rljax.algos.registry import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY
from rljax.config import ConfigError, FieldError, NonNegFloat, NonNegRows, NonNegSteps, Repeats, Seed, Steps, check_name
from rljax.data.config import DataConfig
from rljax.models.lora import LoRAConfig
from rljax.parallel import MeshConfig, ShardingError

# supervised algorithm -> the data format it reads (rljax.train.tasks.TASKS has the same keys)
SUPERVISED_DATA_FORMAT: dict[str, str] = {"sft": "sft", "rm": "preference", "dpo": "preference"}
SUPERVISED_ALGORITHMS: tuple[str, ...] = tuple(SUPERVISED_DATA_FORMAT)

# `trainer.algorithm` of an RL run: the algorithm whose preset (rljax.rl.presets: the advantage
# estimator, policy loss, aggregation, ... of verl's recipe) fills the defaults the config does not set.
RL_ALGORITHMS: tuple[str, ...] = tuple(sorted(
    {"ppo", "dapo", "gmpo"} | (set(ADV_ESTIMATOR_REGISTRY) - {"gae"}) | (set(POLICY_LOSS_REGISTRY) - {"vanilla"})))

Logger = Literal["console", "jsonl", "tensorboard"]  # rljax.tracking.Tracker's loggers
RESUME_MODES = ("auto", "disable")  # or a path


def float_dtype_problem(name: str) -> str | None:
    """What is wrong with `name` as a floating-point dtype, or None."""
    import jax.numpy as jnp

    try:
        dtype = jnp.dtype(name)
    except TypeError:
        return f"unknown dtype {name!r} (e.g. float32, bfloat16, float16)"
    if not jnp.issubdtype(dtype, jnp.floating):
        return f"{name!r} is not a floating-point dtype"
    return None


@dataclass(frozen=True)
class ModelRunConfig:
    """The model to train (verl: `actor_rollout_ref.model`)."""

    path: str = ""  # HF folder (config.json + safetensors) or a .gguf file; empty: random init from hf_config
    hf_config: dict[str, Any] = field(default_factory=dict)  # HF config.json keys for a random model
    tokenizer: str = ""  # tokenizer folder; empty: `path`; "char": rljax's own character tokenizer
    param_dtype: str = "float32"  # dtype the parameters are stored and updated in (float32, bfloat16, ...)
    compute_dtype: str = "float32"  # dtype of activations and matmuls
    # activation recomputation in the backward pass, a name in rljax.models.transformer.REMAT_POLICIES:
    # none | full | save_dots (verl: model.enable_gradient_checkpointing, on/off only)
    remat: str = "none"
    attention: str = "xla"  # attention kernel of the trainer's forward, a name in ATTENTION_KERNELS
    init_seed: Seed = 0  # seed of the random init (no `path`)
    # low-rank adapters (rank > 0): only they (and a score / value head) are trained and checkpointed,
    # the base weights are frozen and are the reference model (rljax.models.lora)
    lora: LoRAConfig = field(default_factory=LoRAConfig)

    def check(self) -> None:
        from rljax.models.attention import ATTENTION_KERNELS
        from rljax.models.config import ModelConfigError, check_hf_dict
        from rljax.models.transformer import REMAT_POLICIES

        try:
            check_hf_dict(self.hf_config)
        except ModelConfigError as e:
            raise FieldError(f"hf_config.{e.key}", e.message) from None

        for name, value, registry in (("remat", self.remat, REMAT_POLICIES),
                                      ("attention", self.attention, ATTENTION_KERNELS)):
            problem = check_name(value, registry)
            if problem:
                raise FieldError(name, problem)
        for name in ("param_dtype", "compute_dtype"):
            problem = float_dtype_problem(getattr(self, name))
            if problem:
                raise FieldError(name, problem)


@dataclass(frozen=True)
class TrainerConfig:
    """The loop: steps, micro-batches, checkpoints, validation, logging (verl: `trainer`)."""

    # sft | rm | dpo (RunConfig); grpo, ppo, dapo, ... (RLConfig: the algorithm's preset fills the keys
    # the config does not set, rljax.rl.presets; docs/algorithms.md lists what each sets)
    algorithm: str = "sft"
    total_steps: Steps = 100  # optimizer steps (RL: rollout steps; verl: total_training_steps)
    micro_batch_size: NonNegRows = 0  # rows per micro-batch (global); 0: the whole mini-batch at once
    seed: Seed = 0  # seed of the train state and the RL mini-batch shuffles
    save_freq: NonNegSteps = 0  # steps between checkpoints; 0: only at the end
    max_to_keep: Repeats = 3  # checkpoints kept on disk (verl: max_actor_ckpt_to_keep)
    async_save: bool = True  # write checkpoints in the background while training goes on
    resume_mode: str = "auto"  # auto | disable | <path to a run dir or checkpoint>
    test_freq: NonNegSteps = 0  # steps between validations; 0: never (but at the end if val_files)
    default_local_dir: str = "runs"  # runs go to <default_local_dir>/<experiment_name>
    project_name: str = "rljax"  # the tracker's project (TensorBoard / JSONL metadata)
    experiment_name: str = "run"  # the run's folder name under default_local_dir
    logger: list[Logger] = field(default_factory=lambda: ["console", "jsonl", "tensorboard"])  # metric sinks
    peak_flops_per_device: NonNegFloat = 0.0  # FLOP/s for perf/mfu; 0: look up the device kind
    # stop after this many consecutive optimizer steps skipped as non-finite; 0: never stop early
    # (a run that skipped any update still exits non-zero at its end)
    max_consecutive_skipped_steps: NonNegSteps = 5
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
    """The mesh sizes, without devices: each >= 1 or -1, at most one -1 (what
    `MeshConfig.check` says per field, as one message about the mesh)."""
    dims = [mesh.data, mesh.fsdp, mesh.tensor]
    try:  # the slices are checked against the filled sizes, with the devices (MeshConfig.shape)
        dataclasses.replace(mesh, dcn_data=1, dcn_fsdp=1).shape(math.prod(d for d in dims if d > 0))
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
    """The batch size's key in messages: `data.batch_size` (verl's `data.train_batch_size`
    is its alias, resolved when the config is loaded)."""
    return "data.batch_size"
