"""Same-shaped rollout replicas share compiled programs: one compile per replica shape.

A replica's programs are jitted on its own devices, and jax compiles a program once per
device assignment, so R replicas of one shape would compile every program R times (in
their threads, side by side). Inside `ProgramShare.scope`, a backend compile whose
program, compile options and devices match one already compiled in this process, the
devices' identities aside, loads that executable onto its own devices instead:

    key = sha256(platform and version, the StableHLO module's bytecode,
                 compile options with the device assignment renumbered 0..n-1,
                 each device's kind and place relative to the first device)
    miss: compile (jax's own path), keep the serialized executable
    hit:  `Client.deserialize_executable(serialized, these devices, these compile options)`

A miss that jax's persistent compilation cache answers (when one is configured) is not
kept: on XLA:CPU an executable that was itself loaded from bytes serializes without its
functions (jax 0.10.2: the copy fails at run time with "Function ... not found"), and with
a warm persistent cache each replica finds its own entry there anyway.

A hit is what jax's persistent compilation cache does on a GPU, whose key leaves the
device assignment out (`jax._src.cache_key`): an executable loads onto any devices of the
same shape. The CPU client binds a loaded executable to the devices it is given in the
same way (`tests/rollout/test_program_share.py` runs shared programs on other devices and
compares every output). A TPU executable is compiled for its chips: the same program
compiled for chips (0, 1) and (2, 3) of a v5e 2x4 slice serializes to 93,542 and
118,452 bytes, so on a TPU each replica compiles its own (`SHAREABLE_PLATFORMS`).

A compile that runs while another thread compiles the same key waits for it and loads the
result. The serialized executables stay in host memory for the life of the process
(`ProgramShare.clear` drops them). Only a program whose devices all belong to this process and which carries no host
callback is shared. The hook is jax's internal `compiler.compile_or_get_cached`; where a
jax version lacks it, nothing is shared and no compile is counted (`programs_compiled`
stays 0, which the tests catch).
"""

from __future__ import annotations

import copy
import hashlib
import threading
import time
from dataclasses import dataclass

import numpy as np

# Platforms whose executables load onto other devices of the same shape (see above).
SHAREABLE_PLATFORMS = frozenset({"cpu", "gpu", "cuda", "rocm"})


@dataclass
class CompileCounts:
    """What a scope's backend compiles cost: programs compiled, loaded from an executable
    another replica compiled, or read from jax's persistent compilation cache, and the
    seconds spent compiling and loading."""

    compiled: int = 0
    loaded: int = 0
    cached: int = 0
    compile_s: float = 0.0
    load_s: float = 0.0  # loads from a replica and reads from the persistent cache

    def as_dict(self) -> dict:
        return {"programs_compiled": self.compiled, "programs_loaded": self.loaded, "programs_cached": self.cached,
                "compile_s": self.compile_s, "program_load_s": self.load_s}


