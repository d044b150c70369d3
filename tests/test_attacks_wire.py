"""White-box attacks on the judge's message channels (cpu backend): what a candidate writes on its worker's pipe to
the judge, or on the call socket to the reference worker, can fail the candidate and nothing more. Each was a
held-out red-team win (2026-12-05): the judge's process raised, or the trusted reference worker died."""

import pytest

from test_attacks import AFFINE, KERNEL, candidate

# the worker's message pipe to the judge (its stdout: a write-only FIFO that is not stderr), found from inside
ON_PIPE = """
import stat
for _fd in map(int, os.listdir("/proc/self/fd")):
    try:
        st = os.fstat(_fd)
        flags = int(open(f"/proc/self/fdinfo/{_fd}").read().split("flags:")[1].split()[0], 8)
    except (OSError, IndexError, ValueError):
        continue
    if _fd > 2 and stat.S_ISFIFO(st.st_mode) and flags & 3 == os.O_WRONLY and st.st_ino != os.fstat(2).st_ino:
        for _chunk in LINE:
            os.write(_fd, _chunk)
"""
# the call socket to the reference worker (SOCK_SEQPACKET), found from inside
ON_SOCKET = """
import json, socket, stat
def send_all(data):
    for fd in map(int, os.listdir("/proc/self/fd")):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                s = socket.socket(fileno=os.dup(fd))
                if s.type == socket.SOCK_SEQPACKET:
                    s.send(data)
        except OSError:
            pass
"""


@pytest.mark.parametrize("line, said", [
    ('[b"[" * 100_000 + b"\\\\n"]', "protocol error from worker"),  # RecursionError in the judge's process
    ('[b"42\\\\n"]', "protocol error from worker"),  # AttributeError there
    ('[b"x" * (1 << 20)] * 70 + [b"\\\\n"]', "a message longer than 64 MiB"),  # rescanned on every read: 22 s of CPU
])
def test_what_a_candidate_writes_on_its_pipe_to_the_judge_fails_it_and_nothing_more(cpu_judge, make_workspace,
                                                                                     line, said):
    ws = candidate(make_workspace, "return " + KERNEL, prelude=f"LINE = {line}\n" + ON_PIPE)
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert not verdict.correct and said in verdict.error, verdict.error


DONE = 'json.dumps({"op": "done", "k": self.calls, "outputs": OUTPUTS}).encode()'


@pytest.mark.parametrize("message, said", [
    (DONE.replace("OUTPUTS", '[{"path": "output", "kind": "tensor", "dtype": "float32", "shape": [0, 2 ** 70], '
                             '"strides": [1, 1], "ptr": 0}]'), "malformed description"),
    ('b"[" * 200_000', "answered outside the protocol"),
    (DONE.replace("OUTPUTS", "[1]"), "malformed output description"),  # (red team C: AttributeError there)
    (DONE.replace("OUTPUTS", '[{"kind": "value", "path": [0], "value": 1}]'), "incorrect"),  # (an unhashable path)
])
def test_a_forged_answer_on_the_call_socket_fails_the_candidate_not_the_reference_worker(cpu_judge, make_workspace,
                                                                                         message, said):
    ws = candidate(make_workspace, f"send_all({message})\nself.calls += 1\nreturn " + KERNEL, init="self.calls = 0",
                   prelude=ON_SOCKET)
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert not verdict.correct and said in verdict.error and "evaluation aborted" not in verdict.error, verdict.error


KEEP_INPUT_FD = """
import mmap
KEPT = []
_real = mmap.mmap


class _Keeping(_real):  # the harness maps the input buffer with mmap.mmap(fd, n): a copy of the descriptor is kept
    def __new__(cls, fd, *args, **kwargs):
        if fd >= 0:
            KEPT.append(os.dup(fd))
        return _real(fd, *args, **kwargs)


mmap.mmap = _Keeping
"""


def test_an_input_buffer_the_candidate_truncates_fails_the_candidate_not_the_reference_worker(cpu_judge,
                                                                                             make_workspace):
    """Held out (red team, 2026-12-05): the input buffer's memfd had no seals; a candidate that kept its descriptor
    and truncated it in a call made the reference worker's next touch of its own mapping a SIGBUS (the evaluation
    aborted and ran again). It is sealed at its size: the truncation is the candidate's own failure."""
    # (the memfd only: not the libraries the in-process audit maps to read their symbols)
    ws = candidate(make_workspace, "for fd in KEPT:\n    if os.readlink(f'/proc/self/fd/{fd}').startswith('/memfd:'):\n"
                   "        os.ftruncate(fd, 0)\nreturn " + KERNEL, prelude=KEEP_INPUT_FD)
    verdict = cpu_judge.evaluate(AFFINE, ws)
    assert not verdict.correct and "Operation not permitted" in verdict.error, verdict.error
    assert "evaluation aborted" not in verdict.error and "SIGBUS" not in verdict.error
