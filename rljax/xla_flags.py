"""XLA flags rljax adds before a JAX backend starts (no jax import here: `rljax --help`
stays instant and the test setup can apply them before jax reads XLA_FLAGS).

Several CPU devices in one process (``--xla_force_host_platform_device_count=N``): under
XLA:CPU's default, concurrency-optimised schedule two independent collectives of one
program (the LoRA train step's in-scan FSDP all-gather and an all-reduce outside it) can be
entered in different orders by the devices' threads and deadlock, and XLA aborts the
process after 40 s; rljax selects the memory-optimised schedule instead (measurements:
docs/benchmarks.md). Accelerator backends do not read these flags.
"""

from __future__ import annotations

import os
import re
from typing import MutableMapping

# flag -> value rljax sets unless XLA_FLAGS already names the flag
CPU_MULTI_DEVICE_FLAGS = {"xla_cpu_enable_concurrency_optimized_scheduler": "false"}

_DEVICE_COUNT = re.compile(r"--xla_force_host_platform_device_count=(\d+)")


def with_cpu_multi_device_flags(flags: str) -> str:
    """`flags` (an XLA_FLAGS value) plus `CPU_MULTI_DEVICE_FLAGS` when it asks for more than
    one host device; a flag already present keeps the user's value."""
    counts = [int(n) for n in _DEVICE_COUNT.findall(flags)]
    if not counts or counts[-1] <= 1:
        return flags
    added = [f"--{name}={value}" for name, value in CPU_MULTI_DEVICE_FLAGS.items() if f"--{name}=" not in flags]
    return " ".join([flags.strip(), *added]).strip()


def apply(env: MutableMapping[str, str] = os.environ) -> None:
    """Rewrite ``env["XLA_FLAGS"]`` with `with_cpu_multi_device_flags`. Call it before the
    first JAX computation of the process (XLA reads the variable once, at backend start)."""
    flags = env.get("XLA_FLAGS", "")
    updated = with_cpu_multi_device_flags(flags)
    if updated != flags:
        env["XLA_FLAGS"] = updated
