"""Several slices: the hybrid mesh (`mesh.dcn_data` / `mesh.dcn_fsdp`: the data / fsdp ways
across slices, everything else inside one), checked on the devices libtpu describes for 2
v5e-16 slices, and on CPU where each process stands in for a slice; the DCN bytes
`rljax plan` estimates, by hand; the errors."""

import re

import numpy as np
import pytest

from rljax.cli import main as cli_main
from rljax.commands.plan import load_raw, make_plan
from rljax.config import ConfigError, load_config
from rljax.parallel import MeshConfig, ShardingError, make_mesh
from rljax.tpu.topology import libtpu_available, parse_slice, slice_devices

from rljax.train.run_config import RunConfig
from tests.parallel.helpers import TINY
from tests.parallel.test_plan import TINY_MODEL

needs_libtpu = pytest.mark.skipif(not libtpu_available(), reason="libtpu (jax[tpu]) is not installed")


@pytest.fixture(scope="module")
def two_slices():
    return slice_devices(parse_slice("v5e-16"), num_slices=2)


def slice_grid(mesh) -> np.ndarray:
    return np.vectorize(lambda d: d.slice_index)(mesh.devices)


@needs_libtpu
def test_data_across_slices_puts_one_slice_on_each_data_row(two_slices):
    mesh = make_mesh(MeshConfig(data=2, fsdp=-1, tensor=2, dcn_data=2), two_slices)
    assert dict(mesh.shape) == {"data": 2, "fsdp": 8, "tensor": 2}
    grid = slice_grid(mesh)
    assert (grid[0] == 0).all() and (grid[1] == 1).all()


@needs_libtpu
def test_fsdp_across_slices_splits_the_fsdp_axis_into_one_block_per_slice(two_slices):
    mesh = make_mesh(MeshConfig(data=1, fsdp=-1, tensor=1, dcn_fsdp=2), two_slices)
    assert dict(mesh.shape) == {"data": 1, "fsdp": 32, "tensor": 1}
    assert slice_grid(mesh)[0, :, 0].tolist() == [0] * 16 + [1] * 16
    # tensor and the inner data ways never cross: every (data, tensor) column of a block is one slice
    mesh = make_mesh(MeshConfig(data=2, fsdp=8, tensor=2, dcn_fsdp=2), two_slices)
    grid = slice_grid(mesh)
    assert (grid[:, :4] == 0).all() and (grid[:, 4:] == 1).all()


@needs_libtpu
def test_slices_that_do_not_match_the_mesh_are_one_line(two_slices):
    with pytest.raises(ShardingError, match=r"devices are on 2 slices: set mesh.dcn_data x mesh.dcn_fsdp = 2"):
        make_mesh(MeshConfig(), two_slices)
    with pytest.raises(ShardingError, match=r"= 4 slices, but the 32 devices are on 2"):
        make_mesh(MeshConfig(data=4, dcn_data=4), two_slices)


def test_without_slice_ids_each_process_is_a_slice():
    import jax

    devices = jax.devices()  # 8 CPU devices of this one process: one slice
    with pytest.raises(ShardingError, match="2 slices, but the 8 devices are on 1 .processes stand in for slices here."):
        make_mesh(MeshConfig(data=2, fsdp=4, dcn_data=2), devices)


def test_the_ways_across_slices_divide_their_axis():
    with pytest.raises(ConfigError, match=r"mesh.dcn_fsdp: 3 slices do not divide mesh.fsdp=8"):
        load_config(RunConfig, TINY, ["mesh.fsdp=8", "mesh.dcn_fsdp=3"])
    with pytest.raises(ShardingError, match=r"mesh.dcn_data=2: the slices do not divide mesh.data=1"):
        MeshConfig(data=1, fsdp=-1, dcn_data=2).shape(8)
    assert MeshConfig(data=1, fsdp=-1, dcn_fsdp=2).slice_shape(8) == (1, 4, 1)


