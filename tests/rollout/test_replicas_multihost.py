"""Two processes on localhost (jax.distributed over gloo, 4 CPU devices each): both
derive the same replicas, each process's replicas lie on its own devices, and the
hand-off from an fsdp layout over both processes gives every replica the exact weights;
a replica spanning both processes works when allowed."""

import json
import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_processes() -> list[list[dict]]:
    """Per process, its JSON line per layout."""
    port = free_port()
    procs = []
    for index in range(2):
        env = {**os.environ, "RLJAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "RLJAX_NUM_PROCESSES": "2",
               "RLJAX_PROCESS_ID": str(index), "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT,
               "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "RLJAX_INIT_TIMEOUT": "120"}
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "replica_multihost_worker.py")],
                                      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=300)
            assert p.returncode == 0, out[-3000:]
            outputs.append([json.loads(line) for line in out.splitlines() if line.startswith("{")])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return outputs


def test_two_processes_agree_on_replicas_and_hand_off_exact_weights():
    per_process = run_two_processes()
    assert [[line["process"] for line in lines] for lines in per_process] == [[0, 0], [1, 1]]
    layouts = [
        ([[0, 1], [2, 3]], [[0, 0], [0, 0], [1, 1], [1, 1]]),  # tp = 2: inside each process
        ([[0], [0]], [[0] * 4 + [1] * 4]),  # tp = 8: one replica over both
    ]
    for (p0, p1), (local, processes) in zip(zip(*per_process), layouts):
        check_layout(p0, p1, local, processes)


def check_layout(p0, p1, local, processes):
    assert [p0["local_replicas"], p1["local_replicas"]] == local
    assert p0["replica_devices"] == p1["replica_devices"]
    assert p0["replica_processes"] == processes
    assert p0["bytes"] == p1["bytes"] and len(p0["bytes"]) == 1  # every device holds the same share
    assert p0["allocated"] == p0["bytes"]  # fsdp -> replica layout: all new
