"""make_dataset: bucketing, packing, shuffling, sharding, epochs, exact resume, val split."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import numpy as np
import pytest

from rljax.data import DataConfig, check_dataset, make_dataset
from rljax.data import synthetic

from .helpers import sft_row, write_jsonl


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("pipeline")
    out = {}
    for fmt in ("sft", "rl"):
        rows = synthetic.make_rows(fmt, 23, seed=3, task="string", min_len=1, max_len=30)
        out[fmt] = synthetic.write_rows(rows, str(d / f"{fmt}.jsonl"))
        out[fmt + "_pq"] = synthetic.write_rows(rows, str(d / f"{fmt}.parquet"))
        out[fmt + "_24"] = synthetic.write_rows(rows + rows[:1], str(d / f"{fmt}24.jsonl"))
    return out


def make(path, tok, fmt="sft", p=0, P=1, split="train", **kw):
    cfg = dict(max_length=96, max_prompt_length=80, bucket_size=16, batch_size=4, format=fmt)
    cfg.update(kw)
    key = "train_files" if split == "train" else "val_files"
    cfg[key] = [path]
    return make_dataset(DataConfig(**cfg), tok, split=split, process_index=p, process_count=P)


def take(it, n):
    return list(itertools.islice(it, n))


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            if isinstance(x[k], np.ndarray):
                np.testing.assert_array_equal(x[k], y[k], err_msg=k)
            else:
                assert x[k] == y[k], k


def indices(batches):
    return [i for b in batches for i in b["index"]]


# ---- bucketing --------------------------------------------------------------------------


def test_bucket_shapes(files, char_tok):
    seen = set()
    for b in take(make(files["sft"], char_tok, batch_size=2), 40):
        T = b["input_ids"].shape[1]
        assert all(v.shape == (2, T) for v in b.values())
        longest = int(b["attention_mask"].sum(1).max())
        assert T == min(t for t in (16, 32, 48, 64, 80, 96) if t >= longest)
        seen.add(T)
    assert len(seen) >= 2 and seen <= {16, 32, 48, 64, 80, 96}
    shapes = {b["input_ids"].shape[1] for b in take(make(files["sft"], char_tok, buckets=[40, 60]), 20)}
    assert shapes <= {40, 60, 96}
    shapes = {b["input_ids"].shape[1] for b in take(make(files["sft"], char_tok, bucket_size=0), 10)}
    assert shapes == {96}
    assert DataConfig(max_length=100, bucket_size=32).bucket_lengths() == (32, 64, 96, 100)


# ---- packing ----------------------------------------------------------------------------


def segments(batch):
    """[(ids, loss_mask)] of every packed segment, checking the row invariants."""
    out = []
    for r in range(batch["input_ids"].shape[0]):
        seg, pos = batch["segment_ids"][r], batch["positions"][r]
        np.testing.assert_array_equal(batch["attention_mask"][r], (seg > 0).astype(np.int32))
        k = int(seg.max())
        assert sorted(set(seg.tolist()) - {0}) == list(range(1, k + 1))
        n = int((seg > 0).sum())
        assert (seg[:n] > 0).all() and (seg[n:] == 0).all()  # segments first, padding last
        for s in range(1, k + 1):
            where = np.flatnonzero(seg == s)
            assert (np.diff(where) == 1).all()
            np.testing.assert_array_equal(pos[where], np.arange(len(where)))
            assert batch["loss_mask"][r, where[0]] == 0
            out.append((tuple(batch["input_ids"][r, where]), tuple(batch["loss_mask"][r, where])))
    return out


def test_packing_segments_equal_unpacked_examples(files, char_tok):
    unpacked = take(make(files["sft"], char_tok, batch_size=1, num_epochs=1, shuffle=False), 100)
    assert len(unpacked) == 23
    examples = []
    for b in unpacked:
        n = int(b["attention_mask"][0].sum())
        examples.append((tuple(b["input_ids"][0, :n]), tuple(b["loss_mask"][0, :n])))
    packed = take(make(files["sft"], char_tok, batch_size=1, num_epochs=1, shuffle=False,
                       packing=True, max_length=128, bucket_size=32), 100)
    segs = [s for b in packed for s in segments(b)]
    assert Counter(segs) == Counter(examples)
    assert len(packed) < len(unpacked)  # several examples share a row
    assert any(b["segment_ids"].max() >= 3 for b in packed)
    for b in packed:
        T = b["input_ids"].shape[1]
        assert T in (32, 64, 96, 128)
        assert T == min(t for t in (32, 64, 96, 128) if t >= b["attention_mask"].sum(1).max())


def test_packing_batches(files, char_tok):
    batches = take(make(files["sft"], char_tok, batch_size=4, packing=True, max_length=128), 6)
    for b in batches:
        assert b["input_ids"].shape[0] == 4
        assert b["loss_mask"].dtype == np.float32 and b["segment_ids"].dtype == np.int32
        segments(b)


# ---- shuffling and epochs ---------------------------------------------------------------


def test_shuffle_is_seeded_and_differs_per_epoch(files, char_tok):
    run = lambda **kw: indices(take(make(files["rl_24"], char_tok, "rl", **kw), 12))  # noqa: E731
    a, b, c = run(seed=1), run(seed=1), run(seed=2)
    assert a == b
    assert a != c
    for order in (a, c):
        e0, e1 = order[:24], order[24:]
        assert sorted(e0) == sorted(e1) == list(range(24))  # each epoch a permutation
        assert e0 != e1  # with its own shuffle
        assert e0 != list(range(24))
    assert run(shuffle=False) == list(range(24)) * 2


def test_finite_epochs(files, char_tok):
    it = make(files["rl"], char_tok, "rl", num_epochs=2)
    batches = list(it)
    assert len(batches) == it.num_batches == 46 // 4
    assert max(Counter(indices(batches)).values()) <= 2
    assert it.steps_per_epoch == 23 // 4
    assert it.epoch == 2


def test_epoch_counter(files, char_tok):
    it = make(files["rl_24"], char_tok, "rl")
    epochs = []
    for _ in range(13):
        epochs.append(it.epoch)
        next(it)
    assert epochs == [0] * 6 + [1] * 6 + [2]


# ---- process sharding -------------------------------------------------------------------


@pytest.mark.parametrize("num_epochs", [None, 1])
def test_process_sharding_partitions(files, char_tok, num_epochs):
    P, B = 3, 6
    n = 4 if num_epochs is None else 100
    single = take(make(files["rl"], char_tok, "rl", batch_size=B, num_epochs=num_epochs), n)
    shards = [take(make(files["rl"], char_tok, "rl", p=p, P=P, batch_size=B, num_epochs=num_epochs), n)
              for p in range(P)]
    steps = min(len(s) for s in shards)
    if num_epochs is not None:
        assert {len(s) for s in shards} == {23 // P // (B // P)}  # same count everywhere
    for k in range(steps):
        parts = [shards[p][k]["index"] for p in range(P)]
        assert all(len(x) == B // P for x in parts)
        flat = [i for x in parts for i in x]
        assert len(set(flat)) == len(flat)  # disjoint
        assert sorted(flat) == sorted(single[k]["index"])  # together: the global batch
    if num_epochs is None:  # the first 4 global batches cover 24 draws of 23 rows
        seen = [i for s in shards for b in s for i in b["index"]]
        assert set(seen) == set(range(23))


def test_batch_size_must_divide(files, char_tok):
    with pytest.raises(ValueError, match="not divisible by the process count 3"):
        make(files["rl"], char_tok, "rl", p=0, P=3, batch_size=4)


# ---- exact resume ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "fmt, kw",
    [
        ("sft", {}),
        ("sft", {"packing": True, "max_length": 128}),
        ("rl", {}),
        ("sft", {"num_threads": 2, "prefetch_buffer_size": 4}),
        ("sft", {"num_epochs": 2}),
    ],
    ids=["sft", "packed", "rl", "threads", "finite"],
)
def test_state_restore_continues_identically(files, char_tok, fmt, kw):
    # 23 rows, 4 per batch: batch 5 straddles the first epoch boundary.
    ref = make(files[fmt], char_tok, fmt, p=1, P=2, **kw)
    expected = take(ref, 11)
    for k in (0, 3, 5, 6):
        it = make(files[fmt], char_tok, fmt, p=1, P=2, **kw)
        take(it, k)
        state = json.loads(json.dumps(it.get_state()))
        take(it, 2)  # moving on must not affect the saved state
        resumed = make(files[fmt], char_tok, fmt, p=1, P=2, **kw)
        resumed.set_state(state)
        assert_same(take(resumed, 5), expected[k : k + 5])


def test_state_restore_rejects_other_dataset(files, char_tok):
    state = make(files["rl"], char_tok, "rl", seed=0).get_state()
    with pytest.raises(ValueError, match="seed: saved 0, now 1"):
        make(files["rl"], char_tok, "rl", seed=1).set_state(state)
    with pytest.raises(ValueError, match="num_rows: saved 23, now 24"):
        make(files["rl_24"], char_tok, "rl").set_state(state)
    with pytest.raises(ValueError, match="not a data iterator state"):
        make(files["rl"], char_tok, "rl").set_state({"next_index": 3})


# ---- file formats ------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["sft", "rl"])
def test_parquet_and_jsonl_give_the_same_batches(files, char_tok, fmt):
    a = take(make(files[fmt], char_tok, fmt, seed=7), 8)
    b = take(make(files[fmt + "_pq"], char_tok, fmt, seed=7), 8)
    assert_same(a, b)


def test_preference_pipeline(tmp_path, char_tok):
    path = synthetic.write_preference_parquet(str(tmp_path / "p.parquet"), 10, seed=1)
    for b in take(make(path, char_tok, "preference", batch_size=2, max_length=48, max_prompt_length=32), 6):
        T = b["chosen_input_ids"].shape[1]
        assert T in (16, 32, 48)
        assert all(v.shape == (2, T) for v in b.values())
        assert (b["chosen_loss_mask"].sum(1) > 0).all() and (b["rejected_loss_mask"].sum(1) > 0).all()


# ---- validation split --------------------------------------------------------------------


def test_val_split_pads_and_covers(files, char_tok):
    P = 2
    shards = [list(make(files["sft"], char_tok, p=p, P=P, split="val", batch_size=4, shuffle=True))
              for p in range(P)]
    assert [len(s) for s in shards] == [6, 6]  # ceil(23 / 4) full batches on every process
    rows = []
    for s in shards:
        for b in s:
            assert b["input_ids"].shape[0] == 2
            for r in range(2):
                n = int(b["attention_mask"][r].sum())
                if n:
                    rows.append(tuple(b["input_ids"][r, :n]))
                else:
                    assert b["loss_mask"][r].sum() == 0
    assert len(rows) == 23
    in_order = [tuple(b["input_ids"][0, : int(b["attention_mask"][0].sum())])
                for b in make(files["sft"], char_tok, split="val", batch_size=1)]
    assert Counter(rows) == Counter(in_order)
    rl = [list(make(files["rl"], char_tok, "rl", p=p, P=P, split="val", batch_size=4)) for p in range(P)]
    assert [len(s) for s in rl] == [6, 6]
    assert sorted(i for s in rl for b in s for i in b["index"]) == list(range(23))


def test_config_validation(files, char_tok):
    with pytest.raises(ValueError, match=r"^data\.packing: only supported for format 'sft'"):
        make(files["rl"], char_tok, "rl", packing=True)
    with pytest.raises(ValueError, match=r"^data\.truncation: expected one of"):
        make(files["sft"], char_tok, truncation="middle")
    with pytest.raises(ValueError, match=r"^data\.format: expected one of"):
        make(files["sft"], char_tok, "dpo")
    with pytest.raises(ValueError, match="val_files is empty"):
        make_dataset(DataConfig(train_files=[files["sft"]]), char_tok, split="val",
                     process_index=0, process_count=1)


def test_truncation_words_are_the_policies():
    """`data.truncation`'s Literal lists exactly the policies `rljax.data.truncation` applies."""
    from typing import get_args

    from rljax.data.config import Truncation
    from rljax.data.truncation import TRUNCATION_POLICIES

    assert get_args(Truncation) == TRUNCATION_POLICIES


def test_default_process_layout_is_jax(files, char_tok):
    it = make_dataset(DataConfig(train_files=files["sft"], batch_size=2), char_tok)  # a str is one path
    assert (it.process_index, it.process_count, it.batch_rows) == (0, 1, 2)


def test_check_dataset_collects_errors(tmp_path, char_tok):
    path = write_jsonl(tmp_path / "d.jsonl", [sft_row("a", "b"), {"messages": []}, sft_row("c", "d")],
                       raw_lines={3: "oops"})
    report = check_dataset(DataConfig(train_files=[path]), char_tok)
    assert report["rows"] == 4
    assert len(report["errors"]) == 2
    assert "row 1 (line 2), key 'messages': empty list" in report["errors"][0]
    assert "row 3 (line 4): not valid JSON" in report["errors"][1]
    assert report["max_tokens"] > 0
