"""GGUF files (llama.cpp's single-file format) in: weights, config, tokenizer.

`model.path` (and every loader taking a checkpoint path: `load_hf`, `load_hf_sharded`,
`read_config`, `load_hf_tokenizer`) accepts a `.gguf` file of the Llama architecture.
The file holds the config as metadata (`llama.*` keys), the tokenizer (`tokenizer.ggml.*`,
with its chat template) and the tensors, quantized or not.

Reading uses the `gguf` package (`pip install 'rljax[gguf]'`), the reference reader
maintained in the llama.cpp repository next to the converters that write these files;
its `gguf.quants.dequantize` turns every block format (Q4_0, Q4_1, Q8_0, K-quants, ...)
into float32, which `rljax.models.hf` then casts to the run's parameter dtype. The
quantization is not kept: the loaded model is a plain float model (fp32 or bf16) whose
weights are the dequantized values, as transformers' own GGUF loader produces them.

`GGUFTensors` presents the file with the Hugging Face tensor names and layouts, so the
loading code of `rljax.models.hf` (its checks, its one-tensor-at-a-time fill, its
sharded reads) runs unchanged. Two layout facts of llama.cpp's Llama converter:

- a tensor of HF shape `[out, in]` is stored with dimensions listed `(in, out)` (GGML
  lists the fastest-varying first); read as numpy it is `[out, in]` again, row-major,
  quantized along `in` in blocks, so whole rows dequantize independently;
- the query and key projections have the rows of each head permuted: llama.cpp rotates
  adjacent pairs (dimensions 2j, 2j+1) where HF's Llama rotates halves (j, j + d/2), so
  the converter moves HF row `s * d/2 + j` of a head to row `2j + s` (s in {0, 1}).
  `unpermute_rows` undoes it.

The tokenizer comes from `transformers.AutoTokenizer.from_pretrained(folder,
gguf_file=name)` (transformers builds it, chat template included, from the metadata;
offline). A GGUF-loaded rljax model exports with `save_hf` as a plain safetensors folder
that `transformers.AutoModelForCausalLM.from_pretrained` loads.
"""

from __future__ import annotations

import collections
import os

import numpy as np

from rljax.models.config import ModelConfig, UnsupportedModelError

SUFFIX = ".gguf"

# GGUF tensor name -> HF tensor name ("{i}" is the layer index), Llama architecture.
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
ARCHITECTURES = ("llama",)


def is_gguf(path) -> bool:
    """Whether `path` names a GGUF file (by its suffix; the file need not exist)."""
    return isinstance(path, (str, os.PathLike)) and os.fspath(path).lower().endswith(SUFFIX)


_OPEN: dict = {}  # the last file opened: (path, size, mtime) -> its reader


def _reader(path: str):
    """The `gguf.GGUFReader` of `path` (memory-mapped: tensors are read when sliced).
    The last one opened is kept: parsing the metadata (a tokenizer's ~100k strings) takes
    seconds, and a load reads the config, the tensors and the tokenizer in turn."""
    try:
        import gguf
    except ImportError:
        raise ImportError(f"{path}: reading a .gguf file needs the gguf package: pip install 'rljax[gguf]'") from None
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such GGUF file")
    stat = os.stat(path)
    key = (os.path.abspath(path), stat.st_size, stat.st_mtime_ns)
    if key not in _OPEN:
        try:
            reader = gguf.GGUFReader(path)
        except Exception as e:  # the reader's errors do not name the file
            detail = " ".join(str(e).split()) or type(e).__name__
            raise ValueError(f"{path}: not a readable GGUF file ({detail})") from None
        _OPEN.clear()
        _OPEN[key] = reader
    return _OPEN[key]


def _metadata(reader) -> dict:
    """The metadata fields' values (strings, numbers), but the tokenizer's vocabulary
    and merges (long lists the config does not need): their lengths under `.length`."""
    out = {}
    for name, field in reader.fields.items():
        if name in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                    "tokenizer.ggml.scores"):
            out[f"{name}.length"] = len(field.data)
        else:
            out[name] = field.contents()
    return out