def test_plan_counts_the_bytes_that_cross_slices_by_hand(capsys):
    """A tiny fp32 model (bf16 compute) on 16 devices in 2 slices, 16 prompts x 2 samples,
    mini-batches of 8 prompts (2 optimizer steps) of one 16-row micro-batch each, old and
    reference log-prob forwards over 32 rows (2 micro-batches each): per chip, in bytes of
    its shard (4-byte params and grads, 2-byte compute copies)."""
    config = TINY.replace("sft_tiny.yaml", "gsm8k_qwen2.5_0.5b_grpo.yaml")
    common = [f"model.hf_config={TINY_MODEL}", "model.param_dtype=float32", "data.train_batch_size=16",
              "rollout.n=2", "actor.ppo_mini_batch_size=8", "actor.ppo_micro_batch_size_per_device=1", "actor.ppo_epochs=1", "rollout.tensor_parallel_size=2",
              "actor.use_kl_loss=true"]
    params = 128 * 64 + 2 * (64 * 64 * 2 + 64 * 16 * 2 * 2 + 3 * 64 * 128 + 2 * 64 + 64 + 16 * 2 * 2) + 64
    fsdp = make_plan(load_raw(config, [*common, "mesh.data=1", "mesh.fsdp=16", "mesh.dcn_fsdp=2"]), devices=16)
    rows = dict(fsdp.dcn)
    shard = -(-params // 16)  # about: the biases and norms do not split, see the planned bytes
    train = rows["fsdp over 2 slices: train all-gathers + reduce-scatter (2 micro-batches)"]
    forwards = rows["fsdp over 2 slices: log-prob forwards' all-gathers (4 micro-batches)"]
    assert train == 2 * (2 * 2 + 4) * (forwards // 8)  # micro-batches x (2 all-gathers x 2 bytes + 4-byte grads)
    assert forwards // 8 == pytest.approx(shard, rel=0.1)  # 4 micro-batches x 2 bytes
    handoff = rows["fsdp over 2 slices: weight hand-off into the replicas"]
    assert handoff == fsdp.rollout.weights_bytes // 2
    data = make_plan(load_raw(config, [*common, "mesh.data=2", "mesh.fsdp=8", "mesh.dcn_data=2"]), devices=16)
    (name, nbytes), = data.dcn
    assert name == "data over 2 slices: gradient all-reduce (2 micro-batches)"
    grads = dict(data.rows)["gradients"]
    assert nbytes == 2 * 2 * 1 * grads // 2  # micro-batches x ring all-reduce 2 (n - 1) / n x grads
    single = make_plan(load_raw(config, [*common, "mesh.data=2", "mesh.fsdp=8"]), devices=16)
    assert single.dcn == []
    assert cli_main(["plan", config, *common, "mesh.data=2", "mesh.fsdp=8", "mesh.dcn_data=2", "--devices", "16"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^total DCN bytes per chip per step\s+[\d.]+\s+" + f"{nbytes:,}", out, re.M)


@pytest.mark.slow
def test_two_processes_stand_in_for_two_slices():
    """On CPU (no slice ids) each process is a slice: with the data ways across slices, each
    data row of the mesh is one process's devices; with fsdp across, each half of the fsdp
    axis. Both processes build the same mesh."""
    from tests.parallel.helpers import run_two_processes

    worker = """
import json
import numpy as np
from rljax.distributed import initialize
initialize()
from rljax.parallel import MeshConfig, make_mesh
grid = lambda mesh: np.vectorize(lambda d: d.process_index)(mesh.devices).tolist()
ids = lambda mesh: np.vectorize(lambda d: d.id)(mesh.devices).tolist()
data = make_mesh(MeshConfig(data=2, fsdp=-1, tensor=1, dcn_data=2))
fsdp = make_mesh(MeshConfig(data=1, fsdp=-1, tensor=2, dcn_fsdp=2))
print("RESULT " + json.dumps({"data": grid(data), "fsdp": grid(fsdp), "ids": [ids(data), ids(fsdp)]}))
"""
    first, second = run_two_processes(worker, timeout=120)
    assert first == second
    assert first["data"] == [[[0]] * 4, [[1]] * 4]
    assert first["fsdp"] == [[[0, 0], [0, 0], [1, 1], [1, 1]]]
