"""What a run's memory is, as the machine sees it: the peak a step reached, the host's
free memory, and a watch that says, before the kernel's out-of-memory killer ends the
process without a word, that memory is nearly gone.

On an accelerator a device reports its own peak (`memory_stats()["peak_bytes_in_use"]`);
on CPU the devices are the host, so the peak is the process's resident set
(`getrusage` max RSS) and the budget is the host's memory (`/proc/meminfo`).
"""

from __future__ import annotations

import os
import resource
import sys
import threading
from dataclasses import dataclass

GiB = 2**30


def peak_bytes() -> int:
    """The largest memory any local device has held so far (accelerators), or the
    process's peak resident set (CPU, where the devices are the host)."""
    import jax

    peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use", 0) for d in jax.local_devices()
             if d.platform != "cpu"]
    if peaks:
        return int(max(peaks))
    return resident_peak_bytes()


def memory_metrics() -> dict[str, float]:
    """`perf/max_memory_GiB`: `peak_bytes` so far, in GiB (verl logs the like as
    perf/max_memory_allocated_gb)."""
    return {"perf/max_memory_GiB": peak_bytes() / GiB}


def resident_peak_bytes() -> int:
    """This program's peak resident set size: Linux's ``VmHWM``, the high-water mark of
    its own memory (``ru_maxrss`` would also count the parent's peak from before the exec,
    so a benchmark's child would report at least its parent's); ``ru_maxrss`` elsewhere."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # KiB
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def resident_bytes() -> int:
    """This process's resident set size now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class HostMemory:
    total: int  # bytes of RAM (MemTotal)
    available: int  # bytes the kernel can give without swapping (MemAvailable)


def host_memory() -> HostMemory | None:
    """The host's memory from `/proc/meminfo`; None where there is none (not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()[1:]}
    except OSError:
        return None
    return HostMemory(fields["MemTotal"], fields.get("MemAvailable", fields.get("MemFree", 0)))


class MemoryWatch:
    """A daemon thread that reads the host's free memory every `period_s` seconds and,
    the first time it falls under `low_fraction` of the total, writes one line to stderr:
    the process's resident set, what is left, and `advice` (e.g. the micro-batch that
    the plan says fits). An out-of-memory kill that follows is then not silent."""

    def __init__(self, advice: str = "", low_fraction: float = 0.05, period_s: float = 0.5,
                 stream=None, memory=host_memory):
        self.advice = advice
        self.low_fraction = low_fraction
        self.period_s = period_s
        self.stream = stream
        self.memory = memory
        self.warned = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rljax-memory-watch", daemon=True)

    def start(self) -> MemoryWatch:
        if self.memory() is not None:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def check(self) -> bool:
        """One look; True when it warned now."""
        mem = self.memory()
        if self.warned or mem is None or mem.available >= self.low_fraction * mem.total:
            return False
        self.warned = True
        line = (f"rljax: host memory nearly exhausted: {mem.available / GiB:.2f} of {mem.total / GiB:.2f} GiB "
                f"free, this process holds {resident_bytes() / GiB:.2f} GiB; the kernel may kill it"
                + (f"; {self.advice}" if self.advice else ""))
        print(line, file=self.stream or sys.stderr, flush=True)
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.check()
