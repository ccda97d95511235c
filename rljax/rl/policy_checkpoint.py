"""The policy of an RL run's checkpoint, as a `Decoder`: for `rljax export` and `rljax eval`.

Only the actor's parameters are read (an orbax partial restore into an abstract model, so
nothing else is allocated: no random init, no optimizer state, no critic), with the run's
own tokenizer when the run directory has one."""

from __future__ import annotations

import dataclasses
import os

import jax
from flax import nnx

from rljax.checkpoint import Checkpointer, resolve_checkpoint, restore_params
from rljax.parallel import state_shardings
from rljax.rl.config import RLConfig
from rljax.train.setup import build_decoder, load_tokenizer


def load_policy(cfg: RLConfig, checkpoint: str, mesh, step: int | None = None):
    """(decoder, tokenizer, step) of `checkpoint`: a run directory, its checkpoints/ or one
    step directory; `step` (else the one named, else the latest)."""
    directory, named_step = resolve_checkpoint(checkpoint)
    step = step if step is not None else named_step
    if step is None:
        checkpointer = Checkpointer(directory, max_to_keep=None, async_save=False)
        step = checkpointer.latest_step()
        checkpointer.close()
    if step is None:
        raise FileNotFoundError(f"{directory}: no checkpoint")
    tokenizer_dir = os.path.join(os.path.dirname(directory), "tokenizer")
    section = dataclasses.replace(cfg.model, tokenizer=tokenizer_dir) if os.path.isdir(tokenizer_dir) else cfg.model
    tokenizer = load_tokenizer(section)
    module = nnx.eval_shape(lambda: build_decoder(section, tokenizer, weights=False, mesh=mesh))
    graphdef, abstract = nnx.split(module)
    shardings = state_shardings(abstract, mesh)
    abstract = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), abstract, shardings)
    params = restore_params(directory, step, abstract, ("actor", "params"))
    return nnx.merge(graphdef, params), tokenizer, step
