"""The trusted side's calls (judge/trusted/trusted_calls.py) against scripted callee processes: its clock, its freezer,
what it reads of the callee's memory. The callee's forward is scripted in each test (`CALLEE`); nothing here builds a
kernel."""

import os
import socket
import subprocess
import sys
import textwrap
import re
import time

import pytest
import torch

from conftest import TASKS

from cuda_agent.judge.wire.call_protocol import Ready, receive
from cuda_agent.judge.trusted.freezer import CandidateGone, Freezer, process_cpu_ns
from cuda_agent.judge.wire.input_buffers import InputBuffer, InputError, layout_of, map_inputs
from cuda_agent.judge.trusted.readback import Unreadable, process_reader, read_outputs
from cuda_agent.judge.trusted.trusted_calls import CallFailed, Calls

TASK = TASKS / "affine_relu.py"
CALLEE = """
import os, socket, sys, threading, time, torch
from cuda_agent.judge.wire.call_protocol import Ready, send
from cuda_agent.judge.candidate.callee import Callee
sock = socket.socket(fileno=int(sys.argv[1]))
state = {{}}
def forward(inputs, fn):
{body}
callee = Callee(sock, forward)
send(sock, Ready())
callee.ended(callee.serve()[0], [])
"""


def start(body: str) -> tuple[Calls, subprocess.Popen]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with theirs:
        proc = subprocess.Popen([sys.executable, "-c", CALLEE.format(body=textwrap.indent(body, "    ")),
                                 str(theirs.fileno())], pass_fds=[theirs.fileno()])
    ours.settimeout(300)
    assert isinstance(receive(ours)[0], Ready)
    return Calls(ours, [proc.pid], proc.pid, 1 << 30), proc


def read(calls: Calls, call) -> list:
    leaves, _ = calls.outputs(call)
    return [load() for _, _, load in leaves]


@pytest.fixture
def callee():
    started = []

    def make(body: str) -> Calls:
        calls, proc = start(body)
        started.append(proc)
        return calls

    yield make
    for proc in started:
        proc.kill()
        proc.wait()


def test_a_call_runs_on_the_inputs_written_and_its_outputs_are_read_from_the_callee():
    calls, proc = start("return inputs[0] * 2 + inputs[1]")
    try:
        for seed in range(3):
            x = torch.randn(1000, generator=torch.Generator().manual_seed(seed))
            calls.load([x, 0.5])
            call = calls.call(time.monotonic() + 30)
            assert call.window_us > 0 and call.cpu_us >= 0
            assert torch.equal(read(calls, call)[0], x * 2 + 0.5)
            assert calls.changed_inputs() == []
        assert calls.end() == []
    finally:
        proc.kill()


def test_work_a_thread_does_after_forward_returned_is_not_in_the_outputs_read(callee):
    # The output is returned empty and filled by a thread afterwards: the callee is stopped as `done` arrives and
    # the outputs are read then.
    calls = callee("out = torch.zeros(1 << 20)\n"
                   "def fill():\n"
                   "    time.sleep(0.05)\n"
                   "    out.fill_(1.0)\n"
                   "threading.Thread(target=fill).start()\n"
                   "return out")
    calls.load([torch.ones(4)])
    call = calls.call(time.monotonic() + 30)
    time.sleep(0.2)  # the thread would have finished by now, had it been allowed to run
    assert float(read(calls, call)[0].sum()) == 0.0


SPINNER = ("if not state:\n"
           "    state['t'] = threading.Thread(target=lambda: [None for _ in iter(int, 1)], daemon=True)\n"
           "    state['t'].start()\n"
           "return inputs[0] + 1")  # a thread spinning from the first call on


def test_a_callee_is_held_still_between_calls_whatever_its_threads_do(callee):
    # While stopped, the callee's CPU clock (the kernel's) does not move.
    calls = callee(SPINNER)
    calls.load([torch.zeros(4)])
    call = calls.call(time.monotonic() + 30)
    before = calls.freezer.cpu_ns()
    time.sleep(0.3)
    assert calls.freezer.cpu_ns() == before
    calls.freezer.resume()
    deadline = time.monotonic() + 10  # (on a loaded machine the spinner gets a share of a core)
    while calls.freezer.cpu_ns() <= before + 0.1e9 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert calls.freezer.cpu_ns() > before + 0.1e9  # the thread does spin once resumed
    calls.freezer.stop()
    assert call.cpu_us > 0


