"""The policy of an RL run's checkpoint, as a `Decoder`: for `rljax export` and `rljax eval`.

Only the actor's parameters are read (an orbax partial restore into an abstract model, so
nothing else is allocated: no random init, no optimizer state, no critic), with the run's
own tokenizer when the run directory has one."""

from __future__ import annotations

import dataclasses
import os

import jax
from flax import nnx

from rljax.checkpoint import Checkpointer, resolve_checkpoint, restore_params, verify_step
from rljax.config import from_dict
from rljax.train.export import save_trained
from rljax.parallel import make_mesh, state_shardings
from rljax.rl.config import RL_ALGORITHMS, RLConfig
from rljax.runs import raw_algorithm, saved_config
from rljax.models.lora import split_trainable
from rljax.train.setup import build_decoder, load_tokenizer


def load_policy(cfg: RLConfig, checkpoint: str, mesh, step: int | None = None):
    """(decoder, tokenizer, step) of `checkpoint`: an RL run directory, its checkpoints/ or
    one step directory; `step` (else the one named, else the latest)."""
    directory, named_step = resolve_checkpoint(checkpoint)
    run_dir = os.path.dirname(directory)
    if raw_algorithm(saved_config(run_dir)) not in RL_ALGORITHMS:
        raise ValueError(f"{checkpoint}: a supervised run's checkpoint, with no RL policy in it; export it "
                         "(rljax export) and set model.path to the export instead")
    step = step if step is not None else named_step
    if step is None:
        checkpointer = Checkpointer(directory, max_to_keep=None, async_save=False)
        step = checkpointer.latest_step()
        checkpointer.close()
    if step is None:
        raise FileNotFoundError(f"{directory}: no checkpoint")
    verify_step(directory, step)
    tokenizer_dir = os.path.join(run_dir, "tokenizer")
    section = dataclasses.replace(cfg.model, tokenizer=tokenizer_dir) if os.path.isdir(tokenizer_dir) else cfg.model
    tokenizer = load_tokenizer(section)
    if section.lora.enabled:  # the checkpoint holds the adapters; the base comes from the model section
        with jax.set_mesh(mesh):
            module = build_decoder(section, tokenizer, mesh=mesh)
    else:
        module = nnx.eval_shape(lambda: build_decoder(section, tokenizer, weights=False, mesh=mesh))
    graphdef = nnx.graphdef(module)
    abstract, base = split_trainable(module)
    shardings = state_shardings(abstract, mesh)
    abstract = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), abstract, shardings)
    params = restore_params(directory, step, abstract, ("actor", "params"))
    return nnx.merge(graphdef, params, base), tokenizer, step


def export_policy(path: str, out: str, step: int | None = None, dtype: str | None = None,
                  max_shard_size: str = "5GB", lora_format: str = "merged") -> str:
    """`rljax export` of an RL run (`path`: its directory, checkpoints/ or one step): the
    policy as a Hugging Face folder `out`, with the run's tokenizer."""
    directory, _ = resolve_checkpoint(path)
    cfg = from_dict(RLConfig, saved_config(os.path.dirname(directory)))
    policy, tokenizer, step = load_policy(cfg, path, make_mesh(cfg.mesh), step)
    save_trained(policy, out, cfg.model, tokenizer, dtype, max_shard_size, lora_format,
                 source=(os.path.dirname(directory), step))
    return out
