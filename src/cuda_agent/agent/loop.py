"""The agent loop (ReAct): ask the model, run its tool calls, feed back the observations, until it finishes or a
limit is hit. Every message, tool call, observation and verdict is appended to `trajectory.jsonl` as it happens
(a crash loses nothing); each record's `message` is in the chat-completions format, so the records in order are
the conversation an SFT/RFT trainer consumes.

Single-turn mode (the paper's "without agent loop" ablation) asks for the files in one reply, writes them and
judges them once, through the same environment.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from .config import LoopConfig
from .environment import Environment, StepResult
from ..llm import ChatClient, ContextFull, LLMError, Reply
from .summary import EpisodeSummary, LoopState, Stop
from .tools import ToolError, clip, parse_arguments

NUDGE = "No tool was called. Use the tools to work on the task, and call `finish` when you are done."
MALFORMED = ("Your tool call could not be read: {errors}. Write each call as <tool_call>{{\"name\": \"TOOL\", "
             "\"arguments\": {{...}}}}</tool_call> with valid JSON (strings escaped: \\n for a newline, \\\" for "
             "a quote).")
SINGLE_TURN = """Answer in one reply, without tools: give every file of your solution (model_new.py and the \
files under kernels/) as a heading `### FILE: <path>` followed by one fenced code block with its whole content."""
FILE_BLOCK = re.compile(r"^#+\s*FILE:\s*(\S+)\s*\n```[^\n]*\n(.*?)\n```", re.MULTILINE | re.DOTALL)


class Trajectory:
    """Appends one JSON record per line, flushed immediately."""

    def __init__(self, path: Path):
        self.path = path
        self.file = open(path, "w")
        self.start = time.monotonic()

    def write(self, kind: str, **record: Any) -> None:
        record = {"type": kind, "t": round(time.monotonic() - self.start, 3), **record}
        self.file.write(json.dumps(record, default=str) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def context_tokens(reply: Reply, messages: list[dict]) -> int:
    """The conversation's size: the endpoint's count when it reports usage, else ~4 characters per token."""
    if reply.usage.get("total_tokens"):
        return reply.usage["total_tokens"]
    return sum(len(json.dumps(m)) for m in messages) // 4


def malformed_call(errors: list[str]) -> str:
    """What the model is told when it wrote a tool call that does not parse (not that it called none)."""
    return MALFORMED.format(errors="; ".join(errors[:3])[:1000])


def parse_files(text: str) -> dict[str, str]:
    return {path: body + "\n" for path, body in FILE_BLOCK.findall(text or "")}


class ReplyCut(TimeoutError):
    """A client's reply cut by its caller's clock (a time-limited batch sampler): the episode is dropped."""


def run_episode(env: Environment, client: ChatClient, reference: str | Path, run_dir: Path, config: LoopConfig,
                progress: Callable[[LoopState], None] = lambda state: None) -> EpisodeSummary:
    """Play one episode; returns the summary (also written to run_dir/summary.json)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    opening = env.reset(reference)
    messages, tools = opening["messages"], opening["tools"]
    traj = Trajectory(run_dir / "trajectory.jsonl")
    for msg in messages:
        traj.write(msg["role"], message=msg)
    state = LoopState()
    try:
        if config.single_turn:
            _single_turn(env, client, messages, traj, state)
        else:
            _loop(env, client, messages, tools, traj, state, config, progress)
    except ContextFull as exc:
        state.stopped(Stop.CONTEXT_LIMIT, str(exc))
    except LLMError as exc:
        state.stopped(Stop.MODEL_ERROR, str(exc))
        traj.write("event", event="model_error", error=str(exc))
    except ReplyCut:  # the caller's clock cut a reply (a time-limited batch sampler): not an episode, so its
        traj.write("event", event="cut", turn=state.turn)  # best snapshot is not judged again (the caller plays
        traj.close()  # it again or drops it)
        raise
    except BaseException as exc:  # Ctrl-C, SIGTERM or a failure: what the episode made is still judged and written
        if isinstance(exc, KeyboardInterrupt):
            state.stopped(Stop.INTERRUPTED, f"at turn {state.turn}")
        _close(env, client, reference, run_dir, traj, state)
        raise
    return _close(env, client, reference, run_dir, traj, state)


def _close(env: Environment, client: ChatClient, reference: str | Path, run_dir: Path, traj: Trajectory,
           state: LoopState) -> EpisodeSummary:
    """The episode's summary (its best snapshot judged again), written to the trajectory and summary.json."""
    summary = EpisodeSummary(**vars(env.result()), reference=str(reference), model=client.model,
                             stop=state.stop.value if state.stop else "", stop_detail=state.stop_detail,
                             turns=state.turn, context_tokens=state.context_tokens,
                             wall_s=round(time.monotonic() - traj.start, 1))
    traj.write("result", summary=summary.to_dict())
    traj.close()
    (run_dir / "summary.json").write_text(json.dumps(summary.to_dict(), indent=2, default=str))
    return summary


