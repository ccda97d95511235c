"""Compiling a run for a TPU slice this machine does not have (`rljax compile`).

`libtpu` (from `pip install "jax[tpu]==<jax version>"`) describes any TPU topology and
compiles for it on a CPU host: `topology` turns a slice name into its devices and the
chip's published peaks, `programs` builds every program an RL run executes on abstract
shapes (the trainers' own step builders), `supervised` those of an SFT, reward-model or
DPO run, `report` compiles them and reads per-chip
memory and cost from the compiler, with a roofline bound.
"""
