"""`rljax.hostsync` across two real processes (jax.distributed over gloo, 4 CPU devices each):
objects of different sizes gather in process order, a batch every process holds becomes
one global array, and a global array's value comes back whole on every process."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WORKER = textwrap.dedent("""
    import json, sys
    import numpy as np
    from rljax.distributed import initialize
    initialize()
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P
    from rljax.hostsync import allgather_objects, fetch, global_array
    pid = jax.process_index()
    # different sizes per process: process 1 sends a much longer payload
    gathered = allgather_objects({"pid": pid, "tokens": list(range(3 + 40 * pid))})
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    host = np.arange(8 * 5, dtype=np.float32).reshape(8, 5)  # identical on both processes
    x = global_array(host, NamedSharding(mesh, P("data")))
    doubled = jax.jit(lambda a: a * 2)(x)  # a program over both processes' devices
    print("RESULT " + json.dumps({"pid": pid, "gathered": gathered, "addressable": x.is_fully_addressable,
                                  "local_rows": sorted(int(s.index[0].start) for s in x.addressable_shards),
                                  "fetched": fetch(doubled).tolist()}), flush=True)
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_share_host_data_and_global_arrays():
    port = _free_port()
    procs = []
    for i in range(2):
        env = {**os.environ, "RLJAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "RLJAX_NUM_PROCESSES": "2",
               "RLJAX_PROCESS_ID": str(i), "JAX_PLATFORMS": "cpu",
               "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER], cwd=ROOT, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=180)
            assert p.returncode == 0, out[-3000:]
            outs.append(json.loads(next(l for l in out.splitlines() if l.startswith("RESULT "))[7:]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    expected_gather = [{"pid": 0, "tokens": list(range(3))}, {"pid": 1, "tokens": list(range(43))}]
    expected = [[2.0 * (5 * r + c) for c in range(5)] for r in range(8)]
    for i, result in enumerate(outs):
        assert result["pid"] == i
        assert result["gathered"] == expected_gather
        assert result["addressable"] is False
        assert result["local_rows"] == [4 * i + k for k in range(4)]  # each fills only its own rows
        assert result["fetched"] == expected
