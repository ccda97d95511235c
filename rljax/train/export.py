"""Export a supervised run's checkpoint (SFT, reward model, DPO) to a Hugging Face folder.

The run's saved `config.yaml` rebuilds the trained module abstractly (no memory), orbax
restores the train state into that layout, and `save_hf` writes the weights one tensor
at a time, with the run's tokenizer. A reward model is written as
`*ForSequenceClassification` (`num_labels=1`).

A LoRA run (`model.lora.rank > 0`) checkpoints only its adapters (and head): the base
weights are rebuilt from the run's `model` section (its `path`, or its seeded random
init), and the export is either the merged full model (default) or, with
`lora_format="peft"`, a PEFT adapter folder (`rljax.models.lora_peft`).

An RL run exports its policy through `rljax.rl.policy_checkpoint.export_policy`; `rljax
export` picks the exporter by the run's kind (`rljax.commands.run_kinds.run_kind`).
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
from flax import nnx

from rljax.checkpoint import Checkpointer, check_param_shapes, resolve_checkpoint, verify_step
from rljax.config import from_dict
from rljax.distributed import is_coordinator
from rljax.models import save_hf
from rljax.models.lora import merge_into_base, split_trainable
from rljax.models.lora_peft import save_peft_adapters
from rljax.parallel import make_mesh, state_shardings
from rljax.runs import raw_algorithm, saved_config
from rljax.train.optim import make_optimizer
from rljax.train.run_config import SUPERVISED_ALGORITHMS, RunConfig
from rljax.train.setup import build_decoder, load_tokenizer
from rljax.train.steps import init_train_state
from rljax.train.tasks import make_task


def load_run_config(run_dir: str) -> RunConfig:
    """The `RunConfig` a supervised run saved in its folder."""
    raw = saved_config(run_dir)
    algorithm = raw_algorithm(raw)
    if algorithm is not None and algorithm not in SUPERVISED_ALGORITHMS:
        raise ValueError(f"{run_dir}: trainer.algorithm={algorithm}, not a supervised run; an RL run's policy is "
                         "exported by rljax.rl.policy_checkpoint.export_policy (`rljax export` picks it)")
    return from_dict(RunConfig, raw)


def abstract_train_state(module: nnx.Module, cfg: RunConfig, mesh):
    """(graphdef, ShapeDtypeStructs of the TrainState with the shardings training used).
    The TrainState holds the trained parameters only (LoRA: adapters and head)."""
    graphdef, params = nnx.graphdef(module), split_trainable(module)[0]
    shardings = state_shardings(params, mesh)
    params = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), params, shardings)
    optimizer, _ = make_optimizer(cfg.optim, cfg.trainer.total_steps)
    init = jax.jit(lambda p: init_train_state(p, optimizer, cfg.trainer.seed))
    shapes = init.eval_shape(params)
    out_shardings = init.lower(params).compile().output_shardings
    return graphdef, jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                                  shapes, out_shardings)


def export_checkpoint(path: str, out: str, step: int | None = None, dtype: str | None = None,
                      max_shard_size: str = "5GB", lora_format: str = "merged") -> str:
    """Write the checkpoint `path` names (a run directory, its checkpoints/ or one step;
    `step`, else the one named, else the latest) as a Hugging Face folder `out`."""
    directory, found_step = resolve_checkpoint(path)
    run_dir = os.path.dirname(directory)
    cfg = load_run_config(run_dir)
    tokenizer_dir = os.path.join(run_dir, "tokenizer")
    tokenizer = load_tokenizer(dataclasses.replace(cfg.model, tokenizer=tokenizer_dir)
                               if os.path.isdir(tokenizer_dir) else cfg.model)
    checkpointer = Checkpointer(directory, max_to_keep=None, async_save=False)
    step = step if step is not None else (found_step if found_step is not None else checkpointer.latest_step())
    if step is None:
        raise FileNotFoundError(f"{directory}: no checkpoint")
    verify_step(directory, step)
    mesh = make_mesh(cfg.mesh)
    if cfg.model.lora.enabled:  # the base weights are not in the checkpoint: rebuild them
        with jax.set_mesh(mesh):
            module = make_task(cfg, build_decoder(cfg.model, tokenizer, mesh=mesh), mesh).module
    else:
        module = nnx.eval_shape(lambda: make_task(cfg, build_decoder(cfg.model, tokenizer, weights=False), mesh).module)
    graphdef, abstract_state = abstract_train_state(module, cfg, mesh)
    check_param_shapes(directory, step, abstract_state.params, ("params",))
    state, _, _ = checkpointer.restore(step, abstract_state)
    trained = nnx.merge(graphdef, state.params, split_trainable(module)[1])
    save_trained(trained, out, cfg.model, tokenizer, dtype, max_shard_size, lora_format, source=(run_dir, step))
    return out


LORA_FORMATS = ("merged", "peft")


SOURCE_FILE = "rljax_export.json"  # beside the weights: the run and step they come from


def save_trained(module, out: str, section, tokenizer, dtype, max_shard_size, lora_format: str = "merged",
                 source: tuple[str, int] | None = None) -> None:
    """Write a trained decoder (or reward model) as a Hugging Face folder; with adapters,
    merged into the base weights or (`lora_format="peft"`) as a PEFT adapter folder.
    `source` (run folder, step) is recorded in `SOURCE_FILE`. Every process of a run
    calls it; process 0 writes, and all return once `out` is complete."""
    if lora_format not in LORA_FORMATS:
        raise ValueError(f"lora_format {lora_format!r}; choose from {list(LORA_FORMATS)}")
    decoder = getattr(module, "backbone", module)
    if lora_format == "peft":
        if not section.lora.enabled or decoder is not module:
            raise ValueError("--lora-format peft: only a LoRA run's policy has a PEFT adapter form")
        if tokenizer is not None and is_coordinator():
            tokenizer.save_pretrained(out)
        save_peft_adapters(decoder, out, section.lora, base_model=section.path, dtype=dtype)  # returns when written
    else:
        if section.lora.enabled:
            merge_into_base(decoder)
        save_hf(module, out, tokenizer=tokenizer, dtype=dtype, max_shard_size=max_shard_size)
    if source is not None and is_coordinator():
        with open(os.path.join(out, SOURCE_FILE), "w") as f:
            json.dump({"run": os.path.abspath(source[0]), "step": int(source[1])}, f)


def export_source(out: str) -> dict | None:
    """The run and step an export in `out` came from (`SOURCE_FILE`), or None."""
    try:
        with open(os.path.join(out, SOURCE_FILE)) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
