"""A new user's first commands with nothing configured: the default cache lives under a home directory, which the
sandbox hides (a HOME under /tmp would not show it: the sandbox replaces /tmp wholesale)."""

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import TASKS
from cuda_agent import sandbox

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(sandbox.probe() is not None, reason=f"sandbox unavailable: {sandbox.probe()}")


@pytest.fixture(scope="module")
def hidden_home():
    """A fresh HOME inside a folder every sandbox hides (/root or /home), removed afterwards."""
    for parent in (Path.home(), Path("/home")):
        hidden = any(str(parent.resolve()).startswith(s) for s in sandbox.SECRETS)
        if hidden and parent.is_dir() and os.access(parent, os.W_OK):
            home = Path(tempfile.mkdtemp(prefix="cuda-agent-home-", dir=parent))
            yield home
            shutil.rmtree(home, ignore_errors=True)
            return
    pytest.skip("no writable folder under /root or /home to put a HOME in")


def user_env(home: Path) -> dict[str, str]:
    """The environment of a user who configured nothing: no cache variables, HOME as given."""
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_AGENT_CACHE", "XDG_CACHE_HOME",
                                                            "CUDA_AGENT_TEST_CACHE", "TORCH_EXTENSIONS_DIR")}
    return {**env, "HOME": str(home)}


def test_the_readme_example_works_with_the_default_cache_under_a_hidden_home(hidden_home):
    """The README's example as a new user runs it. Slow (~75 s on CI): with an empty home it builds the precompiled
    header and the kernel and times the baselines cold, at the default timing: that first run is what it tests."""
    exe = shutil.which("cuda-agent") or pytest.fail("the cuda-agent command is not installed (scripts/setup.sh)")
    command = [exe, "eval", "tests/data/tasks/affine_relu.py", "--solution", "tests/data/candidates/affine_relu_ok",
               "--backend", "cpu"]  # the README's worked example, word for word
    run = subprocess.run(command, cwd=ROOT, env=user_env(hidden_home), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert re.search(r"reward [123]\b", run.stdout) and re.search(r"correct\s+yes", run.stdout), run.stdout
    assert (hidden_home / ".cache" / "cuda-agent" / "judge.sqlite").is_file()  # the default location was used
    # the one-time precompiled header is announced before its 30-60 s, and its size after
    assert "building torch's precompiled header, once for this machine and cache" in run.stderr, run.stderr
    assert re.search(r"built precompiled header in [\d.]+s \(\d+ MB\)", run.stderr), run.stderr


def test_the_agent_shell_and_the_data_filters_work_under_a_hidden_home(hidden_home, monkeypatch):
    from cuda_agent.agent import Environment
    from cuda_agent.data.filters import FilterConfig, check_task_sandboxed
    from cuda_agent.judge import Judge, JudgeConfig

    monkeypatch.setenv("HOME", str(hidden_home))
    for name in ("CUDA_AGENT_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    judge = Judge("cpu", JudgeConfig(sandbox="required"))
    assert str(judge.cache_dir).startswith(str(hidden_home))
    env = Environment(judge, hidden_home / "runs" / "first", use_sandbox=True, bash_timeout=60)
    env.reset(TASKS / "affine_relu.py")
    obs = env.step("bash", {"command": f"touch kernels/ok && echo ws-ok; ls -A {judge.cache_dir} | wc -l"}).observation
    assert "exit code 0" in obs and "ws-ok" in obs, obs
    assert obs.strip().splitlines()[-1] == "0", obs  # the judge's cache is there but empty to the command
    assert (env.workspace / "kernels" / "ok").exists()

    result = check_task_sandboxed((TASKS / "affine_relu.py").read_text(),
                                  FilterConfig(device="cpu", check_compile=False, window_ms=(0.0, 1e6)),
                                  hidden_home / "data" / "attempt0")
    eager = next(c for c in result.checks if c.name == "runs_in_eager")
    assert eager.passed, eager.detail
