"""Hugging Face checkpoints in and out.

`load_hf(path)` reads a local folder (`config.json` plus `model.safetensors` or a sharded
set with `model.safetensors.index.json`; fp32, bf16 or fp16 weights), or a `.gguf` file
(`rljax.models.gguf`: dequantized, Llama), into a `Decoder`.
`save_hf(model, path)` writes a folder that `transformers.AutoModelForCausalLM.
from_pretrained(path)` loads offline with no missing or unexpected keys.
`load_hf_reward_model(path)` reads a reward model `save_hf` exported (HF
`*ForSequenceClassification`, one label) back into a `ScalarHeadModel`.

Writing works on many processes: every process calls `save_hf` (a parameter sharded over
several processes' devices is gathered one tensor at a time, `rljax.hostsync.fetch`),
process 0 alone writes the files, and all return once the folder is complete.

One table, `weight_map(config)`, names every tensor in both worlds and says how to turn
one layout into the other; load, export and weight sync all read it.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from dataclasses import dataclass
from typing import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.distributed import is_coordinator, sync
from rljax.hostsync import fetch
from rljax.models.config import DTypePolicy, ModelConfig, UnsupportedModelError
from rljax.models.gguf import GGUFTensors, is_gguf, read_gguf_config
from rljax.models.heads import ScalarHeadModel
from rljax.models.transformer import LAYER_PARAMS, Decoder, abstract_model


class CheckpointMismatchError(ValueError):
    """A checkpoint's tensors do not match its config (missing, unexpected or misshapen)."""


# ---- the name-mapping table ------------------------------------------------------------


def _identity_slice(read, index):
    return read(index)


