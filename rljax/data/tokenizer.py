"""A tiny character-level tokenizer of our own, with a ChatML chat template.

`build_char_tokenizer()` returns a `transformers.PreTrainedTokenizerFast` built with the
`tokenizers` library, so tiny configs, the quickstart and the tests need no download.

Vocabulary (fixed, identical on every call and every machine):

* ids 0..4 are special tokens: `<|pad|>` (0), `<|endoftext|>` (1), `<|im_start|>` (2),
  `<|im_end|>` (3), `<|unk|>` (4);
* ids 5.. are single characters: tab, newline, space, the ASCII digits, letters and
  punctuation (`CHAR_ALPHABET`), in that order. Any other character is one `<|unk|>` per
  byte of its UTF-8 encoding.

The vocabulary is stored as a byte-level BPE without merges (GPT-2's byte-to-character
table names each token: space is `Ġ`, newline `Ċ`, tab `ĉ`), so a transformers class that
rebuilds a byte-level pipeline from the file (`Qwen2Tokenizer`, which `AutoTokenizer`
picks beside a qwen2 `config.json`) encodes and decodes every text exactly as rljax does.

`eos_token` is `<|im_end|>` (the end-of-turn token: a sampler stops on it), `pad_token`
is `<|pad|>`, `bos_token` is None (nothing is prepended when encoding).

The chat template is ChatML, like Qwen's: every message is
`<|im_start|>{role}\\n{content}<|im_end|>\\n`; roles are system, user, assistant and tool
(anything else raises); a system message may only come first; `tools` (OpenAI function
schemas) are listed as JSON in a leading system turn; an assistant's `tool_calls` are
rendered as `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>` lines;
`add_generation_prompt=True` appends `<|im_start|>assistant\\n`. Each message renders
independently of the ones after it, so the template is prefix-stable (see `chat.py`).

`load_tokenizer(section)` is the tokenizer a run's `model:` section names (this one, or a
saved folder through `load_hf_tokenizer`).
"""

from __future__ import annotations

import json
import os
import re
import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|pad|>"
EOS_TEXT_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
UNK_TOKEN = "<|unk|>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, EOS_TEXT_TOKEN, IM_START, IM_END, UNK_TOKEN)

CHAR_ALPHABET: str = "\t\n " + string.digits + string.ascii_letters + string.punctuation

CHATML_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{- raise_exception('unknown role ' + message['role'] + ' (expected system, user, assistant or tool)') }}"
    "{%- endif %}"
    "{%- if message['role'] == 'system' and not loop.first %}"
    "{{- raise_exception('a system message may only be the first message') }}"
    "{%- endif %}"
    "{%- if not (message['role'] == 'system' and tools) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}{%- endif %}"
    "{%- if message['role'] == 'assistant' and message['tool_calls'] %}"
    "{%- for tool_call in message['tool_calls'] %}"
    "{%- if tool_call['function'] is defined %}{%- set tool_call = tool_call['function'] %}{%- endif %}"
    "{%- if not loop.first or message['content'] %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + tool_call['name'] + '\", \"arguments\": ' }}"
    "{%- if tool_call['arguments'] is string %}{{- tool_call['arguments'] }}"
    "{%- else %}{{- tool_call['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def char_vocab() -> dict[str, int]:
    """The fixed character -> id table: special tokens first, then `CHAR_ALPHABET`."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in CHAR_ALPHABET:
        vocab[ch] = len(vocab)
    return vocab


def byte_level_name(ch: str) -> str:
    """The token string of ASCII character `ch` in a byte-level vocabulary (GPT-2's table:
    printable characters are themselves, the others shifted past 255: " " -> "Ġ")."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return bytes_to_unicode()[ord(ch)]


GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")

# Files a tokenizer is built from (one of them must be in the folder): the `tokenizers`
# serialization, a BPE vocabulary (+ merges.txt), a sentencepiece model, a WordPiece
# vocabulary, mistral's tekken.json; `*.tiktoken` files count too.
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model", "tekken.json")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def _missing_files_error(path: str, files: list[str]) -> FileNotFoundError:
    held = ", ".join(sorted(files)[:12]) + (" ..." if len(files) > 12 else "") if files else "nothing"
    return FileNotFoundError(
        f"{path}: no tokenizer files (tokenizer.json, or vocab.json + merges.txt, or tokenizer.model); "
        f"the folder holds {held}"
    )


