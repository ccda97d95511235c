"""Two processes resuming from a checkpoint whose latest step is damaged restore the
same, previous step: process 0 checks the files and broadcasts its verdict (process 1
never reads the checksums), and only process 0 prints the line."""

import os
import socket
import subprocess
import sys
import textwrap

import pytest

from .test_checkpoint_checksums import flip_byte, largest_array_file, save_two

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
RESUME = textwrap.dedent("""
    import sys
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(sys.argv[1], num_processes=2, process_id=int(sys.argv[2]))
    sys.path.insert(0, sys.argv[4])
    from test_checkpoint_checksums import make_state
    from rljax.checkpoint import Checkpointer, abstract_like, resume
    found = resume("auto", Checkpointer(sys.argv[3], async_save=False), abstract_like(make_state()))
    print("restored step", found.step, flush=True)
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_process_restores_the_step_process_0_verified(tmp_path):
    directory = save_two(tmp_path / "ckpt")
    flip_byte(largest_array_file(os.path.join(directory, "2")))
    address = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.path.dirname(os.path.dirname(HERE))}
    procs = [subprocess.Popen([sys.executable, "-c", RESUME, address, str(i), directory, HERE], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        assert "restored step 1" in out, out
    damaged = [[line for line in err.splitlines() if "is damaged" in line] for _, err in outs]
    assert len(damaged[0]) == 1 and f"{directory}/2 is damaged" in damaged[0][0] and damaged[1] == []
    assert sorted(os.listdir(directory)) == ["1", "2.damaged"]