class ProgramShare:
    """Executables compiled in this process, by device-independent key (module docstring).
    `enabled=False` counts compiles and shares nothing."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self._serialized: dict[str, bytes] = {}
        self._compiling: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    def scope(self, counts: CompileCounts) -> "_Scope":
        """Backend compiles on this thread inside the `with` go through the share and are
        counted in `counts`."""
        _install()
        return _Scope(self, counts)

    def __len__(self) -> int:
        return len(self._serialized)

    def clear(self) -> None:
        """Forget every executable (the next replica of each shape compiles again)."""
        with self._lock:
            self._serialized.clear()
            self._compiling.clear()

    def compile(self, compile_fn, backend, computation, compile_options, host_callbacks, executable_devices,
                counts: CompileCounts):
        """The executable for one backend compile: loaded from a shared one, or compiled by
        `compile_fn()` (and kept for the next replica)."""
        key = self.key(backend, computation, compile_options, host_callbacks, executable_devices)
        if key is None:
            return _compile(compile_fn, counts)[0]
        with self._lock:
            lock = self._compiling.setdefault(key, threading.Lock())
        with lock:  # a second replica compiling the same program waits for the first
            serialized = self._serialized.get(key)
            if serialized is not None:
                start = time.perf_counter()
                executable = backend.deserialize_executable(serialized, executable_devices, compile_options)
                counts.loaded += 1
                counts.load_s += time.perf_counter() - start
                return executable
            executable, fresh = _compile(compile_fn, counts)
            if fresh:
                self._serialized[key] = backend.serialize_executable(executable)
            return executable

    def key(self, backend, computation, compile_options, host_callbacks, executable_devices) -> str | None:
        """The program's device-independent key, or None when it is not to be shared."""
        import jax
        from jax._src.interpreters import mlir
        from jax._src.lib import xla_client

        devices = list(executable_devices)
        if (not self.enabled or backend.platform not in SHAREABLE_PLATFORMS or host_callbacks
                or any(d.process_index != jax.process_index() for d in devices)):
            return None
        options = copy.deepcopy(compile_options)
        assignment = options.device_assignment
        if assignment is not None:
            replicas, computations = assignment.replica_count(), assignment.computation_count()
            options.device_assignment = xla_client.DeviceAssignment.create(
                np.arange(replicas * computations).reshape(replicas, computations))
        digest = hashlib.sha256()
        for part in (backend.platform, backend.platform_version, repr(_geometry(devices))):
            digest.update(part.encode())
        digest.update(mlir.module_to_bytecode(computation))
        digest.update(options.SerializeAsString())
        return digest.hexdigest()


def _geometry(devices: list) -> list[tuple]:
    """Each device's kind and its coordinates (where the platform has them) relative to
    the first device's: what two same-shaped replicas have in common."""
    origin = getattr(devices[0], "coords", None)
    return [(d.device_kind, () if origin is None else tuple(np.subtract(d.coords, origin).tolist()),
             getattr(d, "core_on_chip", 0)) for d in devices]


def _compile(compile_fn, counts: CompileCounts):
    """`compile_fn()` counted, and whether it compiled (not a persistent-cache read)."""
    _active.cache_hit = False
    start = time.perf_counter()
    executable = compile_fn()
    seconds = time.perf_counter() - start
    fresh = not _active.cache_hit
    if fresh:
        counts.compiled += 1
        counts.compile_s += seconds
    else:
        counts.cached += 1
        counts.load_s += seconds
    return executable, fresh


_CACHE_HIT = "/jax/compilation_cache/cache_hits"  # the event jax records for a persistent-cache read
_active = threading.local()  # the scope of this thread's compiles, if any; whether its compile was a cache read
_install_lock = threading.Lock()
_installed = False


class _Scope:
    def __init__(self, share: ProgramShare, counts: CompileCounts):
        self.share, self.counts = share, counts

    def __enter__(self):
        self.outer = getattr(_active, "scope", None)
        _active.scope = self
        return self.counts

    def __exit__(self, *exc):
        _active.scope = self.outer


def _install() -> None:
    """Route jax's backend compiles through the active scope (once per process)."""
    global _installed
    if _installed:  # every engine call enters a scope: no lock once installed
        return
    with _install_lock:
        if _installed:
            return
        _installed = True
        import jax
        from jax._src import compiler

        inner = getattr(compiler, "compile_or_get_cached", None)
        if inner is None:
            return

        def on_event(event: str, **kwargs):
            if event == _CACHE_HIT:
                _active.cache_hit = True

        jax.monitoring.register_event_listener(on_event)

        def compile_or_get_cached(backend, computation, devices, compile_options, host_callbacks,
                                  executable_devices, *args, **kwargs):
            scope = getattr(_active, "scope", None)
            compile_fn = lambda: inner(backend, computation, devices, compile_options,  # noqa: E731
                                       host_callbacks, executable_devices, *args, **kwargs)
            if scope is None:
                return compile_fn()
            return scope.share.compile(compile_fn, backend, computation, compile_options, host_callbacks,
                                       executable_devices, scope.counts)

        compiler.compile_or_get_cached = compile_or_get_cached


PROCESS_SHARE = ProgramShare()  # the executables this process's replicas share
