"""`rljax generate --model HF_DIR --prompt "..."`: a quick look at what a checkpoint says.

The prompt goes through the tokenizer's chat template (unless --raw), the rljax sampler
generates token ids, and the tokenizer decodes them for printing; the sampler itself
never sees a string.
"""

from __future__ import annotations

import json
import os

HELP = "Generate from a local Hugging Face checkpoint with the rljax sampler."


def add_arguments(p) -> None:
    p.add_argument("--model", required=True, help="local Hugging Face folder (config, weights, tokenizer)")
    p.add_argument("--prompt", required=True, action="append", help="user message (repeat for several prompts)")
    p.add_argument("--system", default=None, help="optional system message")
    p.add_argument("--raw", action="store_true", help="tokenize the prompt as is, no chat template")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("-n", "--n", type=int, default=1, help="samples per prompt")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--dtype", default="float32", help="parameter and compute dtype")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--attention", default="auto", choices=["auto", "reference", "blocked", "pallas", "pallas_tpu"])
    p.add_argument("--show-tokens", action="store_true", help="also print token ids and log_probs")


def _generation_eos(path: str) -> list[int]:
    """EOS ids from generation_config.json (chat models often list more there)."""
    f = os.path.join(path, "generation_config.json")
    if not os.path.exists(f):
        return []
    with open(f) as fh:
        eos = json.load(fh).get("eos_token_id")
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)


def _encode(tokenizer, prompt: str, system: str | None, raw: bool) -> list[int]:
    if raw or not getattr(tokenizer, "chat_template", None):
        return list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _check_length(path: str, prompts: list[list[int]], max_tokens: int) -> None:
    """Prompt + --max-tokens must fit in the model's max_position_embeddings: past it the
    rotary positions are ones the model never saw and the output is noise."""
    from rljax.models.hf import read_config

    limit = read_config(path).max_position_embeddings
    longest = max(range(len(prompts)), key=lambda i: len(prompts[i]))
    length = len(prompts[longest])
    if length + max_tokens > limit:
        raise SystemExit(
            f"rljax generate: prompt {longest} has {length} tokens + --max-tokens {max_tokens} = "
            f"{length + max_tokens} > max_position_embeddings={limit} of {os.path.join(path, 'config.json')}; "
            f"lower --max-tokens (at most {max(limit - length, 0)}) or shorten the prompt"
        )


def check_model_folder(path: str) -> None:
    """One line naming `--model` when it is neither a Hugging Face model folder nor a GGUF file."""
    from rljax.models.gguf import is_gguf

    if not os.path.exists(path):
        raise FileNotFoundError(f"--model {path}: no such model folder")
    if is_gguf(path) and os.path.isfile(path):  # weights, config and tokenizer in one file
        return
    if not os.path.isdir(path):
        raise ValueError(f"--model {path}: not a folder (a Hugging Face model folder holds config.json, "
                         "safetensors and the tokenizer)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"--model {path}: not a Hugging Face model folder (no config.json); "
                                "`rljax export RUN --out DIR` writes one from a run")


def main(args) -> int:
    from rljax.data.tokenizer import load_hf_tokenizer
    from rljax.models import load_hf
    from rljax.rollout import KVCacheConfig, Sampler, SamplerConfig, SamplingParams

    check_model_folder(args.model)
    tokenizer = load_hf_tokenizer(args.model)
    prompts = [_encode(tokenizer, p, args.system, args.raw) for p in args.prompt]
    _check_length(args.model, prompts, args.max_tokens)
    model = load_hf(args.model, dtype=args.dtype)
    stop = set(_generation_eos(args.model))
    if tokenizer.eos_token_id is not None:
        stop.add(int(tokenizer.eos_token_id))
    longest = max(len(p) for p in prompts) + args.max_tokens
    max_len = -(-longest // args.page_size) * args.page_size
    num_seqs = len(prompts) * args.n
    config = SamplerConfig(
        max_num_seqs=num_seqs,
        max_num_batched_tokens=max(64, min(2048, max(len(p) for p in prompts))),
        max_model_len=max_len,
        kv_cache=KVCacheConfig(page_size=args.page_size, num_pages=num_seqs * (max_len // args.page_size) + 1),
        attention=args.attention,
        batch_buckets=(num_seqs,),
    )
    params = SamplingParams(
        n=args.n, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
        max_tokens=args.max_tokens, stop_token_ids=tuple(sorted(stop)) if not args.ignore_eos else (),
        ignore_eos=args.ignore_eos, seed=args.seed,
    )
    with Sampler(model, config) as sampler:
        completions = sampler.generate(prompts, params)
    for c in completions:
        header = f"--- prompt {c.request_index}" + (f" sample {c.sample_index}" if args.n > 1 else "")
        mean_lp = sum(c.log_probs) / max(len(c.log_probs), 1)
        print(f"{header} ({len(c.token_ids)} tokens, finish={c.finish_reason}, mean log_prob={mean_lp:.3f})")
        print(tokenizer.decode(c.token_ids, skip_special_tokens=True))
        if args.show_tokens:
            print("token_ids:", c.token_ids)
            print("log_probs:", [round(x, 4) for x in c.log_probs])
    return 0
