"""Episodes as token ids for training, built turn by turn and never re-tokenized.

The prompt is the chat template of the opening messages; each model turn is appended as the ids the model sampled
(mask 1); each batch of tool results is appended as the template's own rendering of those messages, cut out of a
fixed dummy conversation (mask 0). Re-applying the template to the whole conversation instead would re-tokenize
what the model sampled and drift at turn boundaries, and PPO's log-probs would no longer be of the tokens it took.
With `tool_format="text"` (templates without tools) the conversation is rendered as `llm.with_text_tools` sends
it to a server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..llm import assistant_text, with_text_tools

SENTINEL = "SENTINEL"


def render_ids(tokenizer: Any, messages: list[dict], generation_prompt: bool, **template_kwargs) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=True,
                                        return_dict=True, **template_kwargs)["input_ids"]
    return list(ids)


@dataclass
class TokenTrajectory:
    """One episode: `ids` = prompt + response; over the response, `mask` 1 on sampled tokens, `logprobs` theirs
    (0 on template tokens)."""
    ids: list[int]
    prompt_length: int
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    @property
    def response(self) -> list[int]:
        return self.ids[self.prompt_length:]

    def add(self, ids: list[int], sampled: bool, logprobs: list[float] | None = None) -> None:
        self.ids += ids
        self.mask += [int(sampled)] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)


class TurnTokenizer:
    """Turns an episode's messages into a TokenTrajectory with one tokenizer and chat template."""

    def __init__(self, tokenizer: Any, tools: list[dict] | None = None, tool_format: str = "text",
                 template_kwargs: dict | None = None):
        """`template_kwargs`: more arguments of the chat template (verl's `apply_chat_template_kwargs`)."""
        self.tokenizer, self.tools = tokenizer, tools
        self.template_kwargs = dict(template_kwargs or {})
        self.text_tools = bool(tools) and tool_format == "text"
        prefix = [{"role": "user", "content": "x"}, {"role": "assistant", "content": SENTINEL}]
        rendered = render_ids(tokenizer, self._view(prefix), False, **self.template_kwargs)
        sentinel = tokenizer.encode(SENTINEL, add_special_tokens=False)
        at = _find_last(rendered, sentinel)
        if at < 0 or at + len(sentinel) >= len(rendered):
            raise ValueError("the chat template does not end an assistant turn with a token of its own")
        self.end_of_turn = rendered[at + len(sentinel)]  # what closes a model turn (<|im_end|>, <|eot_id|>, ...)
        self._prefix, self._base = prefix, rendered[:at + len(sentinel) + 1]  # up to the end of the dummy turn

    def _view(self, messages: list[dict]) -> list[dict]:
        return with_text_tools(messages, self.tools) if self.text_tools else messages

    def start(self, opening: list[dict]) -> TokenTrajectory:
        """The prompt: the opening messages and the generation prompt of the first model turn."""
        ids = render_ids(self.tokenizer, self._view(opening), True, **self.template_kwargs)
        return TokenTrajectory(ids, len(ids))

    def model_turn(self, trajectory: TokenTrajectory, ids: list[int], logprobs: list[float] | None = None) -> None:
        """Append what the model sampled; a turn cut off before its end-of-turn token gets one (mask 0)."""
        trajectory.add(list(ids), True, logprobs)
        if not ids or ids[-1] != self.end_of_turn:
            trajectory.add([self.end_of_turn], False)

    def observations(self, trajectory: TokenTrajectory, messages: list[dict]) -> None:
        """Append the template's rendering of the messages after a model turn (tool results, nudges), up to the
        generation prompt of the next model turn."""
        full = render_ids(self.tokenizer, self._view(self._prefix + messages), True, **self.template_kwargs)
        if full[:len(self._base)] != self._base:
            raise ValueError("the chat template renders earlier turns differently once more follow")
        trajectory.add(full[len(self._base):], False)


def conversation_ids(turns: TurnTokenizer, messages: list[dict], context_turns: int = 0) -> TokenTrajectory:
    """A saved conversation as ids with the model's turns masked 1 (their text tokenized once: in SFT nothing was
    sampled, so there are no ids to keep), but for its first `context_turns` model turns: context, masked 0."""
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if first is None:
        raise ValueError("the conversation has no model turn")
    trajectory = turns.start(messages[:first])
    pending: list[dict] = []
    for msg in messages[first:]:
        if msg["role"] != "assistant":
            pending.append(msg)
            continue
        if pending:
            turns.observations(trajectory, pending)
            pending = []
        text = assistant_text(msg)  # an endpoint's native calls: as a text-tools model writes them
        ids = turns.tokenizer.encode(text, add_special_tokens=False) + [turns.end_of_turn]
        if context_turns > 0:
            trajectory.add(ids, False)
            context_turns -= 1
        else:
            turns.model_turn(trajectory, ids)
    return trajectory


def _find_last(seq: list[int], sub: list[int]) -> int:
    for i in range(len(seq) - len(sub), -1, -1):
        if seq[i:i + len(sub)] == sub:
            return i
    return -1
