"""The run config of the supervised trainers (SFT, reward model, DPO): one typed tree.

    model:   what to train (an HF folder, or an HF-style config for a random model)
    data:    rljax.data.DataConfig
    optim:   rljax.train.optim.OptimConfig
    trainer: the loop (steps, micro-batches, logging, validation, checkpoints)
    mesh:    rljax.parallel.MeshConfig
    dpo, rm: objective options
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rljax.data.config import DataConfig
from rljax.parallel import MeshConfig
from rljax.train.objectives import DPOConfig, RMConfig
from rljax.train.optim import OptimConfig


@dataclass
class ModelSection:
    path: str = ""  # HF folder (config.json + safetensors); empty: random init from hf_config
    hf_config: dict[str, Any] = field(default_factory=dict)  # HF config.json keys for a random model
    tokenizer: str = ""  # tokenizer folder; empty: `path`; "char": rljax's own character tokenizer
    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    remat: str = "none"  # none | full | save_dots
    attention: str = "xla"
    init_seed: int = 0


@dataclass
class TrainerConfig:
    algorithm: str = "sft"  # sft | rm | dpo
    total_steps: int = 100
    micro_batch_size: int = 0  # rows per micro-batch (global); 0: the whole mini-batch at once
    seed: int = 0
    save_freq: int = 0  # steps between checkpoints; 0: only at the end
    max_to_keep: int = 3
    async_save: bool = True
    resume_mode: str = "auto"  # auto | disable | <path to a run dir or checkpoint>
    test_freq: int = 0  # steps between validations; 0: never (but at the end if val_files)
    default_local_dir: str = "runs"  # runs go to <default_local_dir>/<experiment_name>
    project_name: str = "rljax"
    experiment_name: str = "run"
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl", "tensorboard"])
    peak_flops_per_device: float = 0.0  # for perf/mfu; 0: look up the device kind


@dataclass
class RunConfig:
    model: ModelSection = field(default_factory=ModelSection)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    dpo: DPOConfig = field(default_factory=DPOConfig)
    rm: RMConfig = field(default_factory=RMConfig)
