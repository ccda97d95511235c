"""`rljax bench replica-compile`: every replica compiling its own programs against
same-shaped replicas sharing them, on the 8-device CPU mesh."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # a subprocess: three rounds of 4 replicas
def test_shared_replicas_compile_what_one_replica_compiles_and_sample_the_same(tmp_path):
    out = tmp_path / "replica_compile.json"
    # its own process: the suite's persistent compilation cache would answer compiles in both modes
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_PERSISTENT_CACHE")
           and k != "JAX_COMPILATION_CACHE_DIR"}
    subprocess.run([sys.executable, "-m", "rljax.cli", "bench", "replica-compile", "--preset", "tiny", "--tp", "2",
                    "--prompts-per-replica", "2", "--n", "2", "--max-tokens", "4", "--repeats", "1",
                    "--out", str(out)], cwd=ROOT, env=env, check=True, capture_output=True, text=True, timeout=900)
    own, shared = json.loads(out.read_text())["rows"]
    assert (own["mode"], shared["mode"]) == ("own", "shared") and own["replicas"] == "4 x tp=2"
    # own: each replica compiles every program it reaches (at least a prefill and a decode)
    assert own["programs_loaded"] == 0 and own["programs_compiled"] >= 4 * 2
    # shared: the same programs reached, each distinct one compiled once, the rest loaded
    assert shared["programs_compiled"] + shared["programs_loaded"] == own["programs_compiled"]
    assert shared["programs_compiled"] == shared["distinct_programs"] == own["distinct_programs"]
    assert own["programs_cached"] == shared["programs_cached"] == 0
    assert own["same_tokens"] is None and shared["same_tokens"] is True
