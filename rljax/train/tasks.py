"""What each supervised algorithm trains, on which data, with which objective.

A task is the only thing that differs between SFT, reward-model and DPO training; the
loop (`rljax.train.loop`) is shared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import jax
from flax import nnx

from rljax.models.heads import ScalarHeadModel
from rljax.models.lora import has_adapters
from rljax.models.transformer import Decoder
from rljax.parallel import state_shardings
from rljax.train.objectives import dpo_objective, rm_objective, sft_objective
from rljax.train.run_config import RunConfig


@dataclass
class Task:
    module: nnx.Module  # the trained module (its nnx.Params are optimised)
    objective: Callable
    data_format: str  # the rljax.data format it reads
    frozen: Any = None  # arrays read but never trained (the DPO reference model)
    frozen_sharding: Any = None


def sft_task(cfg: RunConfig, decoder: Decoder, mesh) -> Task:
    return Task(decoder, sft_objective(), "sft")


def rm_task(cfg: RunConfig, decoder: Decoder, mesh) -> Task:
    return Task(ScalarHeadModel(decoder, rngs=nnx.Rngs(cfg.model.init_seed + 1)), rm_objective(cfg.rm), "preference")


def dpo_task(cfg: RunConfig, decoder: Decoder, mesh) -> Task:
    """The reference is the initial policy: a frozen copy of its weights, on the mesh in
    the same layout, passed to the step as a read-only argument (no optimizer state).
    With LoRA it is the policy with its adapters off: no copy at all."""
    graphdef, state = nnx.split(decoder)
    if cfg.dpo.reference_free or has_adapters(decoder):
        return Task(decoder, dpo_objective(cfg.dpo, None), "preference")
    sharding = state_shardings(state, mesh)
    reference = jax.device_put(jax.tree.map(lambda x: x.copy(), state), sharding)
    return Task(decoder, dpo_objective(cfg.dpo, graphdef), "preference", reference, sharding)


TASKS: dict[str, Callable[[RunConfig, Decoder, Any], Task]] = {
    "sft": sft_task,
    "rm": rm_task,
    "dpo": dpo_task,
}


def make_task(cfg: RunConfig, decoder: Decoder, mesh) -> Task:
    if cfg.trainer.algorithm not in TASKS:
        raise ValueError(f"trainer.algorithm={cfg.trainer.algorithm!r}; choose from {sorted(TASKS)}")
    return TASKS[cfg.trainer.algorithm](cfg, decoder, mesh)
