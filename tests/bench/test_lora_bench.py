"""`rljax bench lora` on the tiny preset, memory plan only: LoRA trains the parameter
count of its formula and its train state is a small fraction of full fine-tuning's."""

import argparse
import json

import pytest

from rljax.bench import lora

pytestmark = pytest.mark.slow


def test_lora_bench_memory_plan(tmp_path):
    parser = argparse.ArgumentParser()
    lora.add_arguments(parser)
    out = tmp_path / "lora.json"
    args = parser.parse_args(["--model", "tiny", "--ranks", "4", "--batch", "8", "--seq-len", "16",
                              "--compile-only", "--out", str(out)])
    assert lora.main(args) == 0
    full, low = json.loads(out.read_text())["rows"]
    # tiny: hidden 64, mlp 128, 2 layers, 4 heads / 2 kv heads of 16: r (in + out) per target and layer
    per_layer = 4 * ((64 + 64) + (64 + 32) + (64 + 32) + (64 + 64) + 2 * (64 + 128) + (128 + 64))
    assert abs(low["trained_M"] * 1e6 - 2 * per_layer) < 0.5
    assert low["state_GiB"] < 0.5 * full["state_GiB"]  # B is split over tensor only: replicated over fsdp here
    assert low["args_GiB"] < full["args_GiB"]
