"""What a candidate gains by answering the trusted side's calls from native code of its own instead of the harness.

On the cpu backend a call's window holds the handshake (`judge/trusted/trusted_calls.py`): the callee receives
`call`, runs `forward`, describes its outputs and answers `done`. Eager and torch.compile pay the harness's Python
half of it in the baseline callee; a candidate that takes over the call socket with a native loop (red team,
2026-12-05: `tests/data/attacks/proxy_loop.py`) pays only its own. The difference is that candidate's gain over
the baselines on every call, whatever its kernel.

This measures both halves through the real trusted `Calls` (processes stopped and resumed, the same clock), on an
empty call (no inputs touched, one output described), in alternating rounds, each in a process that imported torch
(its threads are stopped and resumed with it): the harness's `Callee` serving the calls, or a C loop (compiled here
with gcc, called through ctypes) answering a fixed `done` of the same shape, as the attack's native thread does. The
gain is the difference of their median windows.

    python3 benchmarks/call_handshake.py [--calls 2000] [--rounds 5] [--out handshake.json]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, machine, write

import torch  # noqa: E402

from cuda_agent.judge.trusted.trusted_calls import Calls  # noqa: E402

NATIVE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Answers `call` with a `done` of one float32 tensor (its own buffer) and `end` with `ended`; returns at `end`. */
static float out[4];

static long number_after(const char *s, const char *key) {
    const char *p = strstr(s, key);
    if (!p) return -1;
    p += strlen(key);
    while (*p == ' ' || *p == ':') ++p;
    return strtol(p, NULL, 10);
}

int serve(int fd) {
    char buf[1 << 16], cbuf[CMSG_SPACE(16 * sizeof(int))], reply[512];
    long calls = 0;
    for (;;) {
        struct iovec iov = {buf, sizeof buf - 1};
        struct msghdr m = {0};
        m.msg_iov = &iov; m.msg_iovlen = 1; m.msg_control = cbuf; m.msg_controllen = sizeof cbuf;
        ssize_t n = recvmsg(fd, &m, 0);
        if (n <= 0) return 0;
        buf[n] = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
            if (c->cmsg_type == SCM_RIGHTS)
                for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); ++i) close(((int *)CMSG_DATA(c))[i]);
        int len;
        if (strstr(buf, "\"call\"")) {
            ++calls;
            len = snprintf(reply, sizeof reply, "{\"op\":\"done\",\"k\":%ld,\"outputs\":[{\"path\":\"\",\"kind\":"
                           "\"tensor\",\"dtype\":\"float32\",\"shape\":[4],\"strides\":[1],\"ptr\":%lu,\"device\":"
                           "\"cpu\"}]}", number_after(buf, "\"k\""), (unsigned long)out);
        } else if (strstr(buf, "\"end\"")) {
            len = snprintf(reply, sizeof reply, "{\"op\":\"ended\",\"calls\":%ld,\"violations\":[]}", calls);
            send(fd, reply, len, 0);
            return 0;
        } else continue;  /* inputs: nothing to map for an empty call */
        send(fd, reply, len, 0);
    }
}
"""

CALLEE = """
import ctypes, socket, sys, torch
from cuda_agent.judge.candidate.callee import Callee
out = torch.zeros(4)
if sys.argv[1] == "native":
    ctypes.CDLL(sys.argv[2]).serve(int(sys.argv[3]))
else:
    callee = Callee(socket.socket(fileno=int(sys.argv[3])), lambda inputs, fn: out)
    callee.ended(callee.serve()[0], [])
"""


def serve(command: list[str]) -> tuple[Calls, subprocess.Popen]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with theirs:
        proc = subprocess.Popen([*command, str(theirs.fileno())], pass_fds=[theirs.fileno()],
                                env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    time.sleep(3.0)  # (started: it imports torch)
    calls = Calls(ours, [proc.pid], proc.pid, read_limit=1 << 20)
    calls.load([torch.zeros(4)])
    return calls, proc


def windows(command: list[str], n: int) -> list[float]:
    calls, proc = serve(command)
    try:
        found = [calls.call(time.monotonic() + 10).window_us for _ in range(n)]
        served = calls.end()
        assert not served, served  # both answer every call and count them
    finally:
        proc.kill()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        native = Path(tmp) / "native_callee.so"
        (Path(tmp) / "native.c").write_text(NATIVE)
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(native), str(Path(tmp) / "native.c")], check=True)
        script = Path(tmp) / "callee.py"
        script.write_text(CALLEE)
        callees = {kind: [sys.executable, str(script), kind, str(native)] for kind in ("harness", "native")}
        rows = []
        for r in range(args.rounds):
            medians = {name: statistics.median(windows(cmd, args.calls)) for name, cmd in callees.items()}
            harness, native_us = medians.values()
            rows.append({"round": r, "harness_us": round(harness, 1), "native_us": round(native_us, 1),
                         "gain_us": round(harness - native_us, 1)})
            print(rows[-1], flush=True)
    gains = [row["gain_us"] for row in rows]
    write(args.out, "Call handshake: harness vs a native loop (median window of an empty call)", rows,
          ["round", "harness_us", "native_us", "gain_us"],
          {"gain_us_median": statistics.median(gains), "calls": args.calls, "machine": machine()})


if __name__ == "__main__":
    main()
