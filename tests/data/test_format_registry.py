"""The formats' registry: one spec per ``data.format``, each usable end to end."""

from __future__ import annotations

import numpy as np
import pytest

from rljax.data import DataConfig, format_names, get_format, synthetic
from rljax.data.batching import BatchLayout
from rljax.data.config import FORMATS
from rljax.data.formats import DataFormat, register_format
from rljax.data.sources import PADDING_ROW, Row

LAYOUT = BatchLayout(buckets=(16, 32, 64, 128), pad_id=0, rows=2)


def test_registry_matches_the_config_formats():
    # DataConfig validates `format` against FORMATS at load time; both must name the same set.
    assert set(format_names()) == set(FORMATS)


def test_unknown_format_lists_the_registered_ones():
    message = r"unknown data format 'nope'; registered: preference, rl, sft$"
    with pytest.raises(ValueError, match=message):
        get_format("nope")


def test_duplicate_format_is_refused():
    sft = get_format("sft")
    with pytest.raises(ValueError, match="already registered"):
        register_format(DataFormat("sft", sft.transform, sft.collate, sft.length))


def test_only_sft_packs():
    assert {name for name in format_names() if get_format(name).packing} == {"sft"}


@pytest.mark.parametrize("name", format_names())
def test_synthetic_row_round_trips_transform_and_collate(name, char_tok):
    spec = get_format(name)
    config = DataConfig(format=name, max_length=LAYOUT.buckets[-1], max_prompt_length=64)
    transform = spec.transform(config, char_tok)
    data = synthetic.make_rows(name, 1, seed=0, task="string", min_len=3, max_len=6)[0]
    example = transform(Row(file="synthetic", row=0, line=1, data=data, index=0))
    assert 0 < spec.length(example) <= config.max_length

    batch = spec.collate([example, transform(PADDING_ROW)], LAYOUT)

    # Every field of the example comes back as row 0 of the batch: arrays right-padded to a
    # bucket length, other values as they are.
    shared = example.keys() & batch.keys()
    assert shared
    for key in shared:
        value, got = example[key], batch[key]
        if isinstance(value, np.ndarray):
            assert got.shape[0] == LAYOUT.rows and got.shape[1] in LAYOUT.buckets, key
            np.testing.assert_array_equal(got[0, : len(value)], value, err_msg=key)
            assert not got[0, len(value) :].any(), key
        else:
            assert len(got) <= LAYOUT.rows and got[0] == value, key
