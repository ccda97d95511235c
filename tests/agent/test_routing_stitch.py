"""Routing replay for agent trajectories: `stitch_routing` on hand-built turn records, and
the loop keeping each turn's record (`TurnOutput.expert_ids`) for the trajectory."""

import asyncio

import numpy as np
import pytest

from rljax.agent.loop import AgentLoop, Episode
from rljax.agent.protocol import TurnOutput
from rljax.agent.trajectory import TrajectoryBuilder, TurnRouting, stitch_routing

L, K = 2, 2


def record(values):
    """``[n, L, k]`` with every entry of position t equal to values[t] (-1: not computed)."""
    return np.repeat(np.asarray(values, np.int32)[:, None, None], L, 1).repeat(K, 2)


def test_earliest_turn_with_a_record_wins():
    # prompt [1, 2, 3] -> turn 1 samples [10, 11] -> observation [20, 21] -> turn 2 samples [12, 13]
    tokens = [1, 2, 3, 10, 11, 20, 21, 12, 13]
    turn1 = TurnRouting([1, 2, 3, 10, 11], record([5, 5, 5, 6, -1]))  # decode never fed 11
    turn2 = TurnRouting(tokens, record([7, 7, 7, 7, 7, 7, 7, 8, -1]))  # prefill recomputed 0..6
    out = stitch_routing(tokens, [turn1, turn2])
    assert out.shape == (9, L, K) and out.dtype == np.int32
    # prompt and turn 1's tokens: turn 1's record; turn 1's last token (-1 there): turn 2's
    # prefill; the observation: turn 2's prefill; turn 2's tokens: its own, last one -1
    np.testing.assert_array_equal(out[:, 0, 0], [5, 5, 5, 6, 7, 7, 7, 8, -1])
    # call order decides, not which record is longer or later
    np.testing.assert_array_equal(stitch_routing(tokens, [turn2, turn1])[:, 0, 0], [7] * 7 + [8, -1])


def test_positions_nobody_computed_stay_unrecorded():
    tokens = [1, 2, 3, 10, 11, 20, 21, 12, 13]
    only_first = stitch_routing(tokens, [TurnRouting([1, 2, 3, 10, 11], record([5, 5, 5, 6, -1]))])
    np.testing.assert_array_equal(only_first[:, 1, 1], [5, 5, 5, 6, -1, -1, -1, -1, -1])
    # a position with a partial record (some layer -1) does not count as recorded
    partial = record([5, 5, 5])
    partial[1, 1, 0] = -1
    later = TurnRouting([1, 2, 3], record([9, 9, 9]))
    np.testing.assert_array_equal(stitch_routing([1, 2, 3], [TurnRouting([1, 2, 3], partial), later])[:, 0, 0],
                                  [5, 9, 5])


def test_misaligned_turns_are_errors():
    tokens = [1, 2, 3, 10, 11, 20, 21, 12, 13]
    with pytest.raises(ValueError, match=r"turn 1: .*not a prefix.*position 2"):
        stitch_routing(tokens, [TurnRouting([1, 2], record([5, 5])),
                                TurnRouting([1, 2, 4, 10], record([5, 5, 5, 5]))])  # re-tokenized prompt
    with pytest.raises(ValueError, match="turn 0: .*not a prefix"):
        stitch_routing([1, 2], [TurnRouting([1, 2, 3], record([5, 5, -1]))])  # longer than the trajectory
    with pytest.raises(ValueError, match=r"turn 0: routing record of shape \(2, 2, 2\) for 3 tokens"):
        stitch_routing(tokens, [TurnRouting([1, 2, 3], record([5, 5]))])


def test_builder_stitches_at_build():
    buf = TrajectoryBuilder([1, 2, 3])
    assert buf.build().expert_ids is None  # nothing recorded (dense model, replay off)
    buf.append_sampled([10, 11], [-0.1, -0.2])
    buf.record_routing([1, 2, 3], [10, 11], record([5, 5, 5, 6, -1]))
    buf.append_observation([20])
    traj = buf.build()
    np.testing.assert_array_equal(traj.expert_ids[:, 0, 0], [5, 5, 5, 6, -1, -1])
    assert len(traj.expert_ids) == len(traj.input_ids)


class RecordingSampler:
    """Two scripted turns (a calculator call, then an answer) with fake routing records:
    position t of a turn's prompt + tokens is routed to t % 7 + 10 * turn, its last token -1."""

    def __init__(self, tok):
        self.tok, self.turn = tok, 0

    async def generate_async(self, request):
        text = ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call><|im_end|>'
                if self.turn == 0 else "42<|im_end|>")
        ids = list(self.tok.encode(text, add_special_tokens=False))
        n = len(request.prompt_token_ids) + len(ids)
        experts = record([t % 7 + 10 * self.turn for t in range(n - 1)] + [-1])
        self.turn += 1
        return TurnOutput(ids, [-0.5] * len(ids), "stop", experts)


def test_loop_stitches_each_turns_record():
    from rljax.agent.tools.calculator import CalculatorTool
    from rljax.data.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    loop = AgentLoop(RecordingSampler(tok), tok, tools=[CalculatorTool()])
    (traj,) = asyncio.run(loop.run([Episode(messages=[{"role": "user", "content": "6*7="}])]))
    assert traj.num_turns == 2 and traj.tool_calls == 1
    first_end = len(traj.prompt_ids) + traj.segments[0].end  # prompt + turn 1's tokens
    n = len(traj.input_ids)
    want = [t % 7 for t in range(first_end - 1)] + [t % 7 + 10 for t in range(first_end - 1, n - 1)] + [-1]
    np.testing.assert_array_equal(traj.expert_ids[:, 1, 0], want)
