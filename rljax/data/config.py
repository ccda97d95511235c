"""`DataConfig`: the typed configuration of the data pipeline (the run config's `data`)."""

# No `from __future__ import annotations`: field types stay real types for config tools.
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from rljax.config import (
    FieldError,
    NonNegRows,
    NonNegThreads,
    NonNegTokens,
    Repeats,
    Rows,
    Seed,
    Tokens,
    alias,
    check_config,
)

DataFormat = Literal["sft", "preference", "rl"]
FORMATS: tuple[str, ...] = get_args(DataFormat)
Truncation = Literal["error", "left", "right"]  # rljax.data.truncation.TRUNCATION_POLICIES


@dataclass(frozen=True)
class DataConfig:
    """Where the data is, how it is tokenized, and how it is batched.

    Files: ``train_files`` / ``val_files`` are ``.jsonl``, ``.json`` or ``.parquet`` paths
    (glob patterns allowed; a single string is one path), concatenated in order.

    Formats (column names are configurable, verl style):

    * ``sft`` — ``messages`` (a list of chat messages; optional ``tools`` column). Loss on
      assistant tokens only.
    * ``preference`` — ``prompt`` (a string or messages), ``chosen`` / ``rejected`` (a
      string, an assistant message, or a list of messages). Loss on the response.
    * ``rl`` — ``prompt`` (messages), ``data_source``, ``reward_model.ground_truth``,
      optional ``extra_info`` and ``tools``. Prompts are not padded (the sampler packs them).

    Lengths: ``max_length`` bounds a whole row (prompt + response; the packed row length
    when ``packing``); ``max_prompt_length`` bounds the prompt (``rl`` and ``preference``).
    ``truncation``: ``error`` (a `DataError` naming file, row and lengths), ``left`` (keep
    the end) or ``right`` (keep the beginning); responses are always cut on the right.

    Shapes: a batch's T is the smallest bucket length >= its longest row. Buckets are
    ``buckets`` if given, else the multiples of ``bucket_size`` below ``max_length``;
    ``max_length`` is always the largest bucket. ``bucket_size=0`` pads every batch to
    ``max_length``.

    Order: ``shuffle`` with ``seed`` (a different permutation each epoch), ``num_epochs``
    passes (None = forever) for the train split; the val split is read once, in order.
    ``batch_size`` (alias ``train_batch_size``, verl's name) is the global number of rows
    per step; each process yields ``batch_size // process_count`` rows. ``val_batch_size``
    defaults to ``batch_size``.

    ``chat_template_kwargs`` go to every ``apply_chat_template`` call (e.g.
    ``{"enable_thinking": False}``). ``num_threads`` > 0 tokenizes in grain reader threads
    ahead of the consumer (``prefetch_buffer_size`` rows ahead).
    """

    train_files: list[str] = field(default_factory=list)  # .jsonl / .json / .parquet paths or globs
    val_files: list[str] = field(default_factory=list)  # the same, for validation; empty: none
    format: DataFormat = "sft"  # the row layout (see DataConfig); set by the run kind (rm / dpo: preference)
    max_length: Tokens = 512  # tokens of a whole row (prompt + response), the largest bucket (verl: sft max_length)
    max_prompt_length: Tokens = 256  # tokens of the prompt (rl, preference)
    truncation: Truncation = "error"  # an over-long row: error | left (keep the end) | right (keep the start)
    bucket_size: NonNegTokens = 64  # padded lengths are its multiples; 0: every batch padded to max_length
    buckets: list[int] | None = None  # explicit padded lengths instead of bucket_size; null: bucket_size's
    packing: bool = False  # pack several sft rows into one (segment ids keep them apart)
    shuffle: bool = True  # shuffle the train split, a new permutation each epoch
    seed: Seed = 0  # seed of the shuffle
    # rows per step, global (RL: prompts, x rollout.n responses)
    batch_size: Rows = field(default=8, metadata=alias("train_batch_size"))
    val_batch_size: Rows | None = None  # rows per validation batch; null: batch_size
    num_epochs: Repeats | None = None  # passes over the train split; null: forever
    messages_key: str = "messages"  # sft column: the chat messages
    prompt_key: str = "prompt"  # rl / preference column: the prompt
    chosen_key: str = "chosen"  # preference column: the preferred response
    rejected_key: str = "rejected"  # preference column: the other response
    tools_key: str = "tools"  # optional column: the tool schemas given to the chat template
    data_source_key: str = "data_source"  # rl column: picks the reward function (verl: reward_fn_key)
    reward_model_key: str = "reward_model"  # rl column: a mapping whose ground_truth is graded against
    extra_info_key: str = "extra_info"  # rl column: passed to the reward function as is
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # to every apply_chat_template call
    num_threads: NonNegThreads = 0  # grain reader threads tokenizing ahead; 0: in the consumer's thread
    prefetch_buffer_size: NonNegRows = 16  # rows tokenized ahead (num_threads > 0)

    def check(self) -> None:
        """What one field's type cannot say (run by `rljax.config.check_config`)."""
        if self.format == "preference" and self.max_prompt_length >= self.max_length:
            raise FieldError("max_prompt_length", f"must be smaller than data.max_length for preference data "
                                                  f"(got {self.max_prompt_length} >= {self.max_length})")
        if self.buckets is not None and (not self.buckets or any(b <= 0 or b > self.max_length for b in self.buckets)):
            raise FieldError("buckets", f"positive lengths <= max_length={self.max_length}, got {self.buckets}")
        if self.packing and self.format != "sft":
            raise FieldError("packing", f"only supported for format 'sft', got format {self.format!r}")

    def validate(self) -> None:
        """`rljax.config.check_config` of this section (keys named `data.<field>`), for a
        config built in code rather than loaded."""
        check_config(self, "data")

    def bucket_lengths(self) -> tuple[int, ...]:
        """The sorted padded lengths a batch may have (the last is `max_length`)."""
        if self.buckets is not None:
            lengths = {int(b) for b in self.buckets}
        elif self.bucket_size > 0:
            lengths = set(range(self.bucket_size, self.max_length, self.bucket_size))
        else:
            lengths = set()
        lengths.add(self.max_length)
        return tuple(sorted(lengths))
