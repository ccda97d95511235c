"""TPU slices by name: their devices (from libtpu, no TPU needed) and their chips' peaks.

Names: Cloud accelerator types (`v5e-16`, `v5litepod-16`, `v6e-16`, `v5p-32`) or libtpu
topology names (`v5e:4x4`, `v5p:2x2x4`). Accelerator types count chips for v5e / v6e
but TensorCores for v5p (two per chip: `v5p-32` is 16 chips), as Cloud TPU names them.

Peaks per chip (bf16 dense FLOP/s, HBM bandwidth, HBM capacity) are Google Cloud's
published figures: https://cloud.google.com/tpu/docs/v5e ("197 TFLOPs bf16, 819 GBps,
16 GiB"), https://cloud.google.com/tpu/docs/v5p ("459 TFLOPs bf16, 2765 GBps, 95 GiB"),
https://cloud.google.com/tpu/docs/v6e ("918 TFLOPs bf16, 1640 GBps, 32 GiB").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GiB = 1024**3


@dataclass(frozen=True)
class Chip:
    """One TPU chip's published peaks (see the module docstring for the sources)."""

    name: str  # the libtpu topology prefix: v5e, v5p, v6e
    peak_flops: float  # bf16 dense FLOP/s
    hbm_bandwidth: float  # bytes/s
    hbm_bytes: int
    cores_per_chip: int  # how Cloud accelerator types count: `v5p-32` = 32 cores = 16 chips
    dims: int  # 2 (v5e, v6e: 2D torus) or 3 (v5p)
    aliases: tuple[str, ...] = ()


CHIPS: dict[str, Chip] = {}


def register_chip(chip: Chip) -> Chip:
    for name in (chip.name, *chip.aliases):
        if name in CHIPS:
            raise ValueError(f"TPU chip {name!r} is registered twice")
        CHIPS[name] = chip
    return chip


register_chip(Chip("v5e", 197e12, 819e9, 16 * GiB, 1, 2, aliases=("v5litepod",)))
register_chip(Chip("v5p", 459e12, 2765e9, 95 * GiB, 2, 3))
register_chip(Chip("v6e", 918e12, 1640e9, 32 * GiB, 1, 2))

# chips -> the torus libtpu builds for them (the standard slice shapes of each generation)
_SHAPES_2D = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8), 128: (8, 16), 256: (16, 16)}
_SHAPES_3D = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4), 128: (4, 4, 8),
              256: (4, 8, 8), 512: (8, 8, 8)}


@dataclass(frozen=True)
class Slice:
    """A TPU slice: its chip, the libtpu topology name and the chips per host."""

    name: str  # as given
    chip: Chip
    topology_name: str  # e.g. v5e:4x4
    chips: int
    host_bounds: tuple[int, int, int]  # chips per host along each torus axis

    @property
    def hosts(self) -> int:
        per_host = self.host_bounds[0] * self.host_bounds[1] * self.host_bounds[2]
        return max(1, self.chips // per_host)


def parse_slice(name: str) -> Slice:
    """`v5e-16`, `v5litepod-16`, `v5p-32`, `v6e-16` or `v5e:4x4` -> the Slice. Raises
    ValueError (one line, listing the chips) for anything else."""
    known = ", ".join(sorted(CHIPS))
    m = re.fullmatch(r"([a-z0-9]+)(?:-(\d+)|:(\d+(?:x\d+)+))", name.strip().lower())
    if not m or m.group(1) not in CHIPS:
        raise ValueError(f"--topology {name!r}: expected <chip>-<count> or <chip>:<AxB[xC]> with chip one of {known}")
    chip = CHIPS[m.group(1)]
    if m.group(2):
        count = int(m.group(2))
        if count % chip.cores_per_chip:
            raise ValueError(f"--topology {name!r}: {chip.name} counts {chip.cores_per_chip} cores per chip")
        chips = count // chip.cores_per_chip
        shapes = _SHAPES_3D if chip.dims == 3 else _SHAPES_2D
        if chips not in shapes:
            raise ValueError(f"--topology {name!r}: no standard {chip.name} slice of {chips} chips "
                             f"(chips: {sorted(shapes)})")
        dims = shapes[chips]
    else:
        dims = tuple(int(d) for d in m.group(3).split("x"))
        if len(dims) != chip.dims:
            raise ValueError(f"--topology {name!r}: {chip.name} topologies have {chip.dims} dimensions")
        chips = 1
        for d in dims:
            chips *= d
    topology = f"{chip.name}:" + "x".join(str(d) for d in dims)
    # hosts of 4 chips (2 x 2) in multi-host slices; a single 8-chip v5e / v6e host is 2 x 4
    if chips <= 4:
        bounds = (*dims[:2], 1) if chip.dims == 2 else dims
        bounds = tuple(bounds) + (1,) * (3 - len(bounds))
    elif chips == 8 and chip.dims == 2:
        bounds = (2, 4, 1)
    else:
        bounds = (2, 2, 1)
    return Slice(name, chip, topology, chips, tuple(bounds))


_SUB_2D = {1: (1, 1), 2: (1, 2), 4: (2, 2), 8: (2, 4)}
_SUB_3D = {1: (1, 1, 1), 2: (1, 2, 1), 4: (2, 2, 1), 8: (2, 2, 2)}


def sub_slice(tpu: Slice, chips: int) -> Slice:
    """A slice of `chips` chips of the same kind, laid out as a host lays them out: the
    topology a rollout replica's programs are compiled for. libtpu fails a program with
    collectives over a subset of a multi-host topology whose chip ids are not 0..n-1
    (docs/design.md), while a replica's programs only ever touch its own chips."""
    shapes = _SUB_3D if tpu.chip.dims == 3 else _SUB_2D
    if chips not in shapes:
        raise ValueError(f"a rollout replica of {chips} {tpu.chip.name} chips: supported sizes {sorted(shapes)}")
    return parse_slice(f"{tpu.chip.name}:" + "x".join(str(d) for d in shapes[chips]))


def slice_devices(tpu: Slice, num_slices: int = 1) -> list:
    """The devices of `num_slices` such slices, as libtpu describes them (no TPU needed;
    run with JAX_PLATFORMS=cpu on a host without one). Raises RuntimeError naming the
    package when libtpu is missing, and with libtpu's reason when it cannot."""
    import os

    from jax.experimental import topologies

    if not libtpu_available():
        raise RuntimeError(f"cannot describe TPU topology {tpu.topology_name}: libtpu is not installed; "
                           f"pip install \"jax[tpu]==<your jax version>\"")
    # libtpu takes a machine-wide lock (/tmp/libtpu_lockfile) unless told that several processes may
    # load it; compiling needs no TPU, so two compiles (or a compile and a test) may run side by side
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        topology = topologies.get_topology_desc(platform="tpu", topology_name=tpu.topology_name,
                                                chip_config_name="default", chips_per_host_bounds=tpu.host_bounds,
                                                num_slices=num_slices)
    except Exception as e:  # noqa: BLE001 - the plugin reports a missing libtpu in several ways
        first = (str(e).strip().splitlines() or [""])[0]
        raise RuntimeError(f"libtpu cannot describe TPU topology {tpu.topology_name}: {type(e).__name__}: {first}") from None
    return list(topology.devices)


def libtpu_available() -> bool:
    """Whether the libtpu package (the TPU compiler) is installed."""
    import importlib.util

    return importlib.util.find_spec("libtpu") is not None
