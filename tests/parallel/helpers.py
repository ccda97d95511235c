"""Shared constants and the two-process runner of the parallel tests."""

import json
import os
import socket
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "configs", "sft_tiny.yaml")
TINY_FSDP8 = ["model.hf_config.vocab_size=128", "mesh.data=1", "mesh.fsdp=8", "mesh.tensor=1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_processes(worker: str, timeout: float) -> list[dict]:
    """Run the Python source `worker` as 2 processes x 4 CPU devices joined by
    `rljax.distributed.initialize`; -> each process's `RESULT {json}` line, by process."""
    port = free_port()
    procs = []
    for i in range(2):
        env = {**os.environ, "RLJAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "RLJAX_NUM_PROCESSES": "2",
               "RLJAX_PROCESS_ID": str(i), "JAX_PLATFORMS": "cpu",
               "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
        procs.append(subprocess.Popen([sys.executable, "-c", worker], cwd=ROOT, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            assert p.returncode == 0, out[-3000:]
            outs.append(json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return outs
