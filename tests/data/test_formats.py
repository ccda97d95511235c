"""Per-format row handling: bad rows, truncation, masks, RL fields (through make_dataset)."""

from __future__ import annotations

import numpy as np
import pytest

from rljax.data import DataConfig, DataError, make_dataset

from .helpers import sft_row, write_jsonl, write_parquet
from .test_chat import EXPECTED_TOOL_SPANS, TOOLS, full_ids, spans, tool_conversation


def first_batch(tmp_path, rows, tok, name="d.jsonl", raw_lines=None, **cfg):
    path = write_jsonl(tmp_path / name, rows, raw_lines=raw_lines)
    defaults = dict(train_files=[path], shuffle=False, batch_size=len(rows) + len(raw_lines or {}),
                    max_length=256, max_prompt_length=128, bucket_size=32)
    defaults.update(cfg)
    it = make_dataset(DataConfig(**defaults), tok, process_index=0, process_count=1)
    return next(it)


GOOD = sft_row("1+1=", "2")


# ---- every bad row names file, row and key ---------------------------------------------

SFT_BAD = [
    ({"conversation": []}, "messages", "missing key 'messages'"),
    ({"messages": "hello"}, "messages", "expected a list of messages, got str"),
    ({"messages": []}, "messages", "empty list of messages"),
    ({"messages": [{"role": "user", "content": 7}, {"role": "assistant", "content": "x"}]},
     "messages[0].content", "content must be a string"),
    ({"messages": [{"role": "human", "content": "x"}, {"role": "assistant", "content": "y"}]},
     "messages[0].role", "unknown role 'human'"),
    ({"messages": [{"role": "user", "content": "x"}]}, "messages", "no assistant message"),
    ({"messages": [{"role": "assistant", "content": "x"}]}, "messages[0].role", "starts with an assistant"),
    # a role sequence the template cannot render (our ChatML: system only first)
    ({"messages": [{"role": "user", "content": "x"}, {"role": "system", "content": "s"},
                   {"role": "assistant", "content": "y"}]},
     "messages", "chat template cannot render"),
    ({**GOOD, "tools": 5}, "tools", "tools must be a list"),
]


@pytest.mark.parametrize("bad, key, match", SFT_BAD)
def test_sft_bad_rows(tmp_path, char_tok, bad, key, match):
    with pytest.raises(DataError, match=match) as e:
        first_batch(tmp_path, [GOOD, GOOD, bad], char_tok)
    err = e.value
    assert (err.file, err.row, err.line, err.key) == (str(tmp_path / "d.jsonl"), 2, 3, key)
    assert f"d.jsonl: row 2 (line 3), key {key!r}" in str(err)


def test_qwen3_multi_turn_row_names_file_and_row(tmp_path, qwen3_tok):
    multi = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                          {"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"}]}
    with pytest.raises(DataError, match=r"row 1 \(line 2\), key 'messages': the chat template is not "
                       r"prefix-stable"):
        first_batch(tmp_path, [GOOD, multi], qwen3_tok)


def test_non_json_line_in_pipeline(tmp_path, char_tok):
    with pytest.raises(DataError, match=r"d\.jsonl: row 1 \(line 2\): not valid JSON"):
        first_batch(tmp_path, [GOOD, GOOD], char_tok, raw_lines={1: '{"messages": ['})


PREF_GOOD = {"prompt": "2+2=", "chosen": "4", "rejected": "5"}
PREF_BAD = [
    ({"prompt": "q", "chosen": "a"}, "rejected", "missing key 'rejected'"),
    ({"chosen": "a", "rejected": "b"}, "prompt", "missing key 'prompt'"),
    ({"prompt": "q", "chosen": "a", "rejected": 3}, "rejected", "expected a list of messages, got int"),
    ({"prompt": "q", "chosen": [{"role": "user", "content": "a"}], "rejected": "b"}, "chosen",
     "no assistant message"),
    ({"prompt": [], "chosen": "a", "rejected": "b"}, "prompt", "empty list"),
]


