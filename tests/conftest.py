"""Test setup: 8 virtual CPU devices so sharded code runs on a real mesh, and one XLA
compilation cache on disk for the whole session.

Many tests build the same tiny models and compile the same programs: in new trainers of
the same process (a resumed run), in subprocesses (a killed run, `rljax` commands) and in
the processes of multi-process runs. The persistent cache (keyed by the program's HLO,
devices and compile options) lets each of them reuse what an earlier one compiled; the
programs run are the same, only their compilation is skipped. The directory is new for
each session and removed at its end, so no test ever sees another session's programs.

On CPU, jax keys a cached program by its device assignment too, so the same program for
device 3 recompiles what device 0 compiled (8 one-device rollout replicas: 8 compilations).
JAX leaves the assignment out of the key on GPU, where a loaded executable is bound to the
devices of the call's compile options; the CPU client binds the same way (checked: a program
cached for devices (0, 1) runs on (5, 3) with its shards there and the same values), so the
tests leave it out on CPU as well. And the test process compiles one program at a time:
rollout replicas run in threads and would otherwise all compile the same program at once,
each missing the cache. Subprocesses keep jax's ways unless a test opts them in (the
multi-process RL tests do, through a sitecustomize hook).
"""
import os
import shutil
import tempfile
import threading

from rljax import xla_flags

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
xla_flags.apply()  # the CPU flags rljax's command line adds for several devices (no CPU collective deadlock)
_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _OWN_CACHE:  # inherited by every subprocess a test starts
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="rljax-test-xla-cache-")
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


def _share_programs_across_devices():
    from jax._src import cache_key, compiler  # private: if they move, tests only compile more

    hash_options = getattr(cache_key, "_hash_serialized_compile_options", None)
    compile_or_get_cached = getattr(compiler, "compile_or_get_cached", None)
    if hash_options is None or compile_or_get_cached is None:
        return

    def without_device_assignment(hash_obj, compile_options, strip_device_assignment=False):
        return hash_options(hash_obj, compile_options, strip_device_assignment=True)

    lock = threading.Lock()

    def one_at_a_time(*args, **kwargs):
        with lock:
            return compile_or_get_cached(*args, **kwargs)

    cache_key._hash_serialized_compile_options = without_device_assignment
    compiler.compile_or_get_cached = one_at_a_time


def _atomic_cache_writes():
    """jax writes a cache entry in place (`Path.write_bytes`), so a process reading the
    shared directory can see a half-written entry (two xdist workers, a test and its
    subprocess). Write to a private temporary name and rename it into place instead."""
    from jax._src import lru_cache  # private: if it moves, writes stay jax's own

    cache_class = getattr(lru_cache, "LRUCache", None)
    if cache_class is None or not hasattr(cache_class, "put"):
        return
    put = cache_class.put

    def atomic_put(self, key, value):
        if self.eviction_enabled:  # a size limit: jax's own locked bookkeeping
            return put(self, key, value)
        target = self.path / f"{key}{lru_cache._CACHE_SUFFIX}"
        if target.exists():
            return
        fd, tmp = tempfile.mkstemp(dir=str(self.path), prefix=".partial-")
        with os.fdopen(fd, "wb") as f:
            f.write(value)
        os.replace(tmp, str(target))

    cache_class.put = atomic_put


# pytest-xdist workers inherit the controller's cache directory (shared by both workers,
# removed by the controller) and share programs the same way.
if _OWN_CACHE or os.environ.get("PYTEST_XDIST_WORKER"):
    _share_programs_across_devices()
    _atomic_cache_writes()


def pytest_sessionfinish(session, exitstatus):
    if _OWN_CACHE:
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
