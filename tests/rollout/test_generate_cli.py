"""`rljax generate` end to end on a tiny checkpoint with a word-level tokenizer built
offline (chat template included)."""

from tokenizers import Tokenizer, models, pre_tokenizers
import pytest
from transformers import PreTrainedTokenizerFast

from rljax.cli import main

from .conftest import VOCAB, build_hf

SPECIAL = ["<unk>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


def save_tokenizer(path) -> PreTrainedTokenizerFast:
    words = SPECIAL + ["user", "assistant", "system"] + [f"w{i}" for i in range(VOCAB - len(SPECIAL) - 3)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<|im_end|>",
                                   chat_template=TEMPLATE)
    fast.save_pretrained(path)
    return fast


@pytest.mark.slow
def test_generate_command(tmp_path, capsys):
    build_hf("llama", tmp_path)
    save_tokenizer(tmp_path)
    code = main(["generate", "--model", str(tmp_path), "--prompt", "w1 w2 w3", "--max-tokens", "5",
                 "--temperature", "0.8", "--n", "2", "--show-tokens", "--page-size", "8"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.count("--- prompt 0 sample") == 2
    assert "finish=" in out and "token_ids:" in out and "log_probs:" in out
