"""`rljax.hostsync` across two real processes (jax.distributed over gloo, 4 CPU devices each):
objects of different sizes gather in process order, a batch every process holds becomes
one global array, and a global array's value comes back whole on every process."""

import textwrap

import pytest

from tests.parallel.helpers import run_two_processes

pytestmark = pytest.mark.slow


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


def test_two_processes_share_host_data_and_global_arrays():
    outs = run_two_processes(WORKER, timeout=180)
    expected_gather = [{"pid": 0, "tokens": list(range(3))}, {"pid": 1, "tokens": list(range(43))}]
    expected = [[2.0 * (5 * r + c) for c in range(5)] for r in range(8)]
    for i, result in enumerate(outs):
        assert result["pid"] == i
        assert result["gathered"] == expected_gather
        assert result["addressable"] is False
        assert result["local_rows"] == [4 * i + k for k in range(4)]  # each fills only its own rows
        assert result["fetched"] == expected