def _update_best(env: Environment, state: LoopState) -> None:
    best = env.best()
    if best:
        state.best_reward = best.verdict.reward
        state.best_speedup = best.verdict.speedup_vs_compile


def _loop(env: Environment, client: ChatClient, messages: list[dict], tools: list[dict], traj: Trajectory,
          state: LoopState, config: LoopConfig, progress: Callable[[LoopState], None]) -> None:
    invalid = 0
    deadline = traj.start + config.time_limit_s if config.time_limit_s is not None else float("inf")
    if env.tools is not None:  # (a command started just before the limit ends at it, not at its own timeout)
        env.tools.deadline = deadline
    while state.turn < config.max_turns:
        if time.monotonic() >= deadline:
            state.stopped(Stop.TIME_LIMIT, f"{config.time_limit_s:g} s")
            return
        state.turn += 1
        began = time.monotonic()
        reply = client.complete(messages, tools)
        messages.append(reply.message())
        state.context_tokens = context_tokens(reply, messages)
        state.reply_s = round(time.monotonic() - began, 3)
        traj.write("assistant", turn=state.turn, message=reply.message(), usage=reply.usage,
                   finish_reason=reply.finish_reason, wall_s=state.reply_s)
        state.last_tool, state.reply_calls = None, len(reply.tool_calls)
        state.reply_tokens = reply.usage.get("completion_tokens") or 0
        progress(replace(state))
        if not reply.tool_calls:
            invalid += 1
            if invalid >= config.max_invalid:
                state.stopped(Stop.NO_TOOL_CALL, f"{invalid} replies in a row without a tool call")
                return
            messages.append({"role": "user", "content": malformed_call(reply.malformed) if reply.malformed else NUDGE})
            traj.write("user", turn=state.turn, message=messages[-1], malformed=len(reply.malformed))
            continue
        finished = False
        for n, call in enumerate(reply.tool_calls):
            began = time.monotonic()
            try:
                if n >= config.max_calls_per_reply:  # so that max_turns bounds the episode's tool calls too
                    raise ToolError(f"at most {config.max_calls_per_reply} tool calls a reply: this one was not run")
                if time.monotonic() >= deadline:  # (answered, so that every call of the reply has its result)
                    raise ToolError(f"the episode's time limit ({config.time_limit_s:g} s) is reached: not run")
                result = env.step(call.name, parse_arguments(call.arguments))
            except ToolError as exc:  # arguments that are not a JSON object
                result = StepResult(f"error: {exc}", info={"error": True})
            observation, info, done = result.observation, result.info, result.done
            if config.tool_output_chars:
                observation = clip(observation, config.tool_output_chars)
            invalid = invalid + 1 if info.get("error") else 0
            tool_msg = {"role": "tool", "tool_call_id": call.id, "content": observation}
            messages.append(tool_msg)
            traj.write("tool", turn=state.turn, tool=call.name, message=tool_msg,
                       wall_s=round(time.monotonic() - began, 3), **info)
            state.last_tool = call.name
            _update_best(env, state)
            progress(replace(state))
            finished = finished or done
        if reply.malformed:  # blocks beside the calls that parsed: told, not dropped unseen
            messages.append({"role": "user", "content": malformed_call(reply.malformed)})
            traj.write("user", turn=state.turn, message=messages[-1], malformed=len(reply.malformed))
        if finished:
            state.stopped(Stop.FINISH)
            return
        if time.monotonic() >= deadline:  # (before the count of failed calls, which the calls not run add to)
            state.stopped(Stop.TIME_LIMIT, f"{config.time_limit_s:g} s")
            return
        if invalid >= config.max_invalid:
            state.stopped(Stop.INVALID_TOOL_CALLS, f"{invalid} invalid tool calls in a row")
            return
        if state.context_tokens >= config.max_context:
            state.stopped(Stop.CONTEXT_LIMIT, f"{state.context_tokens} >= {config.max_context} tokens")
            return
    state.stopped(Stop.TURN_LIMIT, f"{config.max_turns} turns")


def _single_turn(env: Environment, client: ChatClient, messages: list[dict], traj: Trajectory,
                 state: LoopState) -> None:
    messages.append({"role": "user", "content": SINGLE_TURN})
    traj.write("user", message=messages[-1])
    state.turn = 1
    reply = client.complete(messages, None)
    messages.append(reply.message())
    state.context_tokens = context_tokens(reply, messages)
    traj.write("assistant", turn=1, message=reply.message(), usage=reply.usage)
    files = parse_files(reply.content)
    if not files:
        state.stopped(Stop.NO_FILES, "single turn: no `### FILE:` blocks in the reply")
        return
    for path, content in files.items():
        result = env.step("write_file", {"path": path, "content": content})
        traj.write("tool", turn=1, tool="write_file", path=path, observation=result.observation)
    result = env.step("profile", {})
    traj.write("tool", turn=1, tool="profile", observation=result.observation, **result.info)
    _update_best(env, state)
    state.stopped(Stop.SINGLE_TURN)