@pytest.mark.parametrize("bad, key, match", PREF_BAD)
def test_preference_bad_rows(tmp_path, char_tok, bad, key, match):
    with pytest.raises(DataError, match=match) as e:
        first_batch(tmp_path, [PREF_GOOD, bad], char_tok, format="preference")
    assert (e.value.row, e.value.line, e.value.key) == (1, 2, key)


RL_GOOD = {
    "data_source": "synthetic/arithmetic",
    "prompt": [{"role": "user", "content": "2+2="}],
    "reward_model": {"style": "rule", "ground_truth": "4"},
    "extra_info": {"index": 0},
}
RL_BAD = [
    ({k: v for k, v in RL_GOOD.items() if k != "data_source"}, "data_source", "missing key"),
    ({**RL_GOOD, "data_source": 1}, "data_source", "expected a string"),
    ({**RL_GOOD, "prompt": []}, "prompt", "empty list"),
    ({**RL_GOOD, "prompt": [{"role": "user"}]}, "prompt[0].content", "missing key 'content'"),
    ({**RL_GOOD, "reward_model": "4"}, "reward_model", "expected an object"),
    ({**RL_GOOD, "reward_model": {"style": "rule"}}, "reward_model.ground_truth", "missing key 'ground_truth'"),
    ({**RL_GOOD, "extra_info": [1]}, "extra_info", "expected an object"),
]


@pytest.mark.parametrize("bad, key, match", RL_BAD)
def test_rl_bad_rows(tmp_path, char_tok, bad, key, match):
    with pytest.raises(DataError, match=match) as e:
        first_batch(tmp_path, [RL_GOOD, bad], char_tok, format="rl")
    assert (e.value.row, e.value.line, e.value.key) == (1, 2, key)


# ---- SFT --------------------------------------------------------------------------------


def test_sft_tool_conversation_through_pipeline(tmp_path, any_tok):
    row = {"messages": tool_conversation(as_string=True), "tools": TOOLS}
    b = first_batch(tmp_path, [row], any_tok, max_length=1024, bucket_size=64)
    n = int(b["attention_mask"][0].sum())
    ids = b["input_ids"][0, :n].tolist()
    assert ids == full_ids(any_tok, tool_conversation(), tools=TOOLS)
    runs = spans(ids, b["loss_mask"][0, :n])
    assert [any_tok.decode(ids[a:c]) for a, c in runs] == EXPECTED_TOOL_SPANS
    assert b["loss_mask"][0, n:].sum() == 0


def test_parquet_struct_nones_are_dropped(tmp_path, char_tok):
    """Parquet fills absent struct fields with None; rows must read like JSON lines."""
    rows = [{"messages": tool_conversation(), "tools": TOOLS}, sft_row("a", "b")]
    rows[1]["tools"] = None
    pq_path = write_parquet(tmp_path / "d.parquet", rows)
    js_path = write_jsonl(tmp_path / "d.jsonl", rows)
    out = []
    for path in (pq_path, js_path):
        cfg = DataConfig(train_files=[path], shuffle=False, batch_size=2, max_length=1024)
        out.append(next(make_dataset(cfg, char_tok, process_index=0, process_count=1)))
    for k in out[0]:
        np.testing.assert_array_equal(out[0][k], out[1][k])


def _long_row():
    return sft_row("q" * 30, "a" * 30)


def _long_len(tok):
    return len(full_ids(tok, _long_row()["messages"]))


def test_sft_truncation_error_names_lengths(tmp_path, char_tok):
    n = _long_len(char_tok)
    with pytest.raises(DataError, match=rf"row 1 \(line 2\), key 'messages': conversation has {n} tokens, "
                       r"more than the limit of 40"):
        first_batch(tmp_path, [GOOD, _long_row()], char_tok, max_length=40)


