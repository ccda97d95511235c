"""The scripted stand-ins of `rljax bench agent` (default mode), which the agent tests reuse.

`ScriptedSampler` answers each request from a script after a fixed latency (overlapping
requests overlap, as in a continuously batched engine) and `run_benchmark` times episodes
with a sleeping tool, all in flight vs one at a time. Nothing here is used by the agent
loop itself. The tokenizer is trained on the spot with the
`tokenizers` library (byte-level BPE with Qwen's pre-tokenizer regex and ``<|im_start|>`` /
``<|im_end|>`` special tokens) and wrapped as a `transformers.PreTrainedTokenizerFast` with a
small Jinja chat template, so tests and benches run without any downloaded tokenizer:

- style ``"hermes"``: a Qwen2.5-like template (tools block, ``<tool_call>`` rendering of
  assistant ``tool_calls``, consecutive tool messages grouped in one user turn with
  ``<tool_response>`` blocks);
- style ``"think"``: the same, but like Qwen3 it drops ``<think>...</think>`` from assistant
  turns that come before the last user message when it renders a conversation.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rljax.agent.config import AgentConfig
from rljax.agent.loop import AgentLoop, Episode
from rljax.agent.protocol import TurnOutput, TurnRequest, get_param
from rljax.agent.tools.base import Tool, ToolResult

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_TEMPLATE_HEAD = r"""
{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- '# Tools\n<tools>' }}
{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}
{{- '\n</tools>\nCall a tool with <tool_call>{"name": ..., "arguments": ...}</tool_call>.<|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}
{%- for m in messages %}
{%- if m.role == 'system' and loop.first %}
{%- elif m.role == 'assistant' %}
{%- set content = m.content or '' %}
"""
_DROP_THINK = r"""
{%- if loop.index0 < ns.last_user and '</think>' in content %}
{%- set content = content.split('</think>')[-1].lstrip('\n') %}
{%- endif %}
"""
_TEMPLATE_TAIL = r"""
{{- '<|im_start|>assistant' }}
{%- if content %}{{- '\n' + content }}{%- endif %}
{%- for tc in (m.tool_calls or []) %}
{%- set f = tc.function if tc.function is defined else tc %}
{{- '\n<tool_call>\n{"name": "' + f.name + '", "arguments": ' + (f.arguments | tojson) + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif m.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + m.content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- else %}
{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""

_CORPUS = [
    "You are a helpful assistant. Use the tools when they help.",
    "What is 2+3? Compute (17 * 23) - 4 ** 2 and tell me the answer.",
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>',
    '<tool_call>\n{"name": "python", "arguments": {"code": "print(1 + 1)"}}\n</tool_call>',
    '<tool_response>\n5\n</tool_response> The answer is 5. The result is 42.',
    "<think>\nI should use the calculator first, then answer.\n</think>\n\nThe answer is 5.",
    '{"name": "get_weather", "parameters": {"city": "Paris"}} {"type": "function", "function"',
    '"description": "Evaluate an arithmetic expression", "parameters": {"type": "object", '
    '"properties": {"expression": {"type": "string"}}, "required": ["expression"]}}',
    "Error: unknown tool. invalid arguments, timed out, raised an exception, truncated.",
    "Try again. Guess a number between 1 and 100. Too low! Too high! Correct, well done.",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000 sleep seconds hello world Paris weather",
]


def build_tiny_chat_tokenizer(style: str = "hermes", save_dir: str | Path | None = None,
                              vocab_size: int = 600) -> Any:
    """Train a tiny byte-level BPE chat tokenizer (see module docstring).

    When `save_dir` is given the tokenizer is saved there with ``save_pretrained`` and loaded
    back, so it goes through the same code path as a downloaded Hugging Face tokenizer.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if style not in ("hermes", "think"):
        raise ValueError(f"style must be 'hermes' or 'think', got {style!r}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    template = _TEMPLATE_HEAD + (_DROP_THINK if style == "think" else "") + _TEMPLATE_TAIL
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        bos_token=None, unk_token=None,
    )
    fast.chat_template = template.strip()
    if save_dir is None:
        return fast
    fast.save_pretrained(str(save_dir))
    return AutoTokenizer.from_pretrained(str(save_dir))


def fake_log_prob(token_id: int, position: int) -> float:
    """A deterministic, token- and position-dependent negative 'log_prob' for fake samplers."""
    return -0.01 - ((token_id * 31 + position * 7) % 997) / 1000.0


Script = Sequence[Sequence[int]] | Callable[[int, TurnRequest], Sequence[int]]


class ScriptedSampler:
    """A fake `AsyncSampler` that answers from a script, per conversation.

    The script is a list of token sequences (turn k of every conversation gets ``script[k]``)
    or a function ``(turn_index, request) -> token ids``. The turn index of a request is found
    by matching its token buffer against earlier requests + completions, so many episodes can
    share one sampler. Honors ``max_tokens`` (cut + ``finish_reason="length"``); otherwise
    ``"stop"``. Logprobs come from `fake_log_prob`. With ``latency_s`` each request sleeps that
    long first, as a batched engine would (requests overlap when issued concurrently).
    """

    def __init__(self, script: Script, latency_s: float = 0.0):
        self.script = script
        self.latency_s = latency_s
        self.requests: list[TurnRequest] = []
        self.completions: list[TurnOutput] = []
        self.events: list[tuple[str, int]] = []  # ("start"|"end", request number)
        self._known: dict[int, dict[tuple[int, ...], int]] = {}  # length -> buffer -> turns
        self.in_flight = 0
        self.max_in_flight = 0

    def turn_index(self, prompt: Sequence[int]) -> int:
        """Turns already answered in this conversation: its longest known prefix's count."""
        for length in sorted(self._known, reverse=True):
            if length <= len(prompt):
                turn = self._known[length].get(tuple(prompt[:length]))
                if turn is not None:
                    return turn
        return 0

    async def generate_async(self, request: TurnRequest) -> TurnOutput:
        n = len(self.requests)
        self.requests.append(request)
        self.events.append(("start", n))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.latency_s:
                await asyncio.sleep(self.latency_s)
            prompt = list(request.prompt_token_ids)
            turn = self.turn_index(prompt)
            if callable(self.script):
                tokens = list(self.script(turn, request))
            else:
                if turn >= len(self.script):
                    raise IndexError(f"script has {len(self.script)} turns, turn {turn} requested")
                tokens = list(self.script[turn])
            max_tokens = get_param(request.sampling_params, "max_tokens")
            finish = "stop"
            if max_tokens is not None and len(tokens) > max_tokens:
                tokens, finish = tokens[:max_tokens], "length"
            log_probs = [fake_log_prob(t, len(prompt) + i) for i, t in enumerate(tokens)]
            key = tuple(prompt + tokens)
            self._known.setdefault(len(key), {})[key] = turn + 1
            completion = TurnOutput(tokens, log_probs, finish)
            self.completions.append(completion)
            return completion
        finally:
            self.in_flight -= 1
            self.events.append(("end", n))


class _SleepTool(Tool):
    default_schema = {
        "type": "function",
        "function": {"name": "sleep", "description": "Wait.",
                     "parameters": {"type": "object", "properties": {"seconds": {"type": "number"}},
                                    "required": ["seconds"]}},
    }

    async def call(self, arguments: dict[str, Any], state: Any) -> ToolResult:
        await asyncio.sleep(float(arguments["seconds"]))
        return ToolResult("ok")


def run_benchmark(num_episodes: int = 64, turns: int = 3, sampler_latency_s: float = 0.05,
                  tool_latency_s: float = 0.05, tokenizer: Any = None) -> dict[str, float]:
    """Run the benchmark and return throughput figures (episodes/s) and the speedup."""
    tok = tokenizer if tokenizer is not None else build_tiny_chat_tokenizer("hermes")
    call = ('<tool_call>\n{"name": "sleep", "arguments": {"seconds": ' + repr(tool_latency_s)
            + '}}\n</tool_call><|im_end|>')
    script = [tok.encode(call, add_special_tokens=False)] * (turns - 1)
    script.append(tok.encode("The answer is 42.<|im_end|>", add_special_tokens=False))
    cfg = AgentConfig(max_turns=turns, max_response_tokens=8192)
    episodes = [Episode(messages=[{"role": "user", "content": f"Task number {i}."}])
                for i in range(num_episodes)]

    def once(max_concurrency: int | None) -> tuple[float, ScriptedSampler]:
        sampler = ScriptedSampler(script, latency_s=sampler_latency_s)
        loop = AgentLoop(sampler, tok, cfg, tools=[_SleepTool()])
        t0 = time.perf_counter()
        trajs = asyncio.run(loop.run(episodes, max_concurrency=max_concurrency))
        elapsed = time.perf_counter() - t0
        assert all(t.num_turns == turns and t.termination == "stop" for t in trajs)
        return elapsed, sampler

    concurrent_s, sampler = once(None)
    sequential_s, _ = once(1)
    return {
        "num_episodes": num_episodes,
        "turns": turns,
        "sampler_latency_s": sampler_latency_s,
        "tool_latency_s": tool_latency_s,
        "concurrent_s": concurrent_s,
        "sequential_s": sequential_s,
        "concurrent_episodes_per_s": num_episodes / concurrent_s,
        "sequential_episodes_per_s": num_episodes / sequential_s,
        "speedup": sequential_s / concurrent_s,
        "max_requests_in_flight": sampler.max_in_flight,
    }
