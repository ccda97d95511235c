"""Writing a model whose parameters are sharded over two processes (jax.distributed over
gloo, 4 CPU devices each, fsdp over all 8): a Hugging Face folder (`save_hf`, through
`save_trained` as an export does), a reward model's, a LoRA model's PEFT folder and its
merged form. Every process calls the writer, process 0 alone writes, each returns once the
folder is complete, and the files equal those one process with 8 devices writes for the
same parameter values."""

import dataclasses
import json
import os
import socket
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P
from safetensors.numpy import load_file

from rljax.config import load_config
from rljax.hostsync import global_array
from rljax.models.heads import ScalarHeadModel
from rljax.parallel import MeshConfig, make_mesh
from rljax.train.export import save_trained
from rljax.train.run_config import RunConfig
from rljax.train.setup import build_decoder, load_tokenizer
from tests.parallel.helpers import ROOT, TINY

FOLDERS = ("decoder", "reward", "peft", "merged")


def fill(module, seed: int) -> None:
    """Set every parameter of `module` to seeded normal values (the same on every process),
    sharded over the mesh as before (replicated where it was on one device)."""
    rng = np.random.default_rng(seed)
    mesh = make_mesh(MeshConfig(fsdp=-1))

    def value(x):
        sharding = x.sharding if isinstance(x.sharding, NamedSharding) else NamedSharding(mesh, P())
        return global_array((0.1 * rng.standard_normal(x.shape)).astype(x.dtype), sharding)

    nnx.update(module, jax.tree.map(value, nnx.state(module, nnx.Param)))


def write_all(out: str) -> None:
    """The four folders of the module docstring, under `out`."""
    cfg = load_config(RunConfig, TINY, ["model.hf_config.vocab_size=128", "model.lora.rank=2", "model.lora.alpha=4"])
    plain = dataclasses.replace(cfg.model, lora=dataclasses.replace(cfg.model.lora, rank=0))
    tokenizer = load_tokenizer(cfg.model)
    mesh = make_mesh(MeshConfig(fsdp=-1))
    with jax.set_mesh(mesh):
        decoder = build_decoder(plain, tokenizer, mesh=mesh)
        fill(decoder, 0)
        save_trained(decoder, os.path.join(out, "decoder"), plain, tokenizer, None, "20KB")  # several shards
        reward = ScalarHeadModel(build_decoder(plain, tokenizer, mesh=mesh), rngs=nnx.Rngs(0))
        fill(reward, 1)
        save_trained(reward, os.path.join(out, "reward"), plain, tokenizer, None, "5GB")
        lora = build_decoder(cfg.model, tokenizer, mesh=mesh)
        fill(lora, 2)  # adapters included (B is not zero)
        save_trained(lora, os.path.join(out, "peft"), cfg.model, tokenizer, None, "5GB", lora_format="peft")
        save_trained(lora, os.path.join(out, "merged"), cfg.model, tokenizer, None, "5GB")


WORKER = textwrap.dedent("""
    import json, os, sys
    from rljax.distributed import initialize
    initialize()
    import jax
    from tests.parallel.test_multihost_save import FOLDERS, write_all
    out = sys.argv[1]
    write_all(os.path.join(out, f"process{jax.process_index()}"))
    first = os.path.join(out, "process0")
    print("RESULT " + json.dumps({name: sorted(os.listdir(os.path.join(first, name))) for name in FOLDERS}), flush=True)
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_write_each_model_folder_once_as_one_process_does(tmp_path):
    port = _free_port()
    procs = []
    for i in range(2):
        env = {**os.environ, "RLJAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "RLJAX_NUM_PROCESSES": "2",
               "RLJAX_PROCESS_ID": str(i), "JAX_PLATFORMS": "cpu",
               "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "PYTHONPATH": ROOT}
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path / "two")], cwd=ROOT, env=env,
                                      text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    try:
        write_all(str(tmp_path / "one"))  # meanwhile: one process, 8 devices
        listings = []
        for p in procs:
            out, _ = p.communicate(timeout=400)
            assert p.returncode == 0, out[-5000:]
            listings.append(json.loads(next(l for l in out.splitlines() if l.startswith("RESULT "))[7:]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert not (tmp_path / "two" / "process1").exists()  # process 1 wrote nothing
    two = tmp_path / "two" / "process0"
    for name in FOLDERS:
        files = sorted(os.listdir(tmp_path / "one" / name))
        assert sorted(os.listdir(two / name)) == files, name
        assert listings[0][name] == listings[1][name] == files  # complete when each process returned
        for file in files:
            if file.endswith(".safetensors"):
                a, b = load_file(str(tmp_path / "one" / name / file)), load_file(str(two / name / file))
                assert a.keys() == b.keys()
                for key in a:
                    np.testing.assert_array_equal(b[key], a[key], err_msg=f"{name}/{file} {key}")
            else:
                assert (two / name / file).read_bytes() == (tmp_path / "one" / name / file).read_bytes(), file
    assert len([f for f in os.listdir(two / "decoder") if f.endswith(".safetensors")]) > 1
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(os.listdir(two / "peft"))
