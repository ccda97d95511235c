"""`rljax.memory`: the peak a run reached and the watch that warns before the host's
memory runs out."""

import io
import time

from rljax.memory import GiB, HostMemory, MemoryWatch, host_memory, peak_bytes, resident_bytes, resident_peak_bytes


def test_host_and_process_memory_read_linux():
    mem = host_memory()
    assert mem is not None and 0 < mem.available <= mem.total
    big = bytearray(64 * 2**20)  # touched: resident
    big[::4096] = b"x" * len(big[::4096])
    assert resident_bytes() >= 64 * 2**20 and resident_peak_bytes() >= 64 * 2**20
    assert peak_bytes() == resident_peak_bytes()  # CPU devices: the process's peak


def test_watch_warns_once_when_free_memory_runs_low():
    free = [50 * GiB]
    out = io.StringIO()
    watch = MemoryWatch(advice="try a smaller micro-batch", stream=out, memory=lambda: HostMemory(100 * GiB, free[0]))
    assert not watch.check()  # half free: quiet
    free[0] = 4 * GiB  # under 5%
    assert watch.check() and not watch.check()  # one line, once
    (line,) = out.getvalue().splitlines()
    assert line.startswith("rljax: host memory nearly exhausted: 4.00 of 100.00 GiB free, this process holds ")
    assert line.endswith("; the kernel may kill it; try a smaller micro-batch")


def test_watch_thread_notices_by_itself():
    out = io.StringIO()
    watch = MemoryWatch(stream=out, period_s=0.01, memory=lambda: HostMemory(100, 1)).start()
    deadline = time.monotonic() + 10
    while not watch.warned and time.monotonic() < deadline:
        time.sleep(0.01)
    watch.stop()
    assert watch.warned and "nearly exhausted" in out.getvalue()
