"""Episodes as token ids, with the real SmolLM2 tokenizer and chat template (fetched once, as the real-model test)."""

import pytest

from cuda_agent.agent.tools import SCHEMAS
from cuda_agent.llm import with_text_tools
from cuda_agent.rl.tokens import TurnTokenizer


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2)


def test_an_episode_becomes_ids_turn_by_turn_and_the_mask_covers_exactly_the_model_s_tokens(tokenizer):
    tok = tokenizer
    turns = TurnTokenizer(tok, SCHEMAS, tool_format="text")
    opening = [{"role": "system", "content": "Be fast."}, {"role": "user", "content": "Optimise model.py."}]
    trajectory = turns.start(opening)
    assert trajectory.ids == turns.start(opening).ids and trajectory.response == []

    first = 'Reading.\n<tool_call>{"name": "read_file", "arguments": {"path": "model.py"}}</tool_call>'
    first_ids = [i for ch in first for i in tok.encode(ch, add_special_tokens=False)]  # not how encode() splits it
    assert first_ids != tok.encode(first, add_special_tokens=False)
    turns.model_turn(trajectory, first_ids + [turns.end_of_turn], [-0.5] * (len(first_ids) + 1))
    turns.observations(trajectory, [{"role": "tool", "tool_call_id": "a", "content": "import torch\n"}])
    second = "I will now write a very long"  # cut off at max_tokens: no end-of-turn token sampled
    second_ids = tok.encode(second, add_special_tokens=False)
    turns.model_turn(trajectory, second_ids)
    turns.observations(trajectory, [{"role": "user", "content": "No tool was called."}])
    third = "Done."
    third_ids = tok.encode(third, add_special_tokens=False) + [turns.end_of_turn]
    turns.model_turn(trajectory, third_ids)

    conversation = opening + [{"role": "assistant", "content": first},
                              {"role": "tool", "tool_call_id": "a", "content": "import torch\n"},
                              {"role": "assistant", "content": second},
                              {"role": "user", "content": "No tool was called."},
                              {"role": "assistant", "content": third}]
    rendered = tok.apply_chat_template(with_text_tools(conversation, SCHEMAS), tokenize=False)
    assert tok.decode(trajectory.ids) + "\n" == rendered  # the template's "\n" after the last turn is not sampled
    response, mask = trajectory.response, trajectory.mask
    assert len(response) == len(mask) == len(trajectory.logprobs)
    sampled = [i for i, m in zip(response, mask) if m]
    assert sampled == first_ids + [turns.end_of_turn] + second_ids + third_ids  # exactly as sampled, in order
    assert trajectory.logprobs[:len(first_ids) + 1] == [-0.5] * (len(first_ids) + 1)
    assert tok.decode([i for i, m in zip(response, mask) if not m]).count("<tool_response>") == 1
