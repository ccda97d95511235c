"""Shared constants of the parallel tests."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "configs", "sft_tiny.yaml")
TINY_FSDP8 = ["model.hf_config.vocab_size=128", "mesh.data=1", "mesh.fsdp=8", "mesh.tensor=1"]
