"""Our character-level tokenizer and its ChatML template."""

from __future__ import annotations

import string

import pytest

from rljax.data.tokenizer import CHAR_ALPHABET, SPECIAL_TOKENS, build_char_tokenizer, byte_level_name, char_vocab


def test_vocab_is_fixed_and_small(char_tok):
    again = build_char_tokenizer()
    assert char_tok.get_vocab() == again.get_vocab()
    # each character's id is its place in the alphabet; its token string GPT-2's byte-level name
    assert {ch: char_tok.convert_tokens_to_ids(byte_level_name(ch)) for ch in CHAR_ALPHABET} == {
        ch: i for ch, i in char_vocab().items() if ch in CHAR_ALPHABET}
    assert [byte_level_name(c) for c in "\t\n a~"] == ["ĉ", "Ċ", "Ġ", "a", "~"]
    assert len(char_tok) == len(SPECIAL_TOKENS) + len(CHAR_ALPHABET) == 102
    assert [char_tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert (char_tok.pad_token, char_tok.pad_token_id) == ("<|pad|>", 0)
    assert (char_tok.eos_token, char_tok.eos_token_id) == ("<|im_end|>", 3)
    assert char_tok.bos_token is None


def test_encode_decode_round_trip(char_tok):
    text = string.printable.replace("\r", "").replace("\x0b", "").replace("\x0c", "")
    ids = char_tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)  # one id per character
    assert char_tok.decode(ids) == text
    ids = char_tok.encode("<|im_start|>a b<|im_end|>", add_special_tokens=False)
    assert ids == [2, char_tok.convert_tokens_to_ids("a"), 7, char_tok.convert_tokens_to_ids("b"), 3]
    assert char_tok.encode("é", add_special_tokens=False) == [4, 4]  # unknown: <|unk|> per UTF-8 byte


def test_chat_template(char_tok):
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
            {"role": "assistant", "content": "a"}, {"role": "tool", "content": "t"}]
    text = char_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nu<|im_end|>\n"
                    "<|im_start|>assistant\na<|im_end|>\n<|im_start|>tool\nt<|im_end|>\n"
                    "<|im_start|>assistant\n")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    text = char_tok.apply_chat_template(msgs[:2], tools=tools, tokenize=False)
    assert text.startswith("<|im_start|>system\ns\n\n# Tools\n<tools>\n{")
    assert text.count("<|im_start|>system") == 1
    with pytest.raises(Exception, match="unknown role"):
        char_tok.apply_chat_template([{"role": "robot", "content": "x"}], tokenize=False)


def test_save_and_load_offline(tmp_path, char_tok, monkeypatch):
    from transformers import AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    char_tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    msgs = [{"role": "user", "content": "12+7="}, {"role": "assistant", "content": "19"}]
    assert loaded.get_vocab() == char_tok.get_vocab()
    assert loaded.apply_chat_template(msgs, tokenize=False) == char_tok.apply_chat_template(msgs, tokenize=False)
    assert loaded.encode("<|im_start|>hi\n", add_special_tokens=False) == char_tok.encode(
        "<|im_start|>hi\n", add_special_tokens=False)
    assert (loaded.eos_token, loaded.pad_token) == ("<|im_end|>", "<|pad|>")
    assert loaded.decode(loaded.encode("a b\nc", add_special_tokens=False)) == "a b\nc"


def test_load_beside_a_qwen2_model_config_keeps_the_ids(tmp_path, char_tok, monkeypatch):
    """An exported char-tokenizer model: config.json says qwen2, for which transformers 5
    substitutes its Qwen2 tokenizer class; `load_hf_tokenizer` keeps the saved one."""
    import json

    from rljax.data.tokenizer import load_hf_tokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    char_tok.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}))
    loaded = load_hf_tokenizer(str(tmp_path))
    text = "<|im_start|>user\n347*821=<|im_end|>\n"
    assert loaded.encode(text, add_special_tokens=False) == char_tok.encode(text, add_special_tokens=False)
    assert loaded.get_vocab() == char_tok.get_vocab()
    assert loaded.chat_template == char_tok.chat_template


def _training_texts() -> list[str]:
    """Every synthetic task's SFT conversations, rendered with the chat template."""
    from rljax.data.synthetic import TASKS, make_rows

    char_tok = build_char_tokenizer()
    return [char_tok.apply_chat_template(row["messages"], tokenize=False)
            for task in TASKS for row in make_rows("sft", 20, seed=3, task=task)] + [
        "\t\n  two spaces\n\nblank line", string.printable.replace("\r", "").replace("\x0b", "").replace("\x0c", "")]


@pytest.mark.parametrize("model_type", sorted(__import__("rljax.models.config", fromlist=["FAMILIES"]).FAMILIES))
def test_an_exported_char_tokenizer_reads_every_training_text_exactly_in_transformers(tmp_path, monkeypatch,
                                                                                      model_type):
    """What `rljax export` writes beside each model family's config.json, loaded with plain
    `AutoTokenizer` (which substitutes its own class for some model types, e.g. qwen2):
    the same ids and the same decoded text, newlines and runs of spaces included."""
    import json

    from transformers import AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    char_tok = build_char_tokenizer()
    char_tok.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    for text in _training_texts():
        ids = char_tok.encode(text, add_special_tokens=False)
        assert loaded.encode(text, add_special_tokens=False) == ids, (type(loaded).__name__, text)
        assert loaded.decode(ids) == char_tok.decode(ids) == text


def test_a_model_section_without_path_or_tokenizer_names_model_path():
    from types import SimpleNamespace

    from rljax.data.tokenizer import load_tokenizer

    with pytest.raises(ValueError, match=r"^model.path is empty and so is model.tokenizer: set model.path"):
        load_tokenizer(SimpleNamespace(tokenizer="", path=""))
