"""Two processes on localhost (jax.distributed over gloo, 4 CPU devices each) train exactly
like one process with 8 devices, and write one orbax checkpoint together, on data whose
rows make the two processes bucket their halves of a batch to different lengths."""

import json
import os
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from flax import nnx

from rljax.checkpoint import Checkpointer
from rljax.config import load_config
from rljax.data.synthetic_spec import materialize
from rljax.parallel import make_mesh
from rljax.train.optim import make_optimizer
from rljax.train.loop import train
from rljax.train.run_config import RunConfig
from rljax.train.setup import build_decoder, load_tokenizer, train_state_shardings
from rljax.train.steps import init_train_state
from rljax.train.tasks import make_task

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "sft_tiny.yaml")
OVERRIDES = ["trainer.total_steps=3", "data.batch_size=16", "trainer.logger=[jsonl]", "trainer.async_save=false",
             "trainer.test_freq=0", "data.val_files=[]", "data.shuffle=false"]


def ragged_rows(path) -> str:
    """Rows go to processes round-robin (row i to process i % 2): process 0 gets short
    conversations (one 32-token bucket), process 1 long ones (the 64-token bucket), so
    the processes pick different lengths unless `shard_local_batch` makes them agree."""
    rows = []
    for i in range(48):
        a, b = i % 7, i % 5
        question = f"{a}+{b}=" if i % 2 == 0 else f"{a}+{b}= (please, with care) " + "." * 12
        rows.append({"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": str(a + b)}]})
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(path)


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def abstract_state(cfg):
    """The train state's shapes with this process's shardings (nothing compiled)."""
    mesh = make_mesh(cfg.mesh)
    tokenizer = load_tokenizer(cfg.model)
    module = nnx.eval_shape(lambda: make_task(cfg, build_decoder(cfg.model, tokenizer, weights=False), mesh).module)
    params = nnx.state(module)
    optimizer, _ = make_optimizer(cfg.optim, cfg.trainer.total_steps)
    shapes = jax.eval_shape(lambda p: init_train_state(p, optimizer, cfg.trainer.seed), params)
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes,
                        train_state_shardings(params, optimizer, mesh))


def restored_params(run_dir, abstract):
    state, _, meta = Checkpointer(os.path.join(run_dir, "checkpoints"), async_save=False).restore(3, abstract)
    assert meta["step"] == 3
    return [np.asarray(x) for x in jax.tree.leaves(state.params)]


@pytest.mark.parametrize("mesh, slices", [
    ([], []),  # fsdp=8 over both processes
    # 2 slices (a process stands in for each: CPU devices carry no slice id), the data ways across them, fsdp
    # inside each: the hybrid mesh (`rljax.parallel.make_mesh`); the one-process run has the same mesh shape
    (["mesh.data=2", "mesh.fsdp=4"], ["mesh.dcn_data=2"]),
], ids=["fsdp8", "two-slices"])
def test_two_processes_reach_the_same_loss_and_checkpoint_as_one(tmp_path, mesh, slices):
    overrides = [*OVERRIDES, *mesh, f"data.train_files=[{ragged_rows(tmp_path / 'ragged.jsonl')}]"]
    two = tmp_path / "two"
    cfg2 = load_config(RunConfig, CONFIG, [*overrides, f"trainer.default_local_dir={two}"])
    run2 = str(two / cfg2.trainer.experiment_name)
    # Both processes would materialize the synthetic data into the same folder at once
    # (a race in rljax.data.synthetic_spec on one machine); write it before they start.
    materialize(cfg2.data.train_files, os.path.join(run2, "data"), "train")
    env = {**os.environ, "JAX_DEFAULT_MATMUL_PRECISION": "highest"}
    start = time.time()
    proc = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "launch", "local_multiprocess.py"), "-n", "2",
         "--devices-per-process", "4", "--timeout", "400", "--",
         "train", CONFIG, *overrides, *slices, f"trainer.default_local_dir={two}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        # Meanwhile, the reference: this process, 8 devices, the same global mesh (fsdp=8).
        one = tmp_path / "one"
        cfg1 = load_config(RunConfig, CONFIG, [*overrides, f"trainer.default_local_dir={one}"])
        train(cfg1)
        out, _ = proc.communicate(timeout=420)
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"two-process run: {time.time() - start:.1f}s wall")
    assert proc.returncode == 0, out[-4000:]
    run1 = str(one / cfg1.trainer.experiment_name)
    m1, m2 = metrics(run1), metrics(run2)
    assert [m["step"] for m in m2] == [1, 2, 3]
    for a, b in zip(m1, m2):
        assert b["perf/seq_len"] == a["perf/seq_len"] == 64  # process 0's short rows padded to agree
        for key in ("train/loss", "train/grad_norm", "train/loss_denominator"):
            np.testing.assert_allclose(b[key], a[key], rtol=1e-5, err_msg=f"step {a['step']} {key}")
    print("losses", [m["train/loss"] for m in m1], [m["train/loss"] for m in m2])
    # the checkpoint both processes wrote restores here and equals the one-process one
    abstract = abstract_state(cfg1)
    for a, b in zip(restored_params(run2, abstract), restored_params(run1, abstract)):
        np.testing.assert_allclose(a, b, atol=1e-5)