@pytest.mark.parametrize("policy", ["left", "right"])
def test_sft_truncation_left_right(tmp_path, char_tok, policy):
    n = _long_len(char_tok)
    full = first_batch(tmp_path, [_long_row()], char_tok, max_length=128)
    cut = first_batch(tmp_path, [_long_row()], char_tok, max_length=40, truncation=policy, bucket_size=8)
    assert cut["input_ids"].shape == (1, 40)
    ids = full["input_ids"][0, :n]
    mask = full["loss_mask"][0, :n]
    keep = slice(n - 40, n) if policy == "left" else slice(0, 40)
    np.testing.assert_array_equal(cut["input_ids"][0], ids[keep])
    expected_mask = mask[keep].copy()
    expected_mask[0] = 0.0  # the first token is never a target
    np.testing.assert_array_equal(cut["loss_mask"][0], expected_mask)
    text = char_tok.decode(cut["input_ids"][0].tolist())
    if policy == "left":  # the end survives: 30 answer chars + <|im_end|> minus position 0
        assert text.endswith("a" * 30 + "<|im_end|>\n")
        assert cut["loss_mask"][0].sum() == 31
    else:
        assert text.startswith("<|im_start|>user\n" + "q" * 23)
        assert cut["loss_mask"][0].sum() == 0


def test_sft_batch_keys_dtypes(tmp_path, char_tok):
    b = first_batch(tmp_path, [GOOD, _long_row()], char_tok)
    assert set(b) == {"input_ids", "attention_mask", "segment_ids", "positions", "loss_mask"}
    for k, v in b.items():
        assert v.shape == (2, 96)
        assert v.dtype == (np.float32 if k == "loss_mask" else np.int32)
    np.testing.assert_array_equal(b["segment_ids"], b["attention_mask"])
    assert (b["loss_mask"][:, 0] == 0).all()
    n = b["attention_mask"].sum(1)
    assert n.tolist() == [len(full_ids(char_tok, GOOD["messages"])), _long_len(char_tok)]
    assert b["positions"][1].tolist() == list(range(n[1])) + [0] * (96 - n[1])
    assert (b["input_ids"][0, n[0]:] == char_tok.pad_token_id).all()


# ---- preference -------------------------------------------------------------------------


def test_preference_masks_and_forms(tmp_path, any_tok):
    forms = [
        {"prompt": "2+2=", "chosen": "4", "rejected": "5"},
        {"prompt": [{"role": "user", "content": "2+2="}],
         "chosen": {"role": "assistant", "content": "4"},
         "rejected": [{"role": "assistant", "content": "5"}]},
    ]
    b = first_batch(tmp_path, forms, any_tok, format="preference")
    keys = {f"{s}_{k}" for s in ("chosen", "rejected")
            for k in ("input_ids", "attention_mask", "positions", "loss_mask")}
    assert set(b) == keys
    assert b["chosen_input_ids"].shape == b["rejected_input_ids"].shape
    for side, answer in (("chosen", "4"), ("rejected", "5")):
        ids, mask = b[f"{side}_input_ids"], b[f"{side}_loss_mask"]
        np.testing.assert_array_equal(ids[0], ids[1])  # string and message forms agree
        n = int(b[f"{side}_attention_mask"][0].sum())
        full = full_ids(any_tok, [{"role": "user", "content": "2+2="},
                                  {"role": "assistant", "content": answer}])
        assert ids[0, :n].tolist() == full
        runs = spans(ids[0], mask[0])
        assert [any_tok.decode(ids[0, a:c].tolist()) for a, c in runs] == [answer + "<|im_end|>"]


def test_preference_prompt_assistant_turns_not_trained(tmp_path, char_tok):
    row = {"prompt": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                      {"role": "user", "content": "c"}],
           "chosen": "yes", "rejected": "no"}
    b = first_batch(tmp_path, [row], char_tok, format="preference")
    ids, mask = b["chosen_input_ids"][0], b["chosen_loss_mask"][0]
    assert [char_tok.decode(ids[a:c].tolist()) for a, c in spans(ids, mask)] == ["yes<|im_end|>"]


