"""The candidate's sandbox on the CPU backend: what it blocks, and that a plain process would not."""

import socket
import subprocess

import pytest

from conftest import TASKS, fast_config
from cuda_agent.judge import Judge
from cuda_agent.judge.sandbox import namespaces_available

AFFINE = TASKS / "affine_relu.py"
pytestmark = pytest.mark.skipif(not namespaces_available(), reason="unshare --user --net --pid is not permitted here")


def candidate(folder, init_body: str, forward_body: str):
    path = folder / "probe.py"
    path.write_text("import os, socket, subprocess\nimport torch\n\n\nclass ModelNew(torch.nn.Module):\n"
                    f"    def __init__(self, scale, shift):\n        super().__init__()\n        {init_body}\n\n"
                    f"    def forward(self, x):\n        {forward_body}\n")
    return path


@pytest.fixture(scope="module")
def judges(cache_dir):
    return {mode: Judge("cpu", fast_config(cache_dir, sandbox=mode, memory_limit_gb=8)) for mode in ("namespaces", "none")}


def test_network_is_unreachable_inside(judges, tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    probe = candidate(tmp_path, "pass", f"raise RuntimeError('connect=%d' % socket.socket().connect_ex(('127.0.0.1', {port})))")
    try:
        inside = judges["namespaces"].evaluate(AFFINE, probe)
        outside = judges["none"].evaluate(AFFINE, probe)
    finally:
        server.close()
    assert inside.sandbox.startswith("namespaces") and outside.sandbox.startswith("none")
    assert "connect=0" in outside.error  # the same probe reaches the server from a plain process
    assert "connect=" in inside.error and "connect=0" not in inside.error, inside.error


def test_no_process_outlives_the_evaluation(judges, tmp_path):
    marker = "987654"  # sleep's argument identifies the stray process
    probe = candidate(tmp_path, f"subprocess.Popen(['sleep', '{marker}'], start_new_session=True)", "return x * 1")

    def strays() -> list[str]:
        return subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True).stdout.split()

    try:
        judges["namespaces"].evaluate(AFFINE, probe)
        assert strays() == []
        judges["none"].evaluate(AFFINE, probe)  # a daemon that left the session survives a plain process
        assert strays() != []
    finally:
        subprocess.run(["pkill", "-f", f"sleep {marker}"])


def test_memory_is_bounded_inside(judges, tmp_path):
    probe = candidate(tmp_path, "pass", "self.hog = bytearray(10 * 2**30)")  # 10 GiB, over the 8 GiB limit
    verdict = judges["namespaces"].evaluate(AFFINE, probe)
    assert "address space <= 8.0 GiB" in verdict.sandbox
    assert verdict.reward == -1 and "MemoryError" in verdict.error, verdict.error
