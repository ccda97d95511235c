"""Broken inputs name what is broken: a tokenizer folder without its files, a truncated
safetensors file, a generation longer than the model's max_position_embeddings."""

import json
import os

import pytest

from rljax.data.tokenizer import build_char_tokenizer, load_hf_tokenizer
from rljax.models import load_hf
from tests.models.hf_fixtures import build_hf_model


def test_tokenizer_folder_without_tokenizer_json_names_it(tmp_path):
    build_char_tokenizer().save_pretrained(tmp_path)
    os.remove(tmp_path / "tokenizer.json")
    with pytest.raises(FileNotFoundError) as info:
        load_hf_tokenizer(str(tmp_path))
    assert str(tmp_path) in str(info.value) and "tokenizer.json" in str(info.value)
    assert "\n" not in str(info.value)


def test_tokenizer_folder_with_only_configs_is_not_a_one_token_tokenizer(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "Qwen2Tokenizer",
                                                                "eos_token": "<|im_end|>"}))
    with pytest.raises(FileNotFoundError) as info:
        load_hf_tokenizer(str(tmp_path))  # an error, not a tokenizer of 1-2 tokens that encodes nothing
    message = str(info.value)
    assert str(tmp_path) in message and "tokenizer.json" in message and "vocab.json" in message, message


def test_missing_tokenizer_folder_and_broken_config_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nope")):
        load_hf_tokenizer(str(tmp_path / "nope"))
    build_char_tokenizer().save_pretrained(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": ')
    with pytest.raises(ValueError, match="tokenizer_config.json"):
        load_hf_tokenizer(str(tmp_path))


@pytest.mark.parametrize("keep", [100, 4, -100])
def test_truncated_safetensors_names_the_file(tmp_path, keep):
    build_hf_model("llama").save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(keep if keep > 0 else size + keep)
    with pytest.raises(ValueError) as info:
        load_hf(str(tmp_path))
    assert str(path) in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_missing_shard_names_the_file(tmp_path):
    build_hf_model("llama").save_pretrained(tmp_path, max_shard_size="100KB")
    shards = sorted(p for p in os.listdir(tmp_path) if p.endswith(".safetensors"))
    assert len(shards) > 1
    os.remove(tmp_path / shards[-1])
    with pytest.raises(FileNotFoundError, match=shards[-1]):
        load_hf(str(tmp_path))


def test_generate_refuses_to_run_past_max_position_embeddings(tmp_path, capsys):
    from rljax.cli import main
    from tests.rollout.test_generate_cli import save_tokenizer

    build_hf_model("llama").save_pretrained(tmp_path)  # max_position_embeddings=64
    save_tokenizer(tmp_path)
    assert main(["generate", "--model", str(tmp_path), "--prompt", "w1 w2 w3", "--raw", "--max-tokens", "100"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rljax: ")]  # not progress bars
    message = err[0]
    assert message.startswith("rljax: error: ") and len(err) == 2, err
    assert "max_position_embeddings=64" in message and "--max-tokens" in message and "\n" not in message, message