def load_tokenizer(section):
    """The tokenizer a `model:` section names: `section.tokenizer`, else `section.path`;
    "char" is `build_char_tokenizer()`, anything else a folder (`load_hf_tokenizer`)."""
    source = section.tokenizer or section.path
    if source == "char":
        return build_char_tokenizer()
    if not source:
        raise ValueError("model.path is empty and so is model.tokenizer: set model.path (an HF folder or a "
                         ".gguf file), or model.tokenizer (a folder or 'char') for a model built from hf_config")
    return load_hf_tokenizer(source)


def load_hf_tokenizer(path: str):
    """The tokenizer saved in a folder, as it was saved.

    `transformers.AutoTokenizer.from_pretrained(path)`, except for a folder whose
    tokenizer_config.json names the generic backend (`TokenizersBackend`, e.g. rljax's
    character tokenizer exported beside a qwen2-shaped model): transformers 5 then builds
    the class registered for config.json's model type instead (Qwen2Tokenizer for qwen2),
    whose own pre-tokenizer silently changes the ids (the char tokenizer's newline is
    dropped). Such a folder is loaded with `PreTrainedTokenizerFast`, from its
    tokenizer.json as is.

    A missing folder, a folder without tokenizer files (transformers would build a
    tokenizer of one or two special tokens that encodes every text as nothing), a broken
    tokenizer_config.json or a tokenizer with no vocabulary raise an error naming the
    folder or file. A name of the form `org/name` that is no folder is passed on to
    transformers (a hub id in the local cache).
    """
    from transformers import AutoTokenizer

    from rljax.models.gguf import is_gguf, load_gguf_tokenizer

    if is_gguf(path):
        return load_gguf_tokenizer(path)
    if not os.path.isdir(path):
        if os.path.exists(path) or not _HUB_ID.fullmatch(path):
            raise FileNotFoundError(f"{path}: no such tokenizer folder")
        try:
            return AutoTokenizer.from_pretrained(path)
        except OSError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise FileNotFoundError(f"{path}: not a folder, and no hub tokenizer of that name ({first})") from None
    files = os.listdir(path)
    if not any(f in files for f in TOKENIZER_FILES) and not any(f.endswith(".tiktoken") for f in files):
        raise _missing_files_error(path, files)
    config_path = os.path.join(path, "tokenizer_config.json")
    declared = None
    if os.path.isfile(config_path):
        try:
            with open(config_path) as fh:
                declared = json.load(fh).get("tokenizer_class")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
            raise ValueError(f"{config_path}: not a valid tokenizer config ({e})") from None
    if declared in GENERIC_TOKENIZER_CLASSES and "tokenizer.json" not in files:
        raise FileNotFoundError(f"{os.path.join(path, 'tokenizer.json')}: missing ({config_path} names "
                                f"{declared}, which is built from it)")
    if declared in GENERIC_TOKENIZER_CLASSES:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
    else:
        tokenizer = AutoTokenizer.from_pretrained(path)
    if len(tokenizer) <= max(len(set(tokenizer.all_special_ids)), 1):
        raise _missing_files_error(path, files) if "tokenizer.json" not in files else ValueError(
            f"{os.path.join(path, 'tokenizer.json')}: the tokenizer has {len(tokenizer)} tokens, all special: "
            "no vocabulary (a broken or truncated file?)")
    return tokenizer


def build_char_tokenizer(model_max_length: int = 1 << 20) -> PreTrainedTokenizerFast:
    """Build the character-level tokenizer (102 ids) with its ChatML chat template.

    Deterministic: every call returns the same vocabulary and template. Works offline, and
    `save_pretrained(path)` / `load_hf_tokenizer(path)` round-trip (also beside a model's
    config.json, where `transformers.AutoTokenizer` would substitute the model type's class).
    """
    vocab = {byte_level_name(tok) if tok in CHAR_ALPHABET else tok: i for tok, i in char_vocab().items()}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK_TOKEN))
    # Every character is its own pre-token, named byte by byte; with no merges each byte
    # is a token (or unk).
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=IM_END,
        unk_token=UNK_TOKEN,
        additional_special_tokens=[EOS_TEXT_TOKEN, IM_START],
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
    )
    tok.chat_template = CHATML_TEMPLATE
    return tok