def test_preference_truncation(tmp_path, char_tok):
    row = {"prompt": "p" * 40, "chosen": "c" * 30, "rejected": "r" * 5}
    # prompt = "<|im_start|>user\n" (6) + 40 + "<|im_end|>\n" (2) + "<|im_start|>assistant\n" (11)
    with pytest.raises(DataError, match="key 'prompt': prompt has 59 tokens, more than the limit of 20"):
        first_batch(tmp_path, [row], char_tok, format="preference", max_prompt_length=20, max_length=64)
    with pytest.raises(DataError, match=r"key 'chosen': response \(after a 59-token prompt"):
        first_batch(tmp_path, [row], char_tok, format="preference", max_prompt_length=60, max_length=64)
    for policy in ("left", "right"):
        b = first_batch(tmp_path, [row], char_tok, format="preference", max_prompt_length=20,
                        max_length=32, truncation=policy, bucket_size=8)
        ids = b["chosen_input_ids"][0]
        text = char_tok.decode(ids.tolist())
        if policy == "left":
            assert text.startswith("p" * 7 + "<|im_end|>\n<|im_start|>assistant\n")
        else:
            assert text.startswith("<|im_start|>user\n" + "p" * 14 + "c")
        assert text.endswith("c" * 12)  # response cut on the right, 20 + 12 = 32
        assert b["chosen_loss_mask"][0].sum() == 12
        assert b["rejected_loss_mask"][0].sum() == 6  # "rrrrr<|im_end|>"


# ---- RL ---------------------------------------------------------------------------------


def test_rl_batch_fields(tmp_path, any_tok):
    rows = [RL_GOOD, {**RL_GOOD, "prompt": "3+3=", "reward_model": {"ground_truth": ["6", "six"]},
                      "extra_info": None, "tools": TOOLS}]
    b = first_batch(tmp_path, rows, any_tok, format="rl", max_prompt_length=512, max_length=1024)
    assert set(b) == {"prompt_ids", "raw_prompt", "data_source", "ground_truth", "reward_model",
                      "extra_info", "tools", "index"}
    assert b["ground_truth"] == ["4", ["6", "six"]]
    assert b["data_source"] == ["synthetic/arithmetic"] * 2
    assert b["extra_info"] == [{"index": 0}, {}]
    assert b["index"] == [0, 1]
    assert b["tools"] == [None, TOOLS]
    assert b["raw_prompt"][1] == [{"role": "user", "content": "3+3="}]
    assert b["prompt_ids"][0] == full_ids(any_tok, RL_GOOD["prompt"], add_generation_prompt=True)
    assert b["prompt_ids"][1] == full_ids(any_tok, b["raw_prompt"][1], tools=TOOLS,
                                          add_generation_prompt=True)
    assert all(isinstance(t, int) for t in b["prompt_ids"][0])


def test_rl_parquet_nested_columns(tmp_path, char_tok):
    rows = [RL_GOOD, {**RL_GOOD, "extra_info": {"index": 1, "other": "x"}}]
    path = write_parquet(tmp_path / "rl.parquet", rows)
    cfg = DataConfig(train_files=[path], format="rl", shuffle=False, batch_size=2)
    b = next(make_dataset(cfg, char_tok, process_index=0, process_count=1))
    assert b["ground_truth"] == ["4", "4"]
    assert b["reward_model"][0] == {"style": "rule", "ground_truth": "4"}
    # Parquet unifies the struct ({"index", "other"}): the None it adds is dropped.
    assert b["extra_info"] == [{"index": 0}, {"index": 1, "other": "x"}]


def test_rl_prompt_truncation(tmp_path, char_tok):
    row = {**RL_GOOD, "prompt": "x" * 40}
    n = len(full_ids(char_tok, [{"role": "user", "content": "x" * 40}], add_generation_prompt=True))
    with pytest.raises(DataError, match=f"key 'prompt': prompt has {n} tokens, more than the limit of 16"):
        first_batch(tmp_path, [row], char_tok, format="rl", max_prompt_length=16)
    full = full_ids(char_tok, [{"role": "user", "content": "x" * 40}], add_generation_prompt=True)
    left = first_batch(tmp_path, [row], char_tok, format="rl", max_prompt_length=16, truncation="left")
    right = first_batch(tmp_path, [row], char_tok, format="rl", max_prompt_length=16, truncation="right")
    assert left["prompt_ids"][0] == full[-16:]
    assert right["prompt_ids"][0] == full[:16]
