"""Chat clients that drive the agent: any OpenAI-compatible endpoint, or a scripted replay.

Both return a `Reply`: the assistant message as it goes into the conversation, its tool calls and the token usage
the endpoint reported. Models that write tool calls as text (Hermes-style `<tool_call>{"name": ..., "arguments":
...}</tool_call>`) are understood too.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_TEXT = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


class LLMError(RuntimeError):
    """The endpoint could not be reached or answered with an error (after retries)."""


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: Any  # JSON string from the API, or a dict parsed from text


@dataclass
class Reply:
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)  # prompt_tokens, completion_tokens, total_tokens

    def message(self) -> dict[str, Any]:
        """The assistant message for the conversation (tool calls in the API's format)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.name, "arguments": c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments)}}
                for c in self.tool_calls]
        return msg


def parse_text_tool_calls(content: str) -> list[ToolCall]:
    """Tool calls a model wrote into its text as `<tool_call>{json}</tool_call>` blocks."""
    calls = []
    for match in TOOL_CALL_TEXT.finditer(content or ""):
        try:
            data = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict) and isinstance(data.get("name"), str):
            calls.append(ToolCall(f"call_{uuid.uuid4().hex[:12]}", data["name"], data.get("arguments") or {}))
    return calls


def _reply_from(content: str | None, tool_calls: list[ToolCall], usage: dict[str, int]) -> Reply:
    content = content or ""
    if not tool_calls:
        tool_calls = parse_text_tool_calls(content)
    return Reply(content, tool_calls, usage)


class OpenAIClient:
    """Chat completions through the `openai` SDK (vLLM, SGLang, hosted APIs): retries with backoff, timeouts."""

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None,
                 temperature: float = 1.0, top_p: float | None = None, max_tokens: int | None = 16384,
                 timeout: float = 600.0, max_retries: int = 5, extra_body: dict | None = None):
        import openai

        key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"  # local servers accept any key
        self.model, self.temperature, self.top_p, self.max_tokens = model, temperature, top_p, max_tokens
        self.extra_body = extra_body or {}
        self.client = openai.OpenAI(base_url=base_url, api_key=key, timeout=timeout, max_retries=max_retries)
        self._errors = (openai.APIError, openai.APIConnectionError, openai.APITimeoutError)

    def check(self) -> None:
        """Reach the endpoint once (GET /models) so that a wrong URL or key is one clear error up front."""
        try:
            self.client.with_options(max_retries=1).models.list()
        except self._errors as exc:
            raise LLMError(f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}") from exc

    def complete(self, messages: list[dict], tools: list[dict] | None) -> Reply:
        kwargs: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": self.temperature}
        if tools:
            kwargs["tools"] = tools
        if self.top_p is not None:
            kwargs["top_p"] = self.top_p
        if self.max_tokens:
            kwargs["max_tokens"] = self.max_tokens
        if self.extra_body:
            kwargs["extra_body"] = self.extra_body
        try:
            response = self.client.chat.completions.create(**kwargs)
        except self._errors as exc:
            base = getattr(self.client, "base_url", "")
            raise LLMError(f"{type(exc).__name__} from {base}: {str(exc).splitlines()[0][:300]}") from exc
        if not response.choices:
            raise LLMError("the endpoint returned no choices")
        msg = response.choices[0].message
        calls = [ToolCall(c.id or f"call_{uuid.uuid4().hex[:12]}", c.function.name, c.function.arguments or "{}")
                 for c in (msg.tool_calls or []) if getattr(c, "function", None)]
        usage = response.usage.model_dump() if response.usage else {}
        return _reply_from(msg.content, calls, {k: int(v) for k, v in usage.items() if isinstance(v, int)})


class ScriptedClient:
    """Replays saved assistant messages in order (tests; re-running a trajectory)."""

    def __init__(self, messages: list[dict[str, Any]]):
        self.messages = list(messages)
        self.calls = 0

    @classmethod
    def from_trajectory(cls, path: str) -> ScriptedClient:
        """The assistant messages of a trajectory.jsonl written by the loop."""
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
        return cls([r["message"] for r in records if r.get("type") == "assistant"])

    def complete(self, messages: list[dict], tools: list[dict] | None) -> Reply:
        if self.calls >= len(self.messages):
            raise LLMError("the script has no more replies")
        msg = self.messages[self.calls]
        self.calls += 1
        calls = [ToolCall(c.get("id") or f"call_{self.calls}_{i}", c["function"]["name"], c["function"]["arguments"])
                 for i, c in enumerate(msg.get("tool_calls") or [])]
        return _reply_from(msg.get("content"), calls, {})
