"""Chat clients that drive the agent: any OpenAI-compatible endpoint, or a scripted replay.

Both return a `Reply`: the assistant message as it goes into the conversation, its tool calls and the token usage
the endpoint reported. Models that write tool calls as text (Hermes-style `<tool_call>{"name": ..., "arguments":
...}</tool_call>`) are understood too; for servers whose chat template ignores `tools` (small models, base models)
`tool_format="text"` describes the tools in the system message instead and sends tool results back as text.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

TOOL_CALL_OPEN = re.compile(r"<tool_call>\s*(?:```(?:json)?\s*)?")
FENCED = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


TOOL_FORMATS = ("native", "text")
TEXT_TOOLS = """# Tools

You work by calling tools. Their JSON schemas:
<tools>
{schemas}
</tools>

To call a tool, write one JSON object with its name and arguments between tags, for example:
<tool_call>{example}</tool_call>
Each result comes back to you between <tool_response> tags."""


class LLMError(RuntimeError):
    """The endpoint could not be reached or answered with an error (after retries)."""


class ContextFull(LLMError):
    """The conversation no longer leaves the model room for a reply (the last tool result filled it): the episode
    ends at its context limit, as when a reply fills it."""


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
    finish_reason: str | None = None  # "length": cut off at max_tokens
    malformed: list[str] = field(default_factory=list)  # why `<tool_call>` blocks written as text did not parse

    def message(self) -> dict[str, Any]:
        """The assistant message for the conversation (tool calls in the API's format)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.name, "arguments": c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments)}}
                for c in self.tool_calls]
        return msg


def _as_call(data: Any) -> ToolCall | None:
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    arguments = data.get("arguments", data.get("parameters")) or {}  # Llama-style models say "parameters"
    return ToolCall(f"call_{uuid.uuid4().hex[:12]}", data["name"], arguments)


def parse_text_tool_calls(content: str, malformed: list[str] | None = None) -> list[ToolCall]:
    """Tool calls a model wrote into its text: `<tool_call>{json}</tool_call>` blocks (the closing tag may be missing,
    the JSON may sit in a ```json fence), or a reply that is nothing but one such JSON object. Why a block did not
    parse is appended to `malformed`."""
    content = content or ""
    decoder, calls = json.JSONDecoder(), []
    for n, match in enumerate(TOOL_CALL_OPEN.finditer(content), 1):
        try:
            data, _ = decoder.raw_decode(content, match.end())
        except json.JSONDecodeError as exc:
            if malformed is not None:
                malformed.append(f"<tool_call> block {n}: invalid JSON ({exc.msg}, {exc.pos - match.end()} characters "
                                 f"in: {content[exc.pos:exc.pos + 40]!r})")
            continue
        except RecursionError:  # nested deeper than the interpreter's limit (~1,000 brackets): not a call
            if malformed is not None:
                malformed.append(f"<tool_call> block {n}: invalid JSON (nested too deeply)")
            continue
        if call := _as_call(data):
            calls.append(call)
        elif malformed is not None:
            malformed.append(f"<tool_call> block {n}: not an object with a \"name\" string and \"arguments\"")
    if not calls and "<tool_call>" not in content:
        bare = content.strip()
        fenced = FENCED.match(bare)
        try:
            call = _as_call(json.loads(fenced.group(1) if fenced else bare))
        except (json.JSONDecodeError, RecursionError):
            call = None
        if call and ("arguments" in bare or "parameters" in bare):
            calls.append(call)
    return calls


def assistant_text(msg: dict) -> str:
    """An assistant message as a text-tools model writes it: its content, then its native tool calls (if any, and
    not already in the content) as `<tool_call>` text."""
    text = msg.get("content") or ""
    calls = msg.get("tool_calls") or []
    if calls and "<tool_call>" not in text:
        text += "".join(f"\n<tool_call>\n{json.dumps({'name': c['function']['name'], 'arguments': _arguments(c)})}"
                        "\n</tool_call>" for c in calls)
    return text


def _arguments(call: dict) -> Any:
    arguments = call["function"].get("arguments") or {}
    try:
        return json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        return arguments