def test_a_callee_that_runs_between_calls_fails_the_next_call(callee):
    # Something resumed it behind the trusted side's back (here: the test itself): its CPU clock moved while it was
    # to be stopped.
    calls = callee(SPINNER)
    calls.load([torch.zeros(4)])
    calls.call(time.monotonic() + 30)
    calls.freezer.resume()
    time.sleep(0.05)
    calls.freezer.stop()
    with pytest.raises(CallFailed, match="ran while stopped") as failed:
        calls.call(time.monotonic() + 30)
    # where it went: in which gaps, which process, its threads' states (all stopped again: T)
    assert re.search(r"in 1 of 1 gaps, (its threads given a CPU meanwhile|this kernel counting no schedules); its "
                     r"worker \d+ us, thread states T+\b", str(failed.value)), failed.value


def test_cpu_time_booked_after_the_stop_with_no_thread_given_a_cpu_is_the_call_s_own(callee, monkeypatch):
    """The H200's "ran while stopped" on honest kernels (2.3-5.0 ms in 1 gap of 8-105, every thread `T`): the kernel
    books a running thread's time at a tick or when it leaves its CPU, so a clock read while a stopped thread is still
    on its CPU moves later. With no thread given a CPU since the stop (the scheduler's counts), that time is booked
    late, the call's own, and recorded; once a thread is given one, it ran while stopped (the test above)."""
    calls = callee("return inputs[0] + 1")
    calls.load([torch.zeros(4)])
    calls.call(time.monotonic() + 30)
    if calls.freezer.switches() is None:
        pytest.skip("this kernel counts no schedules (no /proc/PID/task/TID/schedstat)")
    read = calls.freezer.cpu_by_pid
    monkeypatch.setattr(calls.freezer, "cpu_by_pid", lambda: {
        pid: ns + (3_000_000 if pid == calls.worker_pid else 0) for pid, ns in read().items()})
    calls.call(time.monotonic() + 30)
    assert calls.late_ns == 3_000_000 and calls.outside_ns == 0


def test_a_copy_the_kernel_goes_on_with_after_the_stop_is_inside_the_call(callee):
    """Held out (red team, 2026-12-05): a thread inside a system call that only a fatal signal interrupts (here a
    `pread` of 512 MiB from a memfd) keeps working in the kernel after SIGSTOP was sent; the clock stopped at the
    send, the outputs were read once it had finished: a 32 ms copy credited 17 ms, reward 1 -> 3. The call now ends
    when every thread shows stopped."""
    size = 512 << 20
    fd = os.memfd_create("probe")
    os.ftruncate(fd, size)
    buffer = bytearray(size)
    os.preadv(fd, [buffer], 0)  # (the pages exist: the timing below is the copy's)
    copy_s = float("inf")
    for _ in range(3):  # (the fastest: a copy slowed by a neighbour's load, 219 ms for 32, failed an honest window)
        began = time.perf_counter()
        os.preadv(fd, [buffer], 0)
        copy_s = min(copy_s, time.perf_counter() - began)
    os.close(fd)
    del buffer
    calls = callee("if not state:\n"
                   f"    state['fd'] = os.memfd_create('probe'); os.ftruncate(state['fd'], {size})\n"
                   f"    state['buffer'] = bytearray({size}); os.preadv(state['fd'], [state['buffer']], 0)\n"
                   "    return inputs[0] + 1\n"
                   "threading.Thread(target=os.preadv, args=(state['fd'], [state['buffer']], 0)).start()\n"
                   "time.sleep(0.002)  # (inside the read by now)\n"
                   "return inputs[0] + 1")
    calls.load([torch.zeros(4)])
    calls.call(time.monotonic() + 60)  # (the memfd made and read once)
    call = calls.call(time.monotonic() + 60)
    assert call.window_us >= 0.5 * copy_s * 1e6, (call.window_us, copy_s)


