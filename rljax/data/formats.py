"""Data formats: what the pipeline does differently per ``data.format``, in one registry.

A `DataFormat` holds everything that depends on the format:

* `transform`: ``transform(config, tokenizer)`` builds the thread-safe ``Row -> example``
  function (validation, tokenizing, truncation; a padding row gives an empty example);
* `collate`: ``collate(examples, layout)`` makes one batch (`rljax.data.batching`);
* `length`: the token count of an example that `check_dataset` reports;
* `packing`: how first-fit packing joins examples (`Packing`), None where it does not
  apply.

`make_dataset` and `check_dataset` read the spec of ``config.format`` through
`get_format`. A new format is one `register_format` call here; its name must also be in
`rljax.data.config.FORMATS`, which validates configs at load time (a test keeps the two
equal).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from rljax.data.batching import (
    BatchLayout,
    collate_packed,
    collate_preference,
    collate_rl,
    collate_sft,
)
from rljax.data.config import DataConfig
from rljax.data.preference import PreferenceTransform, preference_length
from rljax.data.rl import RLTransform, rl_length
from rljax.data.sft import SFTTransform, sft_length
from rljax.data.sources import Row

Example = dict[str, Any]
Batch = dict[str, Any]
Transform = Callable[[Row], Example]
Collate = Callable[[Sequence[Example], BatchLayout], Batch]


@dataclass(frozen=True)
class Packing:
    """First-fit packing of a format: the example `fields` the packer concatenates (each
    up to ``max_length`` per packed row) and the `collate` of packed rows."""

    fields: tuple[str, ...]
    collate: Collate


@dataclass(frozen=True)
class DataFormat:
    """One ``data.format`` (see the module docstring)."""

    name: str
    transform: Callable[[DataConfig, Any], Transform]
    collate: Collate
    length: Callable[[Example], int]
    packing: Packing | None = None


_FORMATS: dict[str, DataFormat] = {}


def register_format(spec: DataFormat) -> DataFormat:
    """Add `spec` under its name; a second spec of the same name is refused."""
    if spec.name in _FORMATS:
        raise ValueError(f"data format {spec.name!r} is already registered")
    _FORMATS[spec.name] = spec
    return spec


def format_names() -> tuple[str, ...]:
    """The registered format names, sorted."""
    return tuple(sorted(_FORMATS))


def get_format(name: str) -> DataFormat:
    """The spec registered as `name`; a `ValueError` listing the registered ones otherwise."""
    if name not in _FORMATS:
        raise ValueError(
            f"unknown data format {name!r}; registered: {', '.join(format_names())}"
        )
    return _FORMATS[name]


register_format(DataFormat(
    name="sft",
    transform=SFTTransform,
    collate=collate_sft,
    length=sft_length,
    packing=Packing(fields=("input_ids", "loss_mask"), collate=collate_packed),
))
register_format(DataFormat(
    name="preference",
    transform=PreferenceTransform,
    collate=collate_preference,
    length=preference_length,
))
register_format(DataFormat(
    name="rl",
    transform=RLTransform,
    collate=collate_rl,
    length=rl_length,
))
