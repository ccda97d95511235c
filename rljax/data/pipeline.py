"""`make_dataset`: files -> grain pipeline -> a resumable iterator of batches.

Order of operations (train split)::

    RecordSource (all files, N rows)
      .shuffle(seed)          grain index shuffle; epoch e uses seed + e, so every epoch
                              has its own permutation
      .repeat(num_epochs)     None = forever
      [: L - L % P]           finite runs: every process gets the same number of rows
      [p::P]                  process p takes every P-th row of the global order, so the
                              P per-process batches of one step together are rows
                              [k*B, (k+1)*B) of the global order (disjoint, covering)
      .map(transform)         tokenize (the format's transform, see formats.py)
      .to_iter_dataset()      optional reader threads
      [first-fit packing]     packing=True (formats with a `Packing`: sft): rows of
                              max_length, b bins
      .batch(b, drop_remainder=True, batch_fn=collate)   b = batch_size // P; the
                              format's collate (its packed collate when packing)

The val split is read once, in file order, without shuffle or packing; it is padded with
empty rows up to a multiple of ``b * P`` so every process yields the same number of full
batches (padding rows are all-zero masks in sft/preference batches and are dropped from
rl batches, so the last rl batches may be shorter, even empty).

The iterator state is a small JSON-serialisable dict; restoring it into a fresh
`make_dataset(...)` iterator (same config, files and process layout) continues with
exactly the batches that would have come next, across epoch boundaries and with packing.
"""

from __future__ import annotations

import functools
from typing import Any

import grain

from rljax.data.batching import BatchLayout
from rljax.data.config import DataConfig
from rljax.data.errors import DataError
from rljax.data.formats import get_format
from rljax.data.sources import PaddedSource, RecordSource, open_source

STATE_VERSION = 1


def pad_token_id(tokenizer: Any) -> int:
    """The id used for padding: pad token, else eos token, else 0."""
    for tid in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if tid is not None:
            return int(tid)
    return 0


def _process_layout(process_index: int | None, process_count: int | None) -> tuple[int, int]:
    if process_index is None or process_count is None:
        import jax

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    if process_count <= 0 or not 0 <= process_index < process_count:
        raise ValueError(f"bad process layout: index {process_index} of {process_count}")
    return int(process_index), int(process_count)