def test_the_window_holds_the_callees_work_whatever_clock_it_fakes(callee):
    calls = callee("time.perf_counter = time.monotonic = lambda: 0.0\n"
                   "time.perf_counter_ns = time.monotonic_ns = lambda: 0\n"
                   "time.sleep(0.05)\n"
                   "return inputs[0]")
    calls.load([torch.zeros(4)])
    assert calls.call(time.monotonic() + 30).window_us >= 50_000


def test_descriptors_a_callee_sends_with_its_answers_are_closed(callee):
    """Held out (red team, 2026-12-05): 16 descriptors on every `done`, kept by the warm reference worker that later
    evaluations share, until it could open no more."""
    calls = callee("import os, cuda_agent.judge.candidate.callee as c\n"
                   "if not state:\n"
                   "    real = c.send\n"
                   "    c.send = lambda sock, msg, fds=(): real(sock, msg, [os.open('/dev/null', os.O_RDONLY)\n"
                   "                                                        for _ in range(16)])\n"
                   "    state['sent'] = 1\n"
                   "return inputs[0] * 2")
    held = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        calls.load([torch.randn(100)])
        read(calls, calls.call(time.monotonic() + 30))
    assert len(os.listdir("/proc/self/fd")) - held < 16


def test_an_input_changed_in_place_is_seen_by_the_trusted_side(callee):
    calls = callee("inputs[0][7] = 42.0\nreturn inputs[0].clone()")
    calls.load([torch.zeros(16), torch.ones(2)])
    calls.call(time.monotonic() + 30)
    assert calls.changed_inputs() == [0]


def test_an_output_aliasing_an_input_is_refused(callee):
    calls = callee("return inputs[0][2:]")
    calls.load([torch.zeros(16)])
    with pytest.raises(Unreadable, match="aliases an input"):
        calls.outputs(calls.call(time.monotonic() + 30))


@pytest.mark.parametrize("body, message", [
    ("return torch.Tensor._make_subclass(type('Lazy', (torch.Tensor,), {}), inputs[0].clone())",
     "is a Lazy, not a plain torch.Tensor"),
    ("return type('Proxy', (), {'__eq__': lambda a, b: True})()", "is a Proxy, not a tensor or number"),
])
def test_outputs_that_are_not_plain_tensors_are_refused(callee, body, message):
    calls = callee(body)
    calls.load([torch.zeros(4)])
    with pytest.raises(Unreadable, match=message):
        calls.outputs(calls.call(time.monotonic() + 30))


def test_a_description_of_memory_the_callee_does_not_have_is_unreadable():
    here = [{"path": "output", "kind": "tensor", "dtype": "float32", "shape": [4], "strides": [1], "ptr": 16}]
    with pytest.raises(Unreadable, match="output"):
        read_outputs(here, 1 << 20, [], process_reader(subprocess.os.getpid()))
    huge = [{**here[0], "shape": [1 << 40]}]
    with pytest.raises(Unreadable, match="more than"):
        read_outputs(huge, 1 << 20, [], process_reader(subprocess.os.getpid()))


def test_a_few_bytes_described_as_a_huge_tensor_are_not_copied_out():
    """Held out (red team, 2026-12-04): `torch.zeros(1).expand(1 << 40)` spans 4 bytes; the trusted side's copy of it
    asked for 4 TiB and killed the reference worker (which no cgroup bounds: a size that fits would take the memory)."""
    one = torch.zeros(1)
    expanded = [{"path": "output", "kind": "tensor", "dtype": "float32", "shape": [1 << 40], "strides": [0],
                 "ptr": one.data_ptr()}]
    with pytest.raises(Unreadable, match="more than"):
        read_outputs(expanded, 1 << 20, [], process_reader(subprocess.os.getpid()))
    two = [{**expanded[0], "shape": [1 << 17], "path": f"output[{i}]"} for i in range(2)]  # 512 KiB each
    assert len(read_outputs(two[:1], 1 << 20, [], process_reader(subprocess.os.getpid()))) == 1
    with pytest.raises(Unreadable, match=r"output\[2\]: .*more than"):  # the limit holds for a call's outputs
        read_outputs(two + [{**two[0], "path": "output[2]"}], 1 << 20, [], process_reader(subprocess.os.getpid()))


