"""The agent's tools: OpenAI function schemas and their implementations over one workspace.

File tools stay inside the workspace and never touch its read-only files (the task, SKILL.md, the template's
binding files). `bash` runs in the sandbox (no network, writes only in the workspace, GPU visible). `compile`,
`verify` and `profile` are served by the judge; the verdicts they produce are handed to the environment, which
keeps the best verified candidate.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import sandbox
from ..judge import Judge
from ..judge.pool import JudgePool
from ..judge.trusted.freezer import descendants
from ..judge.verdict import OUT_OF_TIME, Verdict
from ..sandbox.cgroup import members
from ..task import TaskError
from ..workspace.candidate import Candidate, CandidateError, load_candidate
from . import disk, grep

READ_ONLY = ("model.py", "SKILL.md", "binding.cpp", "binding_registry.h")
OUTPUT_LIMIT = 12_000  # characters of tool output kept: head and tail halves
MAX_READ_LINES = 2000
MAX_FILE_BYTES = 16 << 20  # the file tools read no larger file
# `bash` runs at a low CPU priority (a command spinning on every core must not slow a sibling episode's timed
# candidate): in a cgroup of a twentieth of an ordinary process's weight where one can be made (which a new session
# inside cannot leave), and at nice 19 in an autogroup at nice 19 (where the kernel groups sessions a nice value
# counts only within its own)
NICE = 19


class ToolError(Exception):
    """A tool call the agent got wrong: the message goes back to it as the observation."""


def _param(kind: str, description: str, **extra: Any) -> dict:
    return {"type": kind, "description": description, **extra}


def _schema(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required, "additionalProperties": False}}}


SCHEMAS = [
    _schema("bash", "Run a shell command in the workspace (sandboxed: no network, writes only inside the "
            "workspace; the GPU is visible). Long output is cut to its head and tail.",
            {"command": _param("string", "the command, run by bash -c"),
             "timeout": _param("integer", "seconds before the command is killed (default 180)")}, ["command"]),
    _schema("read_file", "Read a text file of the workspace, with line numbers.",
            {"path": _param("string", "path relative to the workspace"),
             "start_line": _param("integer", "first line (1-based, default 1)"),
             "end_line": _param("integer", "last line (inclusive, default: the end)")}, ["path"]),
    _schema("write_file", "Create or overwrite a file of the workspace.",
            {"path": _param("string", "path relative to the workspace"),
             "content": _param("string", "the whole new content")}, ["path", "content"]),
    _schema("edit", "Replace one exact, unique piece of text in a file.",
            {"path": _param("string", "path relative to the workspace"),
             "old": _param("string", "text that occurs exactly once in the file"),
             "new": _param("string", "its replacement")}, ["path", "old", "new"]),
    _schema("multi_edit", "Apply several exact, unique replacements to one file, in order, all or none.",
            {"path": _param("string", "path relative to the workspace"),
             "edits": _param("array", "the replacements", items={
                 "type": "object", "properties": {"old": {"type": "string"}, "new": {"type": "string"}},
                 "required": ["old", "new"]})}, ["path", "edits"]),
    _schema("glob", "List workspace files matching a glob pattern (e.g. kernels/*.cu).",
            {"pattern": _param("string", "glob pattern relative to the workspace")}, ["pattern"]),
    _schema("grep", "Search workspace files for a regular expression; prints file:line: text.",
            {"pattern": _param("string", "Python regular expression"),
             "path": _param("string", "file or folder to search (default: the workspace)")}, ["pattern"]),
    _schema("compile", "Build the workspace (model_new.py + kernels/) the way the judge does; prints compiler "
            "errors with file:line.", {}, []),
    _schema("verify", "Build and check correctness against the reference on fresh inputs (and the judge's "
            "other checks); prints the first failing check with its numbers.", {}, []),
    _schema("profile", "Judge the workspace completely: correctness, then the timing table against eager "
            "PyTorch and torch.compile, and the reward.", {}, []),
    _schema("finish", "End the episode: the best verified candidate seen is the answer.",
            {"summary": _param("string", "what was achieved, in a sentence or two")}, []),
]
TOOL_NAMES = [s["function"]["name"] for s in SCHEMAS]
COMPACT = ("read_file", "write_file", "edit", "verify", "profile", "finish")  # for small contexts (with SKILL.md left
# in the workspace, the opening prompt of affine_relu: 2,747 -> 897 SmolLM2 tokens)


def schemas(compact: bool = False) -> list[dict]:
    """The tools offered: all, or the compact set."""
    return [s for s in SCHEMAS if not compact or s["function"]["name"] in COMPACT]


def wrote(path: str, content: str) -> str:
    """What `write_file` answers (also what the expert's SFT corpus shows a model after its writes)."""
    return f"wrote {path} ({len(content.splitlines())} lines)"


def clip(text: str, limit: int = OUTPUT_LIMIT) -> str:
    """Head and tail of a long output, with a marker saying how much was cut."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


@dataclass
class ToolResult:
    """What a tool call returns: the observation the model reads, and for `verify` and `profile` the verdict and the
    candidate it was given to."""
    observation: str
    verdict: Verdict | None = None
    candidate: Candidate | None = None


def _check_types(name: str, method: Any, arguments: dict[str, Any]) -> None:
    """Each argument of the type its parameter is annotated with (`int`, `str`, `list[...]`, `X | None`): a string
    for a line number, or a float for a timeout, is answered as bad arguments, not raised in the loop."""
    kinds = {"int": int, "str": str, "list": list, "dict": dict, "bool": bool, "None": type(None)}
    hints = {k: v for k, v in getattr(method, "__annotations__", {}).items() if k != "return"}
    for key, value in arguments.items():
        if key not in hints:
            continue  # (an unknown name: the call's TypeError says so)
        allowed = tuple(kinds[part.strip().split("[")[0]] for part in str(hints[key]).split("|")
                        if part.strip().split("[")[0] in kinds)
        if allowed and (not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed)):
            raise ToolError(f"{name}: bad arguments ({key} must be {hints[key]}, not {type(value).__name__})")


@dataclass
class Tools:
    workspace: Path
    reference: Path
    judge: Judge | JudgePool
    use_sandbox: bool = True
    bash_timeout: int = 180
    names: tuple[str, ...] = tuple(TOOL_NAMES)  # the tools offered
    hidden: tuple[Path, ...] = ()  # folders bash must not see besides the judge's (other episodes' run folders)
    deadline: float = float("inf")  # (time.monotonic) the episode's time limit: no command runs past it
    _verdicts: dict[str, Verdict] = field(default_factory=dict)  # candidate hash -> its full verdict

    # ---- dispatch ---------------------------------------------------------------------------------------
    def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        method = getattr(self, f"tool_{name}", None)
        if name not in self.names or method is None:
            raise ToolError(f"unknown tool {name!r}; the tools are: {', '.join(self.names)}")
        _check_types(name, method, arguments)
        try:
            result = method(**arguments)
        except TaskError as exc:  # (a ValueError, but the task's or the machine's: not a malformed call of the policy)
            raise ToolError(f"{name}: the judge could not run the task's reference (not the candidate's fault): "
                            f"{exc}") from exc
        except (TypeError, ValueError, UnicodeError) as exc:  # (a NUL in a path, a lone surrogate in content)
            raise ToolError(f"{name}: bad arguments ({type(exc).__name__}: {exc})") from exc
        except OSError as exc:  # a path under a file, a name too long, a file bash made unreadable
            raise ToolError(f"{name}: {exc.strerror or exc}") from exc
        return result if isinstance(result, ToolResult) else ToolResult(result)

    def _path(self, rel: str, writing: bool = False) -> Path:
        """A path of the workspace, reached without `..` or a symbolic link (the agent's links could point anywhere:
        the tools run outside the sandbox)."""
        if not isinstance(rel, str) or not rel or rel.startswith("/"):
            raise ToolError(f"path must be relative to the workspace, not {rel!r}")
        if ".." in Path(rel).parts:
            raise ToolError(f"{rel}: outside the workspace")
        root = self.workspace.resolve()
        path = root / rel
        if not self._plain(path):
            raise ToolError(f"{rel} is or lies in a symbolic link; the tools do not follow links")
        if writing and str(path.relative_to(root)) in READ_ONLY:
            raise ToolError(f"{rel} is read-only (the judge uses its own copy)")
        if writing and path.exists() and not path.is_file():  # a folder, or a FIFO that would block the writer
            raise ToolError(f"{rel} is not a regular file")
        return path

    @staticmethod
    def _plain(path: Path) -> bool:
        """Whether a path under the resolved workspace has neither a link nor `..` on its way (it then lies inside)."""
        try:
            return path.resolve() == path
        except (OSError, RuntimeError):  # a loop of links
            return False

    @staticmethod
    def _text(target: Path, rel: str) -> str:
        """A workspace file's text, refused beyond MAX_FILE_BYTES (it is read in this process)."""
        if target.stat().st_size > MAX_FILE_BYTES:
            raise ToolError(f"{rel}: larger than {MAX_FILE_BYTES >> 20} MiB; the file tools do not read it")
        return target.read_text(errors="replace")

    # ---- files ------------------------------------------------------------------------------------------
    def tool_read_file(self, path: str, start_line: int = 1, end_line: int | None = None) -> str:
        target = self._path(path)
        if not target.is_file():
            raise ToolError(f"{path}: no such file")
        lines = self._text(target, path).splitlines()
        first = max(1, int(start_line))
        last = min(len(lines), int(end_line) if end_line else len(lines), first + MAX_READ_LINES - 1)
        body = "\n".join(f"{i:6d}  {lines[i - 1]}" for i in range(first, last + 1))
        more = f"\n[lines {last + 1}-{len(lines)} not shown]" if last < len(lines) else ""
        return (body or "(empty file)") + more

    def tool_write_file(self, path: str, content: str) -> str:
        target = self._path(path, writing=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        return wrote(path, content)

    def tool_edit(self, path: str, old: str, new: str) -> str:
        return self.tool_multi_edit(path, [{"old": old, "new": new}])

    def tool_multi_edit(self, path: str, edits: list[dict]) -> str:
        target = self._path(path, writing=True)
        if not target.is_file():
            raise ToolError(f"{path}: no such file")
        text = self._text(target, path)
        for i, item in enumerate(edits):
            if not isinstance(item, dict):
                raise ToolError(f"edit {i}: an object with 'old' and 'new'")
            old, new = item.get("old"), item.get("new")
            if not isinstance(old, str) or not isinstance(new, str) or not old:
                raise ToolError(f"edit {i}: 'old' (non-empty) and 'new' must be strings")
            count = text.count(old)
            if count != 1:
                where = "not found" if count == 0 else f"found {count} times; add context to make it unique"
                raise ToolError(f"edit {i} in {path}: the old text was {where}; nothing was changed")
            text = text.replace(old, new)
        target.write_text(text)
        return f"applied {len(edits)} edit(s) to {path}"

    def tool_glob(self, pattern: str) -> str:
        if not isinstance(pattern, str) or not pattern or pattern.startswith("/") or ".." in Path(pattern).parts:
            raise ToolError(f"the pattern must be relative to the workspace, without '..', not {pattern!r}")
        if Path(pattern).parts.count("**") > 1:  # pathlib walks the tree once per `**` and combination (GIL held)
            raise ToolError("at most one '**' in a pattern")
        root = self.workspace.resolve()
        try:
            found = sorted(str(p.relative_to(root)) for p in root.glob(pattern) if p.is_file() and self._plain(p))
        except ValueError as exc:
            raise ToolError(f"bad pattern {pattern!r}: {exc}") from exc
        return "\n".join(found[:500]) or "(no match)"

    def tool_grep(self, pattern: str, path: str = ".") -> str:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ToolError(f"bad regular expression: {exc}") from exc
        base, root = self._path(path), self.workspace.resolve()
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file() and self._plain(p))
        try:
            hits, more = grep.search(pattern, root, files, MAX_FILE_BYTES, min(grep.TIMEOUT_S, self.bash_timeout),
                                     command_env())
        except grep.SearchFailed as exc:
            raise ToolError(str(exc)) from exc
        return clip("\n".join(hits) + (f"\n[{more} more]" if more else "")) if hits else "(no match)"

    # ---- shell ------------------------------------------------------------------------------------------
    def tool_bash(self, command: str, timeout: int | None = None) -> str:
        limit = min(timeout, self.bash_timeout) if timeout and timeout > 0 else self.bash_timeout
        limit = max(0.1, min(limit, self.deadline - time.monotonic()))  # (red team 2026-12-06: ran past the episode)
        box = None
        prefix: list[str] = []
        if self.use_sandbox:
            ro = [self.workspace / name for name in READ_ONLY if (self.workspace / name).exists()]
            box = sandbox.Sandbox(sandbox.View(writable=[self.workspace], readable=ro,
                                               hidden=[*self.judge.private_paths, *self.hidden]),
                                  sandbox.Limits(memory_bytes=disk.MEMORY_BYTES, cpu_seconds=None,
                                                 file_bytes=disk.FILE_BYTES, cpu_low=True), cwd=self.workspace)
            prefix = box.prefix()
        start = time.monotonic()
        proc = subprocess.Popen(["nice", "-n", str(NICE), *prefix, "bash", "-c", command], cwd=self.workspace,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                env=command_env())
        _lower_session(proc.pid)
        try:
            output, status = self._watched(proc, start, limit, box)
        except BaseException:  # interrupted (Ctrl-C, SIGTERM): the command is not left running in its own session
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        finally:
            if box:
                box.close()
        text = output.decode(errors="replace")
        return f"[{status}, {time.monotonic() - start:.1f} s]\n{clip(text)}{self._within_budget()}"

    def _within_budget(self) -> str:
        """The workspace brought back under its disk budget after a command; what the agent is told of it."""
        over = disk.usage(self.workspace).over()
        removed = disk.enforce(self.workspace, READ_ONLY) if over else []
        if not removed:
            return f"\n[{over}]" if over else ""
        more = f" and {len(removed) - 20} more" if len(removed) > 20 else ""
        names = [name if len(name) <= 120 else f"...{name[-100:]}" for name in removed[:20]]
        return f"\n[{over}: removed {', '.join(names)}{more}]"

    def _watched(self, proc: subprocess.Popen, start: float, limit: float, box=None) -> tuple[bytes, str]:
        """The command's output and how it ended: killed after `limit` seconds, or once its workspace passes its
        disk budget (`disk.py`), measured every `disk.POLL_S`, files its processes hold open after removing them
        included (on the workspace's disk, in no folder)."""
        device = os.stat(self.workspace).st_dev
        while True:
            try:
                left = start + limit - time.monotonic()
                output, _ = proc.communicate(timeout=max(0.0, min(disk.POLL_S, left)))
                return output, f"exit code {proc.returncode}"
            except subprocess.TimeoutExpired:
                now = disk.usage(self.workspace)
                over = now.over()
                if over is None:
                    pids = set(descendants(proc.pid))
                    if box is not None and box.cgroup is not None:
                        for folder in box.cgroup.dirs:
                            pids.update(members(folder))
                    held = disk.held_unlinked(sorted(pids), device)
                    if now.bytes + held > disk.WORKSPACE_BYTES:
                        over = (f"the workspace holds {(now.bytes + held) >> 20} MiB, {held >> 20} MiB of it in "
                                f"files removed but held open (at most {disk.WORKSPACE_BYTES >> 20} MiB)")
                if over or time.monotonic() >= start + limit:
                    os.killpg(proc.pid, signal.SIGKILL)
                    output, _ = proc.communicate()
                    return output, f"killed: {over}" if over else f"killed after {limit:.4g} s (timeout)"

    # ---- judge ------------------------------------------------------------------------------------------
    def _candidate(self):
        try:
            cand = load_candidate(self.workspace)
        except CandidateError as exc:
            raise ToolError(str(exc)) from exc
        if "model_new.py" not in cand.files:
            raise ToolError("model_new.py is missing: write it first (see SKILL.md)")
        return cand

    def tool_compile(self) -> str:
        cand = self._candidate()
        result = self.judge.compile(cand, self._deadline())
        steps = ", ".join(f"{s.source}{' (cached)' if s.cached else ''}" for s in result.steps)
        if result.ok:
            return f"build ok in {result.seconds:.1f} s: {steps}"
        return f"build FAILED in {result.seconds:.1f} s\n{clip(result.log or result.error or '')}"

    def _judged(self) -> tuple[Verdict, Candidate]:
        cand = self._candidate()
        verdict = self._verdicts.get(cand.hash)
        if verdict is None:
            verdict = self.judge.evaluate(self.reference, cand, deadline=self._deadline())
            if not (verdict.error or "").startswith(OUT_OF_TIME):  # (cut short by the episode: not its answer)
                self._verdicts[cand.hash] = verdict
        return verdict, cand

    def _deadline(self) -> float | None:
        """The episode's time limit, which the judge's work ends at too (red team 2026-12-06: a `verify` started
        just before it ran a whole evaluation, twice for a crash)."""
        return None if self.deadline == float("inf") else self.deadline

    def tool_verify(self) -> ToolResult:
        v, cand = self._judged()
        return ToolResult(self._correctness(v), v, cand)

    @staticmethod
    def _correctness(v: Verdict) -> str:
        lines = [f"compiled: {v.compiled}", f"correct: {v.correct}"]
        if v.error:
            lines.append(f"first failure: {v.error}")
        for build in v.build.get("inline", []):  # load_inline's compiler errors (the log's path is the judge's)
            lines += [f"compiler: {ln}" for ln in (build.get("error") or "").splitlines() if "whole log" not in ln]
        if v.correct:
            lines.append(f"max abs error {v.max_abs_error:.3g}, max rel error {v.max_rel_error:.3g} "
                         f"(tolerance atol {v.tolerance['atol']}, rtol {v.tolerance['rtol']})")
        lines += [f"warning: {w}" for w in v.warnings]
        return "\n".join(lines)

    def tool_profile(self) -> ToolResult:
        v, cand = self._judged()
        return ToolResult(self._speed(v), v, cand)

    def _speed(self, v: Verdict) -> str:
        if not v.correct or not v.times_us.get("candidate"):
            return self._correctness(v) + f"\nreward: {v.reward}"
        t = v.times_us
        rows = [("eager PyTorch", t["eager"]), ("torch.compile", t["compile"]), ("your kernels", t["candidate"])]
        table = "\n".join(f"{name:<15} {us:12.2f} us" for name, us in rows)
        kernels = (v.timing.get("candidate") or {}).get("kernels") or []
        speed = (f"speedup vs eager {v.speedup_vs_eager:.3f}x, vs torch.compile {v.speedup_vs_compile:.3f}x"
                 if v.speedup_vs_eager is not None and v.speedup_vs_compile is not None else
                 f"no speedup credited ({v.reason})")
        return (f"{table}\n{speed}"
                f"\nreward: {v.reward} (3 = at least 5% faster than torch.compile)"
                + (f"\nkernels in the timed calls: {', '.join(k[:80] for k in kernels[:8])}" if kernels else "")
                + "".join(f"\nwarning: {w}" for w in v.warnings))

    def tool_finish(self, summary: str = "") -> str:
        return "finished" + (f": {summary}" if summary else "")


def _lower_session(pid: int) -> None:
    """The autogroup of `pid`'s new session at the lowest priority (no autogroups here: nothing to do)."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(str(NICE))


def command_env() -> dict[str, str]:
    """The environment of the agent's commands: tools and GPU selection, never the caller's secrets (API keys)."""
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}", "HOME": "/tmp",
           "TMPDIR": "/tmp", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    for key in ("CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "PYTHONPATH"):
        if key in os.environ:
            env[key] = os.environ[key]
    return env


def parse_arguments(raw: Any) -> dict[str, Any]:
    """Tool-call arguments arrive as a JSON string (or a dict from text-parsed calls)."""
    if isinstance(raw, dict):
        return raw
    if raw in (None, ""):
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ToolError(f"arguments are not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise ToolError("arguments are not valid JSON: nested too deeply") from exc
    if not isinstance(value, dict):
        raise ToolError("arguments must be a JSON object")
    return value
