"""rljax: RL post-training for language models in JAX/Flax."""

__version__ = "0.1.0"