class BatchIterator:
    """Python iterator of batches with an exact-resume state.

    Attributes: `config`, `split`, `num_rows` (rows in the files), `batch_rows` (rows per
    batch on this process), `process_index`, `process_count`, `steps_per_epoch` (global
    batches per pass over the data, ``num_rows // batch_size``; None when packing, where it
    depends on lengths) and `num_batches` (batches this iterator will yield in total, None
    when infinite or packed), `dataset` (the grain `IterDataset`).
    """

    def __init__(
        self,
        dataset: grain.IterDataset,
        fingerprint: dict[str, Any],
        *,
        config: DataConfig,
        split: str,
        num_rows: int,
        batch_rows: int,
        process_index: int,
        process_count: int,
        steps_per_epoch: int | None,
        num_batches: int | None,
    ):
        self.dataset = dataset
        self.fingerprint = fingerprint
        self.config = config
        self.split = split
        self.num_rows = num_rows
        self.batch_rows = batch_rows
        self.process_index = process_index
        self.process_count = process_count
        self.steps_per_epoch = steps_per_epoch
        self.num_batches = num_batches
        self._it = iter(dataset)

    def __iter__(self) -> "BatchIterator":
        return self

    def __next__(self) -> dict[str, Any]:
        return next(self._it)

    @property
    def epoch(self) -> int:
        """Completed passes over the data by the rows this process has consumed so far.

        Exact without packing; with packing the packer's buffered rows count as consumed.
        """
        if self.split != "train":
            return 0
        state = self._it.get_state()
        while "next_index" not in state and isinstance(state.get("parent"), dict):
            state = state["parent"]
        consumed = int(state.get("next_index", 0)) * self.process_count + self.process_index
        return consumed // self.num_rows

    def get_state(self) -> dict[str, Any]:
        """A JSON-serialisable dict: where the iterator is (for the checkpoint)."""
        return {
            "version": STATE_VERSION,
            "fingerprint": dict(self.fingerprint),
            "grain": self._it.get_state(),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from `state` (from `get_state` of an identically configured iterator).

        Raises `ValueError` if the state comes from a different dataset, config or process
        layout (the resumed order would silently differ).
        """
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"not a data iterator state of version {STATE_VERSION}: {state!r}")
        saved = state.get("fingerprint", {})
        diff = {
            k: (saved.get(k), v) for k, v in self.fingerprint.items() if saved.get(k) != v
        }
        if diff:
            detail = ", ".join(f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in diff.items())
            raise ValueError(f"data iterator state does not match this dataset ({detail})")
        self._it.set_state(state["grain"])


def make_dataset(
    config: DataConfig,
    tokenizer: Any,
    split: str = "train",
    process_index: int | None = None,
    process_count: int | None = None,
) -> BatchIterator:
    """Build the batch iterator of `split` ("train" or "val") for this process.

    `process_index` / `process_count` default to `jax.process_index()` /
    `jax.process_count()`. The global batch (`config.batch_size`, or `val_batch_size` for
    val) must be divisible by `process_count`. Batch formats: see `rljax.data.batching`.
    """
    config.validate()
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    files = config.train_files if split == "train" else config.val_files
    if not files:
        raise ValueError(f"data.{split}_files is empty")
    p, P = _process_layout(process_index, process_count)
    global_batch = config.batch_size
    if split == "val" and config.val_batch_size is not None:
        global_batch = config.val_batch_size
    if global_batch % P:
        raise ValueError(
            f"batch size {global_batch} is not divisible by the process count {P}"
        )
    b = global_batch // P
    fmt = get_format(config.format)
    source: RecordSource = open_source(files)
    n = len(source)
    transform = fmt.transform(config, tokenizer)
    layout = BatchLayout(config.bucket_lengths(), pad_token_id(tokenizer), rows=b)
    read_options = grain.ReadOptions(
        num_threads=config.num_threads, prefetch_buffer_size=config.prefetch_buffer_size
    )

    if split == "train":
        ds = grain.MapDataset.source(source)
        if config.shuffle:
            ds = ds.shuffle(seed=config.seed)
        ds = ds.repeat(config.num_epochs)
        if config.num_epochs is not None:
            total = len(ds)
            ds = ds[: total - total % P]
        ds = ds[p::P]
        packing = config.packing
        if packing and fmt.packing is None:
            raise ValueError(f"data.packing is not supported for format {fmt.name!r}")
        drop_remainder = True
    else:
        chunk = b * P
        ds = grain.MapDataset.source(PaddedSource(source, -(-n // chunk) * chunk))[p::P]
        packing = False
        drop_remainder = False

    it_ds = ds.map(transform).to_iter_dataset(read_options)

    collate = fmt.collate
    if packing:
        it_ds = grain.experimental.FirstFitPackIterDataset(
            it_ds,
            length_struct={field: config.max_length for field in fmt.packing.fields},
            num_packing_bins=b,
            shuffle_bins=False,
        )
        collate = fmt.packing.collate
    it_ds = it_ds.batch(
        b, drop_remainder=drop_remainder, batch_fn=functools.partial(collate, layout=layout)
    )

    if split == "train":
        steps_per_epoch = None if packing else n // global_batch
        num_batches = None
        if config.num_epochs is not None and not packing:
            num_batches = (n * config.num_epochs) // P // b
    else:
        steps_per_epoch = num_batches = -(-n // (b * P))

    fingerprint = {
        "split": split,
        "format": config.format,
        "num_rows": n,
        "shuffle": bool(config.shuffle) if split == "train" else False,
        "seed": int(config.seed),
        "num_epochs": config.num_epochs if split == "train" else 1,
        "batch_rows": b,
        "process_index": p,
        "process_count": P,
        "packing": bool(packing),
        "packed_length": config.max_length if packing else None,
    }
    return BatchIterator(
        it_ds,
        fingerprint,
        config=config,
        split=split,
        num_rows=n,
        batch_rows=b,
        process_index=p,
        process_count=P,
        steps_per_epoch=steps_per_epoch,
        num_batches=num_batches,
    )


def check_dataset(
    config: DataConfig, tokenizer: Any, split: str = "train", max_errors: int = 20
) -> dict[str, Any]:
    """Run every row of `split` through the tokenizing transform once, in file order.

    Returns ``{"rows", "errors" (list of `DataError` messages, at most `max_errors`),
    "max_tokens", "mean_tokens"}`` (token counts after truncation, by the format's
    `length`: for preference the longer side, for rl the prompt). Use it to find every bad
    row before a long run.
    """
    config.validate()
    fmt = get_format(config.format)
    files = config.train_files if split == "train" else config.val_files
    source = open_source(files)
    transform = fmt.transform(config, tokenizer)
    errors: list[str] = []
    lengths: list[int] = []
    for i in range(len(source)):
        try:
            ex = transform(source[i])
        except DataError as e:
            errors.append(str(e))
            if len(errors) >= max_errors:
                break
            continue
        lengths.append(fmt.length(ex))
    return {
        "rows": len(source),
        "errors": errors,
        "max_tokens": max(lengths, default=0),
        "mean_tokens": sum(lengths) / len(lengths) if lengths else 0.0,
    }