@dataclass(frozen=True)
class Mapping:
    """One rljax parameter <-> one HF tensor name (per layer when `per_layer`, and per
    expert as well when `per_expert`: the rljax array is `[L, X, ...]`, the HF name has
    "{i}" and "{e}").

    `to_hf` maps an rljax array (one layer's slice for per-layer params) to the HF layout;
    `from_hf` is its inverse. `read_slice(read, index)` is `from_hf(hf_tensor)[index]`
    computed from a partial read: `index` is a tuple of concrete slices (step 1) into the
    rljax layout (one layer's), `read(hf_index)` returns that slice of the HF tensor.
    Sharded loading uses it so a process reads only the bytes its devices hold."""

    rljax: tuple[str, ...]  # attribute path on the Decoder
    hf: str  # HF name; "{i}" is the layer index
    to_hf: Callable[[np.ndarray], np.ndarray]
    from_hf: Callable[[np.ndarray], np.ndarray]
    per_layer: bool
    read_slice: Callable[[Callable[[tuple], np.ndarray], tuple], np.ndarray] = _identity_slice
    per_expert: bool = False

    @property
    def stacked_dims(self) -> int:
        """Leading rljax dimensions that enumerate HF tensors (layers, experts)."""
        return int(self.per_layer) + int(self.per_expert)

    def hf_names(self, config: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
        """(HF name, index into the rljax array's stacked dimensions) of every tensor."""
        if self.per_expert:
            return [(self.hf.format(i=i, e=e), (i, e))
                    for i in range(config.num_hidden_layers) for e in range(config.num_experts)]
        if self.per_layer:
            return [(self.hf.format(i=i), (i,)) for i in range(config.num_hidden_layers)]
        return [(self.hf, ())]


def _identity(a):
    return a


def _transpose(a):
    return a.T


# Slice readers (see `Mapping.read_slice`): which HF rows/columns an rljax block needs.


def _transpose_slice(read, index):
    return read(index[::-1]).T


def _head_rows(heads: slice, head_dim: int) -> slice:
    """HF rows (flattened heads*head_dim) that hold the heads `heads`."""
    return slice(heads.start * head_dim, heads.stop * head_dim)


def _in_proj(heads: int, head_dim: int):
    """HF Linear weight [heads*head_dim, hidden] <-> rljax [hidden, heads, head_dim]."""

    def read_slice(read, index):
        e, h, d = index
        block = read((_head_rows(h, head_dim), e))  # [h' * head_dim, e']
        return block.T.reshape(block.shape[1], h.stop - h.start, head_dim)[:, :, d]

    return (
        lambda a: a.reshape(a.shape[0], heads * head_dim).T,
        lambda a: a.T.reshape(-1, heads, head_dim),
        read_slice,
    )


def _out_proj(heads: int, head_dim: int):
    """HF o_proj weight [hidden, heads*head_dim] <-> rljax [heads, head_dim, hidden]."""

    def read_slice(read, index):
        h, d, e = index
        block = read((e, _head_rows(h, head_dim)))  # [e', h' * head_dim]
        return block.T.reshape(h.stop - h.start, head_dim, block.shape[0])[:, d, :]

    return (
        lambda a: a.reshape(heads * head_dim, -1).T,
        lambda a: a.T.reshape(heads, head_dim, -1),
        read_slice,
    )


def _head_bias(heads: int, head_dim: int):
    def read_slice(read, index):
        h, d = index
        return read((_head_rows(h, head_dim),)).reshape(h.stop - h.start, head_dim)[:, d]

    return (lambda a: a.reshape(heads * head_dim), lambda a: a.reshape(heads, head_dim), read_slice)


_IDENTITY_LAYOUT = (_identity, _identity, _identity_slice)
_TRANSPOSE_LAYOUT = (_transpose, _transpose, _transpose_slice)


_HF_LAYER_NAMES = {
    "attn_norm": "input_layernorm.weight",
    "q_proj": "self_attn.q_proj.weight",
    "k_proj": "self_attn.k_proj.weight",
    "v_proj": "self_attn.v_proj.weight",
    "o_proj": "self_attn.o_proj.weight",
    "q_bias": "self_attn.q_proj.bias",
    "k_bias": "self_attn.k_proj.bias",
    "v_bias": "self_attn.v_proj.bias",
    "o_bias": "self_attn.o_proj.bias",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
    "mlp_norm": "post_attention_layernorm.weight",
    "gate_proj": "mlp.gate_proj.weight",
    "up_proj": "mlp.up_proj.weight",
    "down_proj": "mlp.down_proj.weight",
    "gate_bias": "mlp.gate_proj.bias",
    "up_bias": "mlp.up_proj.bias",
    "down_bias": "mlp.down_proj.bias",
}

# Mixture-of-experts tensors by family ("{e}" is the expert index): Qwen3-MoE keeps the
# dense names under `mlp.experts`, Mixtral's `block_sparse_moe` calls gate / down / up w1 / w2 / w3.
_HF_MOE_NAMES = {
    "qwen3_moe": {
        "router": "mlp.gate.weight",
        "expert_gate": "mlp.experts.{e}.gate_proj.weight",
        "expert_up": "mlp.experts.{e}.up_proj.weight",
        "expert_down": "mlp.experts.{e}.down_proj.weight",
    },
    "mixtral": {
        "router": "block_sparse_moe.gate.weight",
        "expert_gate": "block_sparse_moe.experts.{e}.w1.weight",
        "expert_up": "block_sparse_moe.experts.{e}.w3.weight",
        "expert_down": "block_sparse_moe.experts.{e}.w2.weight",
    },
}

# Tensors some checkpoints carry that hold no parameters (buffers saved by old code).
_IGNORED_HF = re.compile(r".*rotary_emb\.inv_freq$")


def weight_map(config: ModelConfig) -> list[Mapping]:
    """Every parameter of a `Decoder` for `config`, with its HF name and layout change.
    The three families share one decoder and so one table; the config decides which
    optional entries (biases, q/k norms, untied head) exist."""
    h, kv, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    layout: dict[str, tuple[Callable, Callable, Callable]] = {
        "q_proj": _in_proj(h, d),
        "k_proj": _in_proj(kv, d),
        "v_proj": _in_proj(kv, d),
        "o_proj": _out_proj(h, d),
        "q_bias": _head_bias(h, d),
        "k_bias": _head_bias(kv, d),
        "v_bias": _head_bias(kv, d),
        "gate_proj": _TRANSPOSE_LAYOUT,
        "up_proj": _TRANSPOSE_LAYOUT,
        "down_proj": _TRANSPOSE_LAYOUT,
        "router": _TRANSPOSE_LAYOUT,  # HF [X, E]
        "expert_gate": _TRANSPOSE_LAYOUT,  # per expert, HF [F, E]
        "expert_up": _TRANSPOSE_LAYOUT,
        "expert_down": _TRANSPOSE_LAYOUT,  # per expert, HF [E, F]
    }
    names = {**_HF_LAYER_NAMES, **_HF_MOE_NAMES.get(config.model_type, {})}
    table = [Mapping(("embed",), "model.embed_tokens.weight", _identity, _identity, False, _identity_slice)]
    for name, spec in LAYER_PARAMS.items():
        if spec.present(config):
            to_hf, from_hf, read_slice = layout.get(name, _IDENTITY_LAYOUT)
            hf = names[name]
            table.append(Mapping(("layers", name), f"model.layers.{{i}}.{hf}", to_hf, from_hf, True,
                                 read_slice, per_expert="{e}" in hf))
    table.append(Mapping(("final_norm",), "model.norm.weight", _identity, _identity, False, _identity_slice))
    if not config.tie_word_embeddings:
        table.append(Mapping(("lm_head",), "lm_head.weight", _transpose, _transpose, False, _transpose_slice))
    return table


def _variable(model: Decoder, path: tuple[str, ...]) -> nnx.Variable:
    obj = model
    for name in path:
        obj = getattr(obj, name)
    return obj


# ---- reading ---------------------------------------------------------------------------


class SafetensorsReader:
    """Tensors of a local HF folder by name, across one file or a sharded set."""

    def __init__(self, path: str):
        from safetensors import safe_open

        index = os.path.join(path, "model.safetensors.index.json")
        single = os.path.join(path, "model.safetensors")
        self.path = path
        if os.path.exists(index):
            try:
                with open(index) as f:
                    files = json.load(f)["weight_map"]
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
                raise CheckpointMismatchError(f"{index}: not a safetensors index ({type(e).__name__}: {e})") from None
        elif os.path.exists(single):
            files = None
        else:
            raise FileNotFoundError(f"{path}: no model.safetensors or model.safetensors.index.json")
        self._handles = {}
        self.file_of: dict[str, str] = {}
        for fname in sorted(set(files.values())) if files else ["model.safetensors"]:
            file = os.path.join(path, fname)
            if not os.path.exists(file):
                raise FileNotFoundError(f"{file}: missing (listed in {index})")
            try:
                handle = safe_open(file, framework="numpy")
                keys = list(handle.keys())
            except Exception as e:  # safetensors' errors do not name the file
                raise CheckpointMismatchError(_unreadable(file, e)) from None
            self._handles[fname] = handle
            for key in keys:
                self.file_of[key] = fname

    def _read(self, name: str, read):
        fname = self.file_of[name]
        try:
            return read(self._handles[fname])
        except Exception as e:
            raise CheckpointMismatchError(_unreadable(os.path.join(self.path, fname), e, name)) from None

    def names(self) -> set[str]:
        return set(self.file_of)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._read(name, lambda h: tuple(h.get_slice(name).get_shape()))

    def get(self, name: str) -> np.ndarray:
        return self._read(name, lambda h: h.get_tensor(name))

    def get_slice(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        """`tensor[index]` read from disk without reading the rest of the tensor."""
        return self._read(name, lambda h: h.get_slice(name)[index])


def _unreadable(file: str, error: Exception, tensor: str | None = None) -> str:
    detail = " ".join(str(error).split()) or type(error).__name__
    what = f"tensor {tensor} unreadable" if tensor else "not a readable safetensors file"
    return f"{file}: {what} (truncated or damaged? {detail})"


def _read_hf_config(path: str) -> tuple[str, dict]:
    """(path of config.json, its contents)."""
    cfg_path = os.path.join(path, "config.json")
    if not os.path.exists(cfg_path):
        raise FileNotFoundError(f"{path}: no config.json")
    with open(cfg_path) as f:
        raw = json.load(f)
    if raw.get("model_type") is None:
        raise UnsupportedModelError(f"{cfg_path}: no model_type")
    return cfg_path, raw


def read_config(path: str) -> ModelConfig:
    """The `ModelConfig` of a folder's config.json, or of a `.gguf` file's metadata."""
    if is_gguf(path):
        return read_gguf_config(path)
    cfg_path, raw = _read_hf_config(path)
    return ModelConfig.from_hf_dict(raw, f"{cfg_path}: ")


def open_checkpoint(path: str) -> SafetensorsReader | GGUFTensors:
    """The tensors of a checkpoint by HF name: a folder's safetensors, or a `.gguf` file's
    tensors dequantized into HF layout (`rljax.models.gguf`)."""
    return GGUFTensors(path) if is_gguf(path) else SafetensorsReader(path)


def _expected_hf_shapes(config: ModelConfig, model: Decoder,
                        skip: frozenset[str] = frozenset()) -> dict[str, tuple[Mapping, int | None, tuple]]:
    out = {}
    for m in weight_map(config):
        if m.hf in skip:
            continue
        abstract = _variable(model, m.rljax).get_value()
        shape = m.to_hf(np.empty(abstract.shape[m.stacked_dims:], dtype=np.float32)).shape
        for name, index in m.hf_names(config):
            out[name] = (m, index, shape)
    return out


def _check_checkpoint(path: str, config: ModelConfig, model: Decoder, reader: SafetensorsReader,
                      skip: frozenset[str] = frozenset(), extra: dict[str, tuple] | None = None) -> None:
    """Every tensor present, none unexpected, every shape as the config implies.
    `skip`: HF names of `weight_map` the checkpoint does not hold; `extra`: HF names
    outside it (a head) with their shapes."""
    expected = _expected_hf_shapes(config, model, skip)
    expected.update({name: (None, None, tuple(shape)) for name, shape in (extra or {}).items()})
    present = {n for n in reader.names() if not _IGNORED_HF.match(n)}
    if config.tie_word_embeddings:
        present.discard("lm_head.weight")  # some tied checkpoints also store the head
    missing = sorted(set(expected) - present)
    unexpected = sorted(present - set(expected))
    if missing or unexpected:
        raise CheckpointMismatchError(
            f"{path}: checkpoint does not match its config ({config.model_type}): "
            f"missing tensors {missing[:8]}{' ...' if len(missing) > 8 else ''}, "
            f"unexpected tensors {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}"
        )
    for name, (_, _, shape) in expected.items():
        if reader.shape(name) != shape:
            raise CheckpointMismatchError(
                f"{path}: tensor {name} has shape {reader.shape(name)}, the config implies {shape}"
            )


def load_hf(
    path: str,
    dtype: str = "float32",
    *,
    compute_dtype: str | None = None,
    remat: str = "none",
    attention: str = "xla",
) -> Decoder:
    """Load a local HF checkpoint folder (or a `.gguf` file) into a `Decoder` with
    parameters in `dtype`.

    Every tensor is checked against the config before anything is loaded: a missing,
    unexpected or misshapen tensor raises `CheckpointMismatchError` naming it.
    """
    config = read_config(path)
    policy = DTypePolicy(param_dtype=dtype, compute_dtype=compute_dtype or dtype)
    model = abstract_model(config, policy=policy, remat=remat, attention=attention)
    reader = open_checkpoint(path)
    _check_checkpoint(path, config, model, reader)
    _fill(model, config, reader, dtype)
    return model


def _fill(model: Decoder, config: ModelConfig, reader: SafetensorsReader, dtype: str, mesh=None,
          skip: frozenset[str] = frozenset()) -> None:
    """Set every parameter of `weight_map(config)` (but the HF names in `skip`) from the
    checkpoint: whole arrays on the default device, or with `mesh` each in its sharded
    layout, this process reading only the slices its own devices hold."""
    from jax.sharding import NamedSharding

    from rljax.parallel import logical_to_spec

    np_dtype = jnp.dtype(dtype)
    for m in weight_map(config):
        if m.hf in skip:
            continue
        var = _variable(model, m.rljax)
        if mesh is not None:
            shape = tuple(var.get_value().shape)
            axes = var.get_metadata().get("logical_axes") or (None,) * len(shape)
            sharding = NamedSharding(mesh, logical_to_spec(axes, shape, mesh, name="/".join(m.rljax)))
            var.set_value(read_sharded(reader, m, shape, np_dtype, sharding))
        elif m.per_layer:
            stacked = np.empty(var.get_value().shape, dtype=np_dtype)
            for name, index in m.hf_names(config):
                stacked[index] = m.from_hf(reader.get(name)).astype(np_dtype)
            var.set_value(jnp.asarray(stacked))
        else:
            var.set_value(jnp.asarray(m.from_hf(reader.get(m.hf)).astype(np_dtype)))


# ---- sharded reading ---------------------------------------------------------------------

Index = tuple[slice, ...]


def _concrete(index: Index, shape: tuple[int, ...]) -> Index:
    """Slices with explicit start/stop (step 1) for every dimension."""
    index = tuple(index) + (slice(None),) * (len(shape) - len(index))
    out = []
    for s, n in zip(index, shape):
        start, stop, step = s.indices(n)
        if step != 1:
            raise ValueError(f"strided shard index {s}")
        out.append(slice(start, stop))
    return tuple(out)


def read_block(reader: SafetensorsReader, m: Mapping, index: Index, shape: tuple[int, ...], dtype) -> np.ndarray:
    """`rljax_param[index]` in `dtype`, reading only the HF bytes it needs. For a
    per-layer parameter `index[0]` selects layers (one HF tensor each), the rest is
    mapped to that tensor's layout by `m.read_slice`."""
    index = _concrete(index, shape)
    if not m.per_layer:
        return np.asarray(m.read_slice(lambda hf_index: reader.get_slice(m.hf, hf_index), index)).astype(dtype)
    stacked, rest = index[:m.stacked_dims], index[m.stacked_dims:]
    out = np.empty(tuple(s.stop - s.start for s in index), dtype)
    for pos in itertools.product(*(range(s.stop - s.start) for s in stacked)):
        at = dict(zip("ie", (s.start + p for s, p in zip(stacked, pos))))
        name = m.hf.format(**at)
        out[pos] = m.read_slice(lambda hf_index, name=name: reader.get_slice(name, hf_index), rest)
    return out


def read_sharded(reader: SafetensorsReader, m: Mapping, shape: tuple[int, ...], dtype, sharding) -> jax.Array:
    """One parameter as a global `jax.Array` laid out by `sharding`: this process reads
    only the blocks its own devices hold, each distinct block once (devices that hold
    the same block, e.g. across the `data` axis, share one read)."""
    blocks: dict[tuple, np.ndarray] = {}

    def block(index: Index) -> np.ndarray:
        key = tuple((s.start, s.stop) for s in _concrete(index, shape))
        if key not in blocks:
            blocks[key] = read_block(reader, m, index, shape, dtype)
        return blocks[key]

    return jax.make_array_from_callback(shape, sharding, block)


def load_hf_sharded(
    path: str,
    mesh,
    dtype: str = "float32",
    *,
    compute_dtype: str | None = None,
    remat: str = "none",
    attention: str = "xla",
    reader: SafetensorsReader | None = None,
) -> Decoder:
    """Load a local HF checkpoint folder straight into its sharded layout on `mesh`
    (the logical-axis rules of `rljax.parallel`). Each process reads, with safetensors
    slicing, only the slices its own devices hold, one tensor at a time, so no host
    ever holds the whole model. Same checks, names and values as `load_hf`.

    `reader` may be passed to instrument reads (tests count the bytes)."""
    config = read_config(path)
    policy = DTypePolicy(param_dtype=dtype, compute_dtype=compute_dtype or dtype)
    model = abstract_model(config, policy=policy, remat=remat, attention=attention)
    reader = reader if reader is not None else open_checkpoint(path)
    _check_checkpoint(path, config, model, reader)
    _fill(model, config, reader, dtype, mesh)
    return model


# ---- reward models (*ForSequenceClassification) ------------------------------------------


def load_hf_reward_model(
    path: str,
    dtype: str = "float32",
    *,
    compute_dtype: str | None = None,
    remat: str = "none",
    attention: str = "xla",
    mesh=None,
) -> ScalarHeadModel:
    """Load a reward model exported by `save_hf` (HF `*ForSequenceClassification` with
    `num_labels=1`: the backbone's tensors without `lm_head`, plus `score.weight`
    `[1, hidden]`) into a `ScalarHeadModel` with parameters in `dtype`; with `mesh`,
    straight into its sharded layout as `load_hf_sharded` does.

    A reward model has no LM head: for an untied config the backbone is built without
    its `lm_head` parameter (so `backbone.unembedding()` is unavailable). A folder that
    is not a one-label sequence-classification checkpoint (a causal LM, `num_labels`
    != 1, no or a misshapen `score.weight`) raises `CheckpointMismatchError` naming the
    file and tensor."""
    cfg_path, raw = _read_hf_config(path)
    architectures = raw.get("architectures") or []
    if architectures and not any(str(a).endswith("ForSequenceClassification") for a in architectures):
        raise CheckpointMismatchError(
            f"{cfg_path}: architectures {architectures} is not a *ForSequenceClassification reward model "
            "(load a causal LM with load_hf)"
        )
    id2label = raw.get("id2label")
    num_labels = len(id2label) if isinstance(id2label, dict) else raw.get("num_labels")
    if num_labels is not None and num_labels != 1:
        raise CheckpointMismatchError(
            f"{cfg_path}: num_labels={num_labels}; a reward model has one label (a scalar score)"
        )
    config = ModelConfig.from_hf_dict(raw, f"{cfg_path}: ")
    policy = DTypePolicy(param_dtype=dtype, compute_dtype=compute_dtype or dtype)
    backbone = abstract_model(config, policy=policy, remat=remat, attention=attention)
    skip = frozenset() if config.tie_word_embeddings else frozenset({"lm_head.weight"})
    if skip:
        del backbone.lm_head
    reader = SafetensorsReader(path)
    score_shape = (1, config.hidden_size)
    if "score.weight" not in reader.names():
        raise CheckpointMismatchError(
            f"{os.path.join(path, 'model.safetensors')}: no tensor score.weight {list(score_shape)}; "
            "not a reward model (*ForSequenceClassification) checkpoint"
        )
    if reader.shape("score.weight") != score_shape:
        raise CheckpointMismatchError(
            f"{os.path.join(path, reader.file_of['score.weight'])}: tensor score.weight has shape "
            f"{reader.shape('score.weight')}, a one-label reward model has {score_shape}"
        )
    _check_checkpoint(path, config, backbone, reader, skip, {"score.weight": score_shape})
    _fill(backbone, config, reader, dtype, mesh, skip)
    model = ScalarHeadModel(backbone, rngs=nnx.Rngs(0))
    score = np.asarray(reader.get("score.weight")[0]).astype(jnp.dtype(dtype))
    if mesh is not None:  # from host memory: every process holds the same vector
        from jax.sharding import NamedSharding, PartitionSpec

        score = jax.device_put(score, NamedSharding(mesh, PartitionSpec()))
    else:
        score = jnp.asarray(score)
    model.score.set_value(score)
    return model


# ---- writing ---------------------------------------------------------------------------


def _parse_size(size: int | str) -> int:
    if isinstance(size, int):
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B)\s*", size, flags=re.IGNORECASE)
    if not match:
        raise ValueError(f"max_shard_size {size!r}: expected bytes or e.g. '5GB', '500MB'")
    units = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
    return int(float(match.group(1)) * units[match.group(2).upper()])


def hf_tensors(model: Decoder, dtype: str | None = None, lm_head: bool = True) -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, host array) for every parameter, one tensor at a time: a per-layer
    parameter is sliced on device and only that slice comes to the host (gathered from
    every process that holds a part of it: all processes iterate this together)."""
    config = model.config
    np_dtype = jnp.dtype(dtype) if dtype else None
    for m in weight_map(config):
        if m.hf == "lm_head.weight" and not lm_head:
            continue
        value = _variable(model, m.rljax)[...]
        for name, index in m.hf_names(config):
            arr = value[index] if index else value
            host = m.to_hf(fetch(arr))
            yield name, np.ascontiguousarray(host.astype(np_dtype) if np_dtype else host)


def save_hf(
    model: Decoder | ScalarHeadModel,
    path: str,
    tokenizer=None,
    dtype: str | None = None,
    max_shard_size: int | str = "5GB",
) -> None:
    """Write `model` as a Hugging Face folder: config.json, generation_config.json,
    safetensors (sharded with an index above `max_shard_size`) and the tokenizer.
    A `ScalarHeadModel` (reward model) is written as `*ForSequenceClassification` with
    `num_labels=1`: the backbone's tensors without `lm_head`, plus `score.weight`.

    Every process of a run calls it: each tensor is gathered on every process, process 0
    alone writes, and all return once the folder is complete."""
    from safetensors.numpy import save_file

    writer = is_coordinator()
    head = model if isinstance(model, ScalarHeadModel) else None
    decoder = head.backbone if head is not None else model
    if decoder.lora_scale:  # the table has no place for adapters: writing without them would drop them
        raise ValueError("save_hf: the model has LoRA adapters; merge them first (rljax.models.lora.merge_into_base) "
                         "or write them as a PEFT folder (rljax.models.lora_peft.save_peft_adapters)")
    dtype = dtype or decoder.policy.param_dtype
    limit = _parse_size(max_shard_size)
    if writer:
        os.makedirs(path, exist_ok=True)
    # Shards are written as they fill, so host memory stays near one shard.
    written: list[tuple[str, list[str]]] = []  # (temporary file, tensor names)
    current: dict[str, np.ndarray] = {}
    current_bytes = total = 0

    def flush():
        tmp_name = f"shard-{len(written):05d}.tmp.safetensors"
        save_file(current, os.path.join(path, tmp_name), metadata={"format": "pt"})
        written.append((tmp_name, list(current)))
        current.clear()

    tensors = hf_tensors(decoder, dtype, lm_head=head is None)
    if head is not None:
        tensors = itertools.chain(tensors, [("score.weight", fetch(head.score[...])[None, :].astype(jnp.dtype(dtype)))])
    for name, arr in tensors:  # a collective per sharded tensor: every process takes part
        if not writer:
            continue
        if current and current_bytes + arr.nbytes > limit:
            flush()
            current_bytes = 0
        current[name] = arr
        current_bytes += arr.nbytes
        total += arr.nbytes
    if writer:
        flush()
        _name_shards(path, written, total)
        _write_configs(path, decoder.config, head is not None, dtype, tokenizer)
        readable_by_all(path)
    sync("rljax.models.hf.save_hf")


def readable_by_all(folder: str) -> None:
    """Give the files in `folder` the mode a plain `open` would (0644 under umask 022):
    safetensors writes its files 0600, which other users (a serving job, a teammate)
    cannot read."""
    mask = os.umask(0)
    os.umask(mask)
    for name in os.listdir(folder):
        file = os.path.join(folder, name)
        if os.path.isfile(file) and not os.path.islink(file):
            os.chmod(file, 0o666 & ~mask)


def _name_shards(path: str, written: list[tuple[str, list[str]]], total: int) -> None:
    """Give `save_hf`'s written shards their final names (one: model.safetensors; more:
    model-0000k-of-0000n.safetensors and the index), replacing those of an earlier export."""
    for stale in os.listdir(path):
        if re.fullmatch(r"model(-\d{5}-of-\d{5})?\.safetensors(\.index\.json)?", stale):
            os.remove(os.path.join(path, stale))
    if len(written) == 1:
        os.replace(os.path.join(path, written[0][0]), os.path.join(path, "model.safetensors"))
    else:
        weight_map_json = {}
        for k, (tmp_name, names) in enumerate(written):
            final = f"model-{k + 1:05d}-of-{len(written):05d}.safetensors"
            os.replace(os.path.join(path, tmp_name), os.path.join(path, final))
            weight_map_json.update({n: final for n in names})
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map_json}, f, indent=2)


def _write_configs(path: str, config: ModelConfig, reward_model: bool, dtype: str, tokenizer) -> None:
    """config.json, generation_config.json and the tokenizer files of `save_hf`'s folder."""
    hf_config = config.to_hf_dict(dtype=dtype)
    if reward_model:
        hf_config["architectures"] = [config.family.architecture.replace("ForCausalLM", "ForSequenceClassification")]
        hf_config.update(id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf_config, f, indent=2)
    generation = {k: v for k, v in {
        "bos_token_id": config.bos_token_id,
        "eos_token_id": list(config.eos_token_id) if isinstance(config.eos_token_id, tuple) else config.eos_token_id,
        "pad_token_id": config.pad_token_id,
    }.items() if v is not None}
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump(generation, f, indent=2)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