def hf_config_dict(path: str, reader=None) -> dict:
    """The Hugging Face config.json equivalent of a GGUF file's metadata (Llama).

    Keys (llama.cpp's names, `{a}` the architecture): `{a}.block_count`,
    `{a}.embedding_length`, `{a}.feed_forward_length`, `{a}.attention.head_count(_kv)`,
    `{a}.attention.layer_norm_rms_epsilon`, `{a}.rope.freq_base`, `{a}.context_length`,
    `{a}.attention.key_length` (head_dim, else hidden / heads), `{a}.vocab_size` (else
    the token list's length), the tokenizer's bos / eos / padding ids; the head is tied
    when the file has no `output.weight`. Rope scaling other than linear, and a rotary
    dimension smaller than the head, raise `UnsupportedModelError` naming the key."""
    reader = reader if reader is not None else _reader(path)
    meta = _metadata(reader)
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"{path}: general.architecture={arch!r}; rljax reads GGUF files of {list(ARCHITECTURES)}"
        )

    def need(key):
        if f"{arch}.{key}" not in meta:
            raise UnsupportedModelError(f"{path}: metadata key {arch}.{key} missing")
        return meta[f"{arch}.{key}"]

    heads = int(need("attention.head_count"))
    hidden = int(need("embedding_length"))
    head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // heads))
    rotary = meta.get(f"{arch}.rope.dimension_count")
    if rotary is not None and int(rotary) != head_dim:
        raise UnsupportedModelError(
            f"{path}: {arch}.rope.dimension_count={rotary} < head_dim {head_dim} (partial rotary) is not supported"
        )
    vocab = meta.get(f"{arch}.vocab_size", meta.get("tokenizer.ggml.tokens.length"))
    if vocab is None:
        raise UnsupportedModelError(f"{path}: neither {arch}.vocab_size nor tokenizer.ggml.tokens in the metadata")
    rope: dict = {"rope_type": "default", "rope_theta": float(meta.get(f"{arch}.rope.freq_base", 10000.0))}
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        rope.update(rope_type="linear", factor=float(need("rope.scaling.factor")))
    elif scaling != "none":
        raise UnsupportedModelError(f"{path}: {arch}.rope.scaling.type={scaling!r} is not supported (none, linear)")
    names = {t.name for t in reader.tensors}
    return {
        "model_type": arch,
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get(f"{arch}.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": int(need("context_length")),
        "rope_parameters": rope,
        "tie_word_embeddings": "output.weight" not in names,
        "hidden_act": "silu",
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
    }


def read_gguf_config(path: str) -> ModelConfig:
    """The `ModelConfig` of a GGUF file (`hf_config_dict`)."""
    return ModelConfig.from_hf_dict(hf_config_dict(path), f"{path}: ")


def unpermute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """HF row order of a llama.cpp query / key weight `[heads * d, ...]`: within each
    head, stored row `2j + s` is HF row `s * d/2 + j` (module docstring)."""
    d = w.shape[0] // heads
    return w.reshape(heads, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's row order of an HF query / key weight: the inverse of `unpermute_rows`."""
    d = w.shape[0] // heads
    return w.reshape(heads, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class GGUFTensors:
    """A GGUF file's tensors under their HF names and in HF layout, dequantized to
    float32: the reader interface of `rljax.models.hf` (`names`, `shape`, `get`,
    `get_slice`). A tensor outside the Llama table keeps its GGUF name, so the
    checkpoint check reports it as unexpected. A slice dequantizes only the rows it
    covers (whole heads for the query / key projections); whole tensors are kept, the
    most recent first, up to `cache_bytes`, since a sharded load asks for the column
    blocks of one parameter (every layer) one block after another."""

    def __init__(self, path: str, reader=None, cache_bytes: int = 256 << 20):
        self.path = path
        self.cache_bytes = cache_bytes
        self._cache: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()
        self._reader = reader if reader is not None else _reader(path)
        config = hf_config_dict(path, self._reader)
        self._heads = {"q": config["num_attention_heads"], "k": config["num_key_value_heads"]}
        self._tensors = {}  # HF name -> (gguf ReaderTensor, heads to unpermute by or None)
        for t in self._reader.tensors:
            hf, heads = self._hf_name(t.name)
            self._tensors[hf] = (t, heads)

    def _hf_name(self, name: str) -> tuple[str, int | None]:
        if name in _GLOBAL_NAMES:
            return _GLOBAL_NAMES[name], None
        parts = name.split(".", 2)
        if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
            kind = parts[2]
            heads = self._heads["q"] if kind == "attn_q.weight" else self._heads["k"] if kind == "attn_k.weight" else None
            return f"model.layers.{int(parts[1])}.{_LAYER_NAMES[kind]}", heads
        return name, None

    def names(self) -> set[str]:
        return set(self._tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        t, _ = self._tensors[name]
        return tuple(int(n) for n in reversed(t.shape.tolist()))  # GGML lists dimensions fastest first

    def _rows(self, name: str, rows: slice) -> np.ndarray:
        """Rows `rows` (HF order) of the tensor, dequantized to float32."""
        from gguf.quants import dequantize

        t, heads = self._tensors[name]
        shape = self.shape(name)
        start, stop, _ = rows.indices(shape[0])
        if heads is not None:  # read the whole heads that cover the rows, reorder, cut
            d = shape[0] // heads
            first, last = start // d, max(-(-stop // d), start // d + 1)
            block = dequantize(np.asarray(t.data[first * d:last * d]), t.tensor_type)
            return unpermute_rows(block.reshape(-1, *shape[1:]), last - first)[start - first * d:stop - first * d]
        return dequantize(np.asarray(t.data[start:stop]), t.tensor_type).reshape(stop - start, *shape[1:])

    def get(self, name: str) -> np.ndarray:
        if name in self._cache:
            self._cache.move_to_end(name)
            return self._cache[name]
        whole = self._rows(name, slice(None)).astype(np.float32, copy=False)
        self._cache[name] = whole
        while sum(a.nbytes for a in self._cache.values()) > self.cache_bytes and len(self._cache) > 1:
            self._cache.popitem(last=False)
        if whole.nbytes > self.cache_bytes:
            self._cache.pop(name)
        return whole

    def get_slice(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        """`get(name)[index]`; a block of rows is dequantized alone."""
        if not index:
            return self.get(name)
        start, stop, _ = index[0].indices(self.shape(name)[0])
        if (start, stop) == (0, self.shape(name)[0]):
            return self.get(name)[index]
        return self._rows(name, index[0])[(slice(None), *index[1:])].astype(np.float32, copy=False)


def load_gguf_tokenizer(path: str):
    """The tokenizer and chat template a GGUF file holds, built by transformers
    (`AutoTokenizer.from_pretrained(folder, gguf_file=name)`, offline)."""
    from transformers import AutoTokenizer

    _reader(path)  # a clear error for a missing file or a missing `gguf` package
    folder, name = os.path.split(os.path.abspath(path))
    return AutoTokenizer.from_pretrained(folder, gguf_file=name)
