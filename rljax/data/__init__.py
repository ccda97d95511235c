"""Data: grain pipelines over JSONL/Parquet, chat templates, synthetic tasks.

Entry points::

    from rljax.data import DataConfig, make_dataset
    it = make_dataset(DataConfig(train_files=["train.parquet"], format="sft"), tokenizer)
    batch = next(it)            # dict of numpy arrays, shapes [B, T] with T a bucket length
    state = it.get_state()      # JSON-serialisable; goes into the checkpoint
    it.set_state(state)         # continue with exactly the batches that would come next

Modules: `sources` (files -> rows), `chat` (messages -> tokens + assistant mask,
token-in-token-out), `sft` / `preference` / `rl` (row -> example), `truncation`,
`batching` (examples -> bucketed batches), `formats` (the registry of formats: transform,
collate, length, packing per ``data.format``), `pipeline` (grain wiring, state),
`tokenizer` (our char tokenizer), `synthetic` (arithmetic / string tasks), `errors`.
Batch keys and dtypes are documented in `rljax.data.batching`.
"""

from rljax.data.batching import RL_KEYS, pick_bucket
from rljax.data.chat import ChatRenderer, RenderedConversation, normalize_messages, normalize_tools
from rljax.data.config import FORMATS, DataConfig
from rljax.data.errors import DataError, FormatError
from rljax.data.formats import DataFormat, format_names, get_format
from rljax.data.pipeline import BatchIterator, check_dataset, make_dataset, pad_token_id
from rljax.data.sources import RecordSource, Row, open_source
from rljax.data.tokenizer import build_char_tokenizer

__all__ = [
    "BatchIterator",
    "ChatRenderer",
    "DataConfig",
    "DataError",
    "DataFormat",
    "FORMATS",
    "FormatError",
    "RL_KEYS",
    "RecordSource",
    "RenderedConversation",
    "Row",
    "build_char_tokenizer",
    "check_dataset",
    "format_names",
    "get_format",
    "make_dataset",
    "normalize_messages",
    "normalize_tools",
    "open_source",
    "pad_token_id",
    "pick_bucket",
]