def test_outputs_are_read_no_larger_than_the_references(callee):
    """Held out (red team, 2026-12-05): a wrong shape described as 2 GiB (4 bytes expanded) was copied, and cloned,
    before its shape was compared: the warm reference worker's memory grew by gigabytes (16 GiB allowed a call)."""
    calls = callee("return torch.zeros(1).expand(1 << 24)")  # 64 MiB described
    calls.load([torch.randn(1000)])
    call = calls.call(time.monotonic() + 30)
    with pytest.raises(Unreadable, match="more than"):
        calls.outputs(call, expected_bytes=4000 + (1 << 20))
    assert len(calls.outputs(call)[0]) == 1  # (under the call's own limit alone it is read)


def test_a_call_that_does_not_return_in_time_fails_and_one_that_raises_says_why(callee):
    slow = callee("time.sleep(5)")
    slow.load([torch.zeros(1)])
    with pytest.raises(CallFailed) as failed:
        slow.call(time.monotonic() + 0.3)
    assert failed.value.how == "timeout"
    raising = callee("raise ValueError('no kernel for this shape')")
    raising.load([torch.zeros(1)])
    with pytest.raises(CallFailed, match="no kernel for this shape") as failed:
        raising.call(time.monotonic() + 30)
    assert failed.value.how == "failed"


def test_a_callee_that_exits_during_a_call_is_reported_as_ended(callee):
    calls = callee("import os\nos._exit(3)")
    calls.load([torch.zeros(1)])
    with pytest.raises(CallFailed) as failed:
        calls.call(time.monotonic() + 30)
    assert failed.value.how == "ended"


def test_the_freezer_sees_a_process_end():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with pytest.raises(CandidateGone):
        Freezer([proc.pid]).stop()
    with pytest.raises(CandidateGone):
        process_cpu_ns(proc.pid)


def test_the_freezer_never_signals_a_later_process_given_the_same_id():
    """Process ids wrap at pid_max (32,768 here): a freezer whose candidate has ended must neither stop nor read the
    process that gets its id next (an evaluation freezing another's candidate fails it: "ran while stopped")."""
    from pathlib import Path

    from cuda_agent.judge.trusted.freezer import thread_states

    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    gone = subprocess.Popen(sleeper)
    freezer = Freezer([gone.pid])
    gone.kill()
    gone.wait()
    try:
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(gone.pid - 1))
    except OSError:
        pytest.skip("the next process id cannot be chosen here (root in the PID namespace needed)")
    later = subprocess.Popen(sleeper)
    try:
        if later.pid != gone.pid:
            pytest.skip("another process took the id first")
        with pytest.raises(CandidateGone):
            freezer.stop()
        assert not set(thread_states(later.pid)) & {"T", "t"}, thread_states(later.pid)
        with pytest.raises(CandidateGone):
            freezer.cpu_by_pid()
    finally:
        later.kill()
        later.wait()
        freezer.close()


def test_input_buffers_carry_flat_cpu_inputs_and_see_changes():
    inputs = [torch.arange(6, dtype=torch.float32).reshape(2, 3), 7, torch.tensor([True, False])]
    buffer = InputBuffer(layout_of(inputs))
    buffer.write(inputs)
    views, _ = map_inputs(subprocess.os.dup(buffer.fd), buffer.layout)
    assert torch.equal(views[0], inputs[0]) and views[1] == 7 and torch.equal(views[2], inputs[2])
    assert buffer.changed() == []
    views[0][1, 2] = -1.0
    assert buffer.changed() == [0]
    with pytest.raises(InputError, match="nested|only tensors"):
        layout_of([[torch.zeros(1)]])
    with pytest.raises(InputError, match="CPU or CUDA tensors"):  # (a GPU buffer carries CUDA ones, `gpu_calls`)
        layout_of([torch.zeros(1, device="meta")])
    assert [item.get("device") for item in buffer.layout] == ["cpu", None, "cpu"]
    buffer.close()


