"""`DataConfig`: the typed configuration of the data pipeline (the run config's `data`)."""

# No `from __future__ import annotations`: field types stay real types for config tools.
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from rljax.config import ConfigError
from rljax.data.truncation import TRUNCATION_POLICIES

DataFormat = Literal["sft", "preference", "rl"]
FORMATS: tuple[str, ...] = get_args(DataFormat)


@dataclass
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
    ``batch_size`` is the global number of rows per step; each process yields
    ``batch_size // process_count`` rows. ``val_batch_size`` defaults to ``batch_size``.

    ``chat_template_kwargs`` go to every ``apply_chat_template`` call (e.g.
    ``{"enable_thinking": False}``). ``num_threads`` > 0 tokenizes in grain reader threads
    ahead of the consumer (``prefetch_buffer_size`` rows ahead).
    """

    train_files: list[str] = field(default_factory=list)  # .jsonl / .json / .parquet paths or globs
    val_files: list[str] = field(default_factory=list)  # the same, for validation; empty: none
    format: DataFormat = "sft"  # the row layout (see above); set by the run kind (rm / dpo: preference)
    max_length: int = 512  # tokens of a whole row (prompt + response), the largest bucket (verl: sft max_length)
    max_prompt_length: int = 256  # tokens of the prompt (rl, preference)
    truncation: str = "error"  # an over-long row: error | left | right (TRUNCATION_POLICIES)
    bucket_size: int = 64  # padded lengths are its multiples; 0: every batch padded to max_length
    buckets: list[int] | None = None  # explicit padded lengths instead of bucket_size; null: bucket_size's
    packing: bool = False  # pack several sft rows into one (segment ids keep them apart)
    shuffle: bool = True  # shuffle the train split, a new permutation each epoch
    seed: int = 0  # seed of the shuffle, in [0, 2**32)
    batch_size: int = 8  # rows per step, global (RL: prompts, x rollout.n responses)
    train_batch_size: int | None = None  # verl's name for batch_size; when set, it wins
    val_batch_size: int | None = None  # rows per validation batch; null: batch_size
    num_epochs: int | None = None  # passes over the train split; null: forever
    messages_key: str = "messages"  # sft column: the chat messages
    prompt_key: str = "prompt"  # rl / preference column: the prompt
    chosen_key: str = "chosen"  # preference column: the preferred response
    rejected_key: str = "rejected"  # preference column: the other response
    tools_key: str = "tools"  # optional column: the tool schemas given to the chat template
    data_source_key: str = "data_source"  # rl column: picks the reward function (verl: reward_fn_key)
    reward_model_key: str = "reward_model"  # rl column: a mapping whose ground_truth is graded against
    extra_info_key: str = "extra_info"  # rl column: passed to the reward function as is
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # to every apply_chat_template call
    num_threads: int = 0  # grain reader threads tokenizing ahead; 0: in the consumer's thread
    prefetch_buffer_size: int = 16  # rows tokenized ahead (num_threads > 0)

    def __post_init__(self) -> None:
        if self.train_batch_size is not None:
            self.batch_size = self.train_batch_size

    def check(self) -> None:
        """`validate`, as the `ConfigError` that `rljax.config.check_config` expects (its
        messages already name the full key, `data.<field>`)."""
        try:
            self.validate()
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def validate(self) -> None:
        """Raise `ValueError` naming the first invalid field."""
        if self.format not in FORMATS:
            raise ValueError(f"data.format must be one of {FORMATS}, got {self.format!r}")
        if self.truncation not in TRUNCATION_POLICIES:
            raise ValueError(
                f"data.truncation must be one of {TRUNCATION_POLICIES}, got {self.truncation!r}"
            )
        if self.max_length <= 0:
            raise ValueError(f"data.max_length must be positive, got {self.max_length}")
        if self.max_prompt_length <= 0:
            raise ValueError(
                f"data.max_prompt_length must be positive, got {self.max_prompt_length}"
            )
        if self.format == "preference" and self.max_prompt_length >= self.max_length:
            raise ValueError(
                "data.max_prompt_length must be smaller than data.max_length for preference "
                f"data (got {self.max_prompt_length} >= {self.max_length})"
            )
        if self.bucket_size < 0:
            raise ValueError(f"data.bucket_size must be >= 0, got {self.bucket_size}")
        if self.buckets is not None:
            if not self.buckets or any(int(b) <= 0 or int(b) > self.max_length for b in self.buckets):
                raise ValueError(
                    f"data.buckets must be positive lengths <= max_length={self.max_length}, "
                    f"got {self.buckets}"
                )
        if self.packing and self.format != "sft":
            raise ValueError("data.packing is only supported for format 'sft'")
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"data.seed must be in [0, 2**32), got {self.seed}")
        if self.batch_size <= 0:
            raise ValueError(f"data.batch_size must be positive, got {self.batch_size}")
        if self.val_batch_size is not None and self.val_batch_size <= 0:
            raise ValueError(f"data.val_batch_size must be positive, got {self.val_batch_size}")
        if self.num_epochs is not None and self.num_epochs <= 0:
            raise ValueError(f"data.num_epochs must be positive or None, got {self.num_epochs}")
        if self.num_threads < 0 or self.prefetch_buffer_size < 0:
            raise ValueError("data.num_threads and data.prefetch_buffer_size must be >= 0")

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
