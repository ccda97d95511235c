"""One sharded init shared by the tests that measure it (compiling is the slow part)."""

import pytest
from flax import nnx

from rljax.config import load_config
from rljax.parallel import make_mesh
from rljax.train.optim import make_optimizer
from rljax.train.run_config import RunConfig
from rljax.train.setup import build_decoder, init_sharded_train_state, load_tokenizer
from tests.parallel.helpers import TINY, TINY_FSDP8


@pytest.fixture(scope="session")
def tiny_fsdp8():
    """(run config, mesh, TrainState) of configs/sft_tiny.yaml on fsdp=8, built the way
    `rljax train` builds it: sharded init, then the sharded train state."""
    cfg = load_config(RunConfig, TINY, TINY_FSDP8)
    mesh = make_mesh(cfg.mesh)
    params = nnx.state(build_decoder(cfg.model, load_tokenizer(cfg.model), mesh=mesh))
    optimizer, _ = make_optimizer(cfg.optim, cfg.trainer.total_steps)
    return cfg, mesh, init_sharded_train_state(params, optimizer, cfg.trainer.seed, mesh)