def test_the_gpu_calls_order_message_is_part_of_the_protocol():
    from cuda_agent.judge.wire.call_protocol import Order, decode, encode
    from cuda_agent.judge.wire.gpu_order import flag_value

    assert decode(encode(Order())) == Order()
    assert [flag_value(k) for k in range(3)] == [1, 2, 3]  # flags start at 0: call 0 must not pass at once


def test_an_unknown_call_stream_is_refused_with_the_choices(monkeypatch):
    from cuda_agent.judge.wire.gpu_order import CALL_STREAM_ENV, call_stream

    monkeypatch.setenv(CALL_STREAM_ENV, "per-thread")
    with pytest.raises(ValueError, match="CUDA_AGENT_CALL_STREAM='per-thread': expected one of legacy, torch"):
        call_stream()


def test_a_poll_is_answered_running_by_a_callee_whose_stream_has_not_failed():
    # (On the GPU, `GpuCalls` polls while a window stays open: a context that died answers `Failed` instead.)
    from cuda_agent.judge.candidate.callee import Callee
    from cuda_agent.judge.wire.call_protocol import End, Poll, Running, send

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        send(ours, Poll(3))
        send(ours, End())
        assert Callee(theirs, lambda inputs, fn: None).serve() == (0, 0)
        assert receive(ours)[0] == Running(3)


def test_the_baseline_callee_dies_with_its_reference_worker(tmp_path):
    # A stopped callee left behind would hold its memory, and the pipes of whoever reads the reference worker's
    # output, for good (a CI run once gathered 70 of them and was killed for memory).
    script = tmp_path / "parent.py"
    script.write_text("from cuda_agent.judge.trusted import baseline_callee\n"
                      f"calls, proc = baseline_callee.start({{'task_path': {str(TASK)!r}, 'backend': 'cpu', "
                      "'allow_tf32': False, 'compile_mode': 'default', 'seed': 1}, 0)\n"
                      "print(proc.pid, flush=True)\nimport time\ntime.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while subprocess.os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not subprocess.os.path.exists(f"/proc/{child}")


def test_the_freezer_waits_for_the_cpu_clock_to_hold_still_after_the_threads_show_stopped(monkeypatch):
    """A thread shows `T` before it leaves its CPU, and the kernel books its last slice of CPU time only then: a
    clock read at once moved later while the process was stopped (an honest kernel failed "ran while stopped" on
    the H200). `settle` returns once the clock holds still."""
    from cuda_agent.judge.trusted import freezer as module

    clock = iter([100, 2_000, 3_050, 3_050, 3_050, 3_050])
    monkeypatch.setattr(module, "thread_states", lambda pid: ["T", "T"])
    monkeypatch.setattr(module, "process_cpu_ns", lambda pid: next(clock))
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        freezer = Freezer([proc.pid])
        freezer.settle()
        assert freezer.cpu_ns() == 3_050  # what a later read gives: no CPU time shows up between calls
    finally:
        freezer.close()
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("sent", [16, 64])  # (an empty message with them; more than the 16 a message may carry)
def test_descriptors_sent_with_a_message_the_trusted_side_refuses_are_closed(callee, sent):
    """Red team 2026-12-06: an empty message (read as the socket closing) or one whose descriptors were cut off
    (more than 16) was refused with its descriptors left open in the reference worker, which later evaluations share:
    16 a call failed this way, each a memfd that could hold the candidate's whole memory (freed by no cgroup once the
    candidate is gone; 1 GiB measured held after its process ended)."""
    calls = callee("import array, os, socket, cuda_agent.judge.candidate.callee as c\n"
                   "real = c.send\n"
                   f"def forged(sock, msg, fds=(), n={sent}):\n"
                   "    made = [os.memfd_create('held') for _ in range(n)]\n"
                   "    sock.sendmsg([b'' if n == 16 else b'{}'], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,\n"
                   "                                           array.array('i', made))])\n"
                   "    real(sock, msg, fds)\n"
                   "c.send = forged\n"
                   "return inputs[0] * 2")
    held = len(os.listdir("/proc/self/fd"))
    calls.load([torch.randn(100)])
    with pytest.raises(CallFailed):
        calls.call(time.monotonic() + 30)
    assert len(os.listdir("/proc/self/fd")) - held < 8, len(os.listdir("/proc/self/fd")) - held