def with_text_tools(messages: list[dict], tools: list[dict]) -> list[dict]:
    """The conversation for a server that cannot take `tools`: the schemas and the call syntax in the system
    message, the assistant's tool calls as the text it wrote, tool results as `<tool_response>` user turns."""
    first = tools[0].get("function", tools[0])
    example = {"name": first.get("name", "name"),
               "arguments": {k: "..." for k in first.get("parameters", {}).get("required", [])}}
    spec = TEXT_TOOLS.format(schemas="\n".join(json.dumps(t.get("function", t)) for t in tools),
                             example=json.dumps(example))
    out: list[dict] = []
    if not messages or messages[0].get("role") != "system":
        out.append({"role": "system", "content": spec})
    for msg in messages:
        role = msg.get("role")
        if role == "system" and not out:
            out.append({"role": "system", "content": f"{msg.get('content') or ''}\n\n{spec}"})
        elif role == "tool":
            text = f"<tool_response>\n{msg.get('content') or ''}\n</tool_response>"
            if out and out[-1].get("tool_responses"):  # several results of one turn: one user message
                out[-1]["content"] += "\n" + text
            else:
                out.append({"role": "user", "content": text, "tool_responses": True})
        elif role == "assistant":
            out.append({"role": "assistant", "content": assistant_text(msg)})
        else:
            out.append(dict(msg))
    return [{k: v for k, v in m.items() if k != "tool_responses"} for m in out]


def reply_from(content: str | None, tool_calls: list[ToolCall], usage: dict[str, int],
                finish_reason: str | None = None) -> Reply:
    content = content or ""
    malformed: list[str] = []
    if not tool_calls:
        tool_calls = parse_text_tool_calls(content, malformed)
    return Reply(content, tool_calls, usage, finish_reason, malformed)


def context_exceeded(exc: Exception) -> bool:
    """The endpoint refused the conversation as longer than its model's context: a 400 with OpenAI's code, or
    vLLM's ("maximum context length") or SGLang's ("longer than the model's context length") words."""
    if getattr(exc, "status_code", None) != 400:
        return False
    text = str(exc).lower()
    return (getattr(exc, "code", None) == "context_length_exceeded" or "maximum context length" in text
            or "context length" in text and "longer than" in text)


TEMPERATURE, MAX_TOKENS = 1.0, 16384  # the agent's sampling unless told otherwise (the command line's defaults too)


class ChatClient(Protocol):
    """What the agent loop asks of a model: its name, and one reply to a conversation (with the tools' schemas, or
    None in single-turn mode). `OpenAIClient`, `ScriptedClient` and the RL rollout's `PolicyClient` are ones."""
    model: str

    def complete(self, messages: list[dict], tools: list[dict] | None) -> Reply: ...


class OpenAIClient:
    """Chat completions through the `openai` SDK (vLLM, SGLang, hosted APIs): retries with backoff, timeouts."""

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None,
                 temperature: float = TEMPERATURE, top_p: float | None = None, max_tokens: int | None = MAX_TOKENS,
                 timeout: float = 600.0, max_retries: int = 5, extra_body: dict | None = None,
                 tool_format: str = "native"):
        import openai

        if tool_format not in TOOL_FORMATS:
            raise ValueError(f"tool_format must be one of {', '.join(TOOL_FORMATS)}, not {tool_format!r}")
        self.tool_format = tool_format

        key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"  # local servers accept any key
        self.model, self.temperature, self.top_p, self.max_tokens = model, temperature, top_p, max_tokens
        self.extra_body = extra_body or {}
        self.client = openai.OpenAI(base_url=base_url, api_key=key, timeout=timeout, max_retries=max_retries)
        self._errors = (openai.APIError, openai.APIConnectionError, openai.APITimeoutError)
        self._server_error = openai.InternalServerError

    def check(self) -> None:
        """Reach the endpoint once (GET /models) so that a wrong URL or key is one clear error up front. A server
        error there is no reason to stop (`transformers serve` fails to list a model it serves from a folder)."""
        try:
            self.client.with_options(max_retries=1).models.list()
        except self._server_error:
            pass
        except self._errors as exc:
            raise LLMError(f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}") from exc

    def complete(self, messages: list[dict], tools: list[dict] | None) -> Reply:
        kwargs: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": self.temperature}
        if tools and self.tool_format == "text":
            kwargs["messages"] = with_text_tools(messages, tools)
        elif tools:
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
            error = ContextFull if context_exceeded(exc) else LLMError
            raise error(f"{type(exc).__name__} from {base}: {str(exc).splitlines()[0][:300]}") from exc
        if not response.choices:
            raise LLMError("the endpoint returned no choices")
        msg = response.choices[0].message
        calls = [ToolCall(c.id or f"call_{uuid.uuid4().hex[:12]}", c.function.name, c.function.arguments or "{}")
                 for c in (msg.tool_calls or []) if getattr(c, "function", None)]
        usage = response.usage.model_dump() if response.usage else {}
        return reply_from(msg.content, calls, {k: int(v) for k, v in usage.items() if isinstance(v, int)},
                           response.choices[0].finish_reason)


class ScriptedClient:
    """Replays saved assistant messages in order (tests; re-running a trajectory)."""
    model = "scripted"

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
        return reply_from(msg.get("content"), calls, {})
