"""The trusted side's own view of where the candidate's CPU time goes (judge/trusted/cpu_sampler.py): torch compute
is found from outside the process even where the in-process op audit's report has been rewritten (modelled here by
switching the audit off: what a candidate that forges the harness's report achieves)."""

import os
import struct

import pytest

from conftest import CANDIDATES, TASKS
from cuda_agent.judge import evaluation as evaluation_module
from cuda_agent.judge.trusted import cpu_sampler

AFFINE = TASKS / "affine_relu.py"
UNAVAILABLE = cpu_sampler.unavailable()
needs_perf = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"no perf events here: {UNAVAILABLE}")

TORCH_FORWARD = "return torch.relu(x * self.scale + self.shift) * 0.5"
THREADED_FORWARD = """out = []
        worker = threading.Thread(target=lambda: out.append(torch.relu(x * self.scale + self.shift) * 0.5))
        worker.start()
        worker.join()
        return out[0]"""
SHORT_THREADS_FORWARD = """parts = list(x.chunk(64))
        def part(i):
            parts[i] = torch.relu(parts[i] * self.scale + self.shift) * 0.5
        for i in range(len(parts)):  # (each thread runs far less than a ms of CPU time: the period)
            worker = threading.Thread(target=part, args=(i,))
            worker.start()
            worker.join()
        return torch.cat(parts)"""
PARKED_THREADS_FORWARD = """parts, done = list(x.chunk(64)), [threading.Event() for _ in range(64)]
        threading.stack_size(1 << 18)
        def part(i):
            parts[i] = torch.relu(parts[i] * self.scale + self.shift) * 0.5
            done[i].set()
            threading.Event().wait()  # (parked for good: no count comes back as a thread ends)
        for i in range(len(parts)):
            threading.Thread(target=part, args=(i,), daemon=True).start()
            done[i].wait()
        return torch.cat(parts)"""


@pytest.fixture
def audit_forged(monkeypatch):
    """The in-process audit reports nothing, as a candidate that rewrites its report would have it."""
    real = evaluation_module.Evaluation.candidate_request
    monkeypatch.setattr(evaluation_module.Evaluation, "candidate_request",
                        lambda self, **changed: {**real(self, **changed), "audit_ops": False})


@needs_perf
def test_an_honest_kernel_spends_its_calls_in_its_own_library(cpu_judge):
    verdict = cpu_judge.evaluate(AFFINE, CANDIDATES / "affine_relu_ok")
    sampled = verdict.timing["candidate"]["cpu_samples"]
    assert verdict.reward >= 1 and not verdict.policy_violations, verdict.error
    timed = verdict.timing["candidate"]["iters"]  # every call is watched, the timed ones too
    # (a sample a ms of CPU time: some 20-110 a verdict here, the count of timed calls varying with the machine's noise)
    assert sampled["samples"] >= 10 and sampled["calls"] > timed, (sampled, timed)
    for baseline in ("eager", "compile"):  # watched alike: they pay what the candidate's calls pay
        assert verdict.timing[baseline]["cpu_samples"]["samples"] > 0, verdict.timing[baseline]
    shares = sampled["shares"]
    assert shares["foreign"] / (shares["own"] + shares["foreign"]) < 0.4, sampled
    assert sampled["mapped_in_calls"] == 0, sampled  # (the harness maps no code in a call: what does is the candidate)


@needs_perf
@pytest.mark.parametrize("forward", [TORCH_FORWARD, THREADED_FORWARD, SHORT_THREADS_FORWARD, PARKED_THREADS_FORWARD],
                         ids=["in_forward", "in_a_thread_per_call", "in_threads_shorter_than_the_period",
                              "in_threads_shorter_than_the_period_that_never_end"])
def test_torch_compute_is_found_from_outside_when_the_audit_s_report_is_forged(cpu_judge, make_workspace,
                                                                               audit_forged, forward):
    """Without the sampler these are correct, reward 1 or more, under strict; a thread started and joined inside each
    call is sampled too (the threads it starts inherit the events)."""
    ws = make_workspace(edits={"model_new.py": [
        ("import torch\n", "import threading\n\nimport torch\n"),
        ("return cuda_extension.affine_relu_forward(x, self.scale, self.shift, 0)", forward)]})
    verdict = cpu_judge.evaluate(AFFINE, ws)
    sampled = verdict.timing.get("candidate", {}).get("cpu_samples")
    assert verdict.reward == -1 and verdict.correct is False, (verdict.reward, verdict.error, sampled)
    assert verdict.policy_violations and verdict.policy_violations[0].startswith("torch compute: "), \
        (verdict.error, sampled)
    assert "libtorch_cpu.so" in verdict.policy_violations[0]


def test_events_that_cannot_be_opened_fail_the_call_saying_which_limit(monkeypatch):
    """Events are threads x CPUs (torch starts a thread a CPU: 4,096 events on a 64-core machine): the open-file
    limit is raised to its hard limit first, and where they still cannot all be opened the call fails saying how
    many, why and what to do (nothing half-open is kept: an unwatched call is not judged under strict)."""
    import errno
    import os
    import resource

    opened = []

    def refuse_the_third(tid, cpu, period_ns):
        if len(opened) == 2:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        opened.append(tid)
        return os.open(os.devnull, os.O_RDONLY)

    monkeypatch.setattr(cpu_sampler, "_open_event", refuse_the_third)
    monkeypatch.setattr(cpu_sampler, "_online_cpus", lambda: [0, 1, 2])
    monkeypatch.setattr(cpu_sampler._Event, "__init__", lambda self, tid, cpu, period_ns: setattr(
        self, "fd", cpu_sampler._open_event(tid, cpu, period_ns)) or setattr(self, "ring", open(os.devnull, "rb")))
    sampler = cpu_sampler.CpuSampler(os.getpid(), [])
    with pytest.raises(cpu_sampler.SamplerFailed, match=r"could not open its \d+ events \(\d+ threads x \d+ CPUs: "
                                                        r"Too many open files\); raise the open-file limit"):
        sampler.arm()
    assert sampler.events == [] and len(opened) == 2
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft == hard


def _event(ring: bytearray) -> cpu_sampler._Event:
    """An event whose ring is `ring` (records written by the test, not the kernel)."""
    event = cpu_sampler._Event.__new__(cpu_sampler._Event)
    event.ring, event.sampled, event.period_ns = ring, {}, cpu_sampler.PERIOD_NS
    return event


def test_the_time_of_threads_that_ended_unsampled_counts_as_foreign():
    """Each thread it starts begins its period afresh: the count each ending thread leaves in the ring (a read record)
    less its samples' periods is time no sample saw, and so is all the CPU time of a live thread with no sample (one
    kept alive, parked, leaves no count in the ring); it adds up across threads and calls, a foreign sample a period."""
    period = cpu_sampler.PERIOD_NS
    ring = bytearray((cpu_sampler.RING_PAGES + 1) * cpu_sampler._PAGE)
    at = cpu_sampler._PAGE
    for i in range(2):  # thread 7: two samples, then it ends having run 2.6 periods; thread 8: 0.7 periods, unsampled
        struct.pack_into("IHHQIIQ", ring, at + 32 * i, 9, 0, 32, 0x1234, 5, 7, 99 + i)
    struct.pack_into("IHHIIQ", ring, at + 64, 8, 0, 24, 5, 7, int(2.6 * period))
    struct.pack_into("IHHIIQ", ring, at + 88, 8, 0, 24, 5, 8, int(0.7 * period))
    struct.pack_into("QQ", ring, 1024, 112, 0)
    sampler = cpu_sampler.CpuSampler(0, ["/build"])
    sampler.events = [_event(ring)]
    sampler._regions = lambda: []
    sampler.collect()
    assert sampler.counts["foreign"] == 2 and sampler.events[0].sampled == {}
    assert sampler.unseen == 1 and sampler.ended_unseen_ns == int(1.3 * period)  # (0.3 carried to the next call)
    summary = sampler.summary()
    assert summary["samples"] == 3 and summary["unseen"] == 1 and summary["foreign_files"][cpu_sampler.UNSEEN] == 1
    sampler.ended_unseen_ns = 0  # a live thread no sample saw: all its CPU time since the events opened
    sampler._thread_cpu = lambda: {7: 9 * period, 9: int(20.5 * period), 10: int(2.5 * period)}
    sampler.cpu_at_arm = {10: 2 * period}  # (thread 7 sampled: its kernel time, page faults, not told apart)
    sampler.events[0].ring = bytearray(len(ring))
    sampler.collect()
    assert sampler.unseen == 21 and sampler.violations()[0].startswith("torch compute: 100% ")


def _ring(samples: list[tuple[int, int, int]]) -> bytearray:
    """A ring holding `samples`, (address, thread, time), as the kernel writes them."""
    ring = bytearray((cpu_sampler.RING_PAGES + 1) * cpu_sampler._PAGE)
    for i, (ip, tid, when) in enumerate(samples):
        struct.pack_into("IHHQIIQ", ring, cpu_sampler._PAGE + 32 * i, 9, 0, 32, ip, 5, tid, when)
    struct.pack_into("QQ", ring, 1024, 32 * len(samples), 0)
    return ring


OWN, FOREIGN = 0x1000, 0x9000  # addresses in its own library and in torch's


def _placing() -> cpu_sampler.CpuSampler:
    """A sampler whose candidate maps its own library at `OWN` and torch's at `FOREIGN`; its rings set by the test."""
    sampler = cpu_sampler.CpuSampler(0, ["/build"])
    sampler.events = [_event(bytearray(0))]
    sampler._regions = lambda: [(OWN, OWN + 0x1000, "/build/kernels.so", "1:2 3", 0),
                                (FOREIGN, FOREIGN + 0x1000, "/usr/lib/libtorch_cpu.so", "1:2 4", 0)]
    return sampler


def test_own_samples_of_a_call_where_torch_s_thread_went_unsampled_still_ran_beside_it():
    """Stop 62's CI (2 cores, loaded): torch's ~1.7 ms a call on the main thread, a pad of the candidate's own on a
    thread per call beside it; in calls where no sample caught the main thread in torch, the pad's samples counted
    as own, and torch passed under 80% foreign. A live thread mostly in foreign code over its calls so far is
    torch's in every call, for the threads that are not (threads that each fill with torch, then compute, ran their
    phases together: stop 63's CI); a thread that has ended is no one's."""
    sampler, own, foreign, ms = _placing(), OWN, FOREIGN, 1_000_000
    sampler._thread_cpu = lambda: {5: 0, 9: 0}
    calls = [[(foreign, 5, 1000 * ms), (foreign, 5, 1001 * ms), (own, 6, 1000 * ms),  # torch seen on thread 5
              (foreign, 9, 1500 * ms), (foreign, 9, 1501 * ms)],  # and on 9, a thread of torch's fills
             [(own, 7, 2000 * ms), (own, 7, 2001 * ms),  # torch's time on thread 5 under a period: unseen
              (own, 9, 2500 * ms)]]  # thread 9 in its own code: mostly foreign itself, its phases are 5's
    for samples in calls:
        sampler.events[0].ring = _ring(samples)
        sampler.collect()
    assert sampler.beside["own"] == 3 and sampler.counts == {"own": 4, "foreign": 4, "interpreter": 0}
    sampler._thread_cpu = lambda: {8: 0}  # threads 5 and 9 have ended; thread 8 is an honest one
    sampler.events[0].ring = _ring([(own, 8, 3000 * ms), (own, 8, 3001 * ms)])
    sampler.collect()
    assert sampler.beside["own"] == 3 and sampler.balance == {8: -2}


def test_threads_of_its_own_beside_a_main_thread_that_only_allocates_are_not_torch_s():
    """An honest design: the main thread allocates the outputs (torch's allocator: foreign, a few samples in all its
    calls) and waits while threads of its own compute. The main thread is mostly foreign, so all their samples ran
    beside it; under `MIN_FOREIGN` foreign samples nothing is decided."""
    sampler, own, foreign, ms = _placing(), OWN, FOREIGN, 1_000_000
    sampler._thread_cpu = lambda: {5: 0, 6: 0, 7: 0}
    for call in range(cpu_sampler.MIN_FOREIGN):
        at = 1000 * ms * (call + 1)
        workers = [(own, tid, at + i * ms) for tid in (6, 7) for i in range(5)]
        sampler.events[0].ring = _ring([(foreign, 5, at)] * (call < cpu_sampler.MIN_FOREIGN - 1) + workers)
        sampler.collect()
    assert sampler.beside["own"] == 100 and sampler.counts["foreign"] == cpu_sampler.MIN_FOREIGN - 1
    assert sampler.violations() == []
    sampler.events[0].ring = _ring([(foreign, 5, 99_000 * ms)])  # 10 ms of torch: the rule decides (the limit of
    # such a design: its allocations under 10 ms in all its calls)
    sampler.collect()
    assert sampler.violations()[0].startswith("torch compute: 100% ")


def test_samples_the_full_ring_lost_count_as_foreign():
    """A call that fills a thread's ring with its own code first (2,048 samples: 2 s of CPU on one CPU) would have the
    rest of the call unseen: the kernel's count of lost samples counts as foreign."""
    ring = bytearray((cpu_sampler.RING_PAGES + 1) * cpu_sampler._PAGE)
    at = cpu_sampler._PAGE
    struct.pack_into("IHHQIIQ", ring, at, 9, 0, 32, 0x1234, 5, 6, 99)  # a sample (ip, pid, tid, time), 4,000 lost
    struct.pack_into("IHHQQ", ring, at + 32, 2, 0, 24, 7, 4000)
    struct.pack_into("QQ", ring, 1024, 56, 0)  # data_head, data_tail
    event = _event(ring)
    assert event.drain() == ([(0x1234, 6, 99)], 4000, [], 0)
    assert struct.unpack_from("Q", ring, 1032)[0] == 56  # read up to the head
    sampler = cpu_sampler.CpuSampler(0, ["/build"])
    sampler.events = [event]
    struct.pack_into("IHHQQ", ring, at + 56, 2, 0, 24, 7, 100)
    struct.pack_into("Q", ring, 1024, 80)
    sampler._regions = lambda: []
    sampler.collect()
    assert sampler.counts["foreign"] == 100 and sampler.foreign_files == {cpu_sampler.LOST: 100}


def test_a_sample_where_an_executable_mapping_was_made_during_the_call_is_foreign(tmp_path):
    """The maps are read once the call is over: where the candidate mapped code during the call (each executable
    mmap or mprotect is a record in the thread's ring), what ran at a sample's time is not known, whatever the maps
    say at the end (its own library's file, here): foreign, in that call."""
    ring = bytearray((cpu_sampler.RING_PAGES + 1) * cpu_sampler._PAGE)
    at = cpu_sampler._PAGE
    name = f"{tmp_path}/build/cuda_extension.so".encode() + b"\0"
    name += b"\0" * (-len(name) % 8)
    struct.pack_into("IHHIIQQQ", ring, at, 1, 0, 40 + len(name), 5, 6, 0x10000, 0x3000, 0)  # mapped 0x10000-0x13000
    ring[at + 40:at + 40 + len(name)] = name
    end = at + 40 + len(name)
    struct.pack_into("IHHIIQQQ", ring, end, 1, 0, 48, 5, 6, 0x50000, 8, 0)  # and 8 bytes elsewhere, named "x"
    ring[end + 40:end + 42] = b"x\0"
    end += 48
    for i, ip in enumerate((0x11000, 0x12fff, 0x13000, 0x20000)):  # samples: two in it, two in the rest of the library
        struct.pack_into("IHHQIIQ", ring, end + 32 * i, 9, 0, 32, ip, 5, 6, 99 + i)
    struct.pack_into("QQ", ring, 1024, end + 128 - at, 0)
    event = _event(ring)
    sampler = cpu_sampler.CpuSampler(0, [tmp_path / "build"])
    sampler.events = [event]
    sampler._regions = lambda: [(0x10000, 0x30000, f"{tmp_path}/build/cuda_extension.so", "00:05 7", 0)]
    sampler.collect()
    assert sampler.counts == {"own": 2, "foreign": 2, "interpreter": 0}, sampler.counts
    assert sampler.summary()["mapped_in_calls"] == 2
    assert list(sampler.foreign_files) == [f"{tmp_path}/build/cuda_extension.so (mapped during the call)"]
    assert cpu_sampler._merged([(5, 9, ""), (1, 3, ""), (2, 4, ""), (9, 10, "")]) == [(1, 4), (5, 10)]


def test_a_writable_executable_mapping_of_its_own_library_is_not_its_own(tmp_path):
    """A private mapping of its library's file made writable and executable at load (before the events exist)
    needs no system call in a call to hold torch's bytes, and madvise(MADV_DONTNEED) gives its pages back to the
    file's before the maps are read (no Anonymous left): a writable executable mapping is foreign, whatever it names.
    A read-only executable one keeps its file's identity."""
    import subprocess
    import sys

    library = tmp_path / "build" / "cuda_extension.so"
    library.parent.mkdir()
    library.write_bytes(bytes(range(256)) * 64)
    child = subprocess.Popen([sys.executable, "-c", f"""import mmap, sys
f = open({str(library)!r}, "rb")
rwx = mmap.mmap(f.fileno(), 16384, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
rx = mmap.mmap(f.fileno(), 16384, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_EXEC)
print("ready", flush=True)
sys.stdin.readline()
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        sampler = cpu_sampler.CpuSampler(child.pid, [tmp_path / "build"])
        ids = sorted(file_id for _, _, path, file_id, _ in sampler._regions() if path == str(library))
    finally:
        child.kill()
    st = library.stat()
    assert ids == sorted([f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x} {st.st_ino}", cpu_sampler.WRITTEN]), ids
    assert sampler._kind(str(library), cpu_sampler.WRITTEN) == "foreign"


def test_a_sample_is_placed_by_the_file_its_address_maps(tmp_path):
    """Its own libraries are those under the judge's build folder only: a library of the same name elsewhere (a copy
    of torch's, renamed, in a folder it writes) is foreign; the interpreter and the C runtime are neither."""
    sampler = cpu_sampler.CpuSampler(0, [tmp_path / "build"])
    assert sampler._kind(f"{tmp_path}/build/cuda_extension.so") == "own"
    assert sampler._kind(f"{tmp_path}/build/extensions/m/m.so") == "own"
    assert sampler._kind(f"{tmp_path}/buildx/cuda_extension.so") == "foreign"
    assert sampler._kind(f"{tmp_path}/candidate/cuda_extension.so") == "foreign"
    assert sampler._kind("/usr/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so") == "foreign"
    assert sampler._kind("[anonymous]") == "foreign"  # code generated at run time
    assert sampler._kind("/usr/lib/x86_64-linux-gnu/libc.so.6") == "interpreter"
    assert sampler._kind("/usr/lib/libpython3.11.so.1.0") == "interpreter"
    assert sampler._kind("/site-packages/torch/lib/libgomp.so.1") == "interpreter"  # (it schedules its own kernels too)
    sampler.counts = {"own": 10, "foreign": 90, "interpreter": 50}  # the interpreter's and runtime's aside
    sampler.foreign_files = {"/x/libtorch_cpu.so": 90}
    assert sampler.violations()[0].startswith("torch compute: 90% ")
    sampler.counts = {"own": 0, "foreign": 30, "interpreter": 40}  # allowed ops only (a constant output): its calls
    assert sampler.violations() == []  # go by in the interpreter
    sampler.counts = {"own": 21, "foreign": 79, "interpreter": 5}
    assert sampler.violations() == []
    sampler.counts = {"own": 0, "foreign": 15, "interpreter": 100}  # too few samples to decide
    assert sampler.violations() == []



@needs_perf
def test_torch_compute_only_in_calls_that_look_unwatched_is_found_when_the_audit_s_report_is_forged(
        cpu_judge, make_workspace, audit_forged):
    """Held out (red team E, 2026-12-06): the sampler watched the verification calls and 12 extra untimed calls, and
    its interrupts (every 50 us) showed as gaps in a 300 us spin: the candidate ran its own kernel where it saw them
    and oneDNN's fused linear + ReLU in the timed calls (7% foreign in the calls sampled), held only by the
    in-process audit, whose report a candidate can forge. Every call is watched now, the timed ones too: there is no
    unwatched call to keep torch for."""
    from test_attacks_redteam_e import DODGE

    if not cpu_judge.sandboxed:
        pytest.skip("no sandbox here")
    ws = make_workspace()
    (ws / "model_new.py").write_text(DODGE.replace("with _pop_mode_temporarily():", "if True:  # (no audit to pop)"))
    verdict = cpu_judge.evaluate(AFFINE, ws)
    sampled = verdict.timing.get("candidate", {}).get("cpu_samples")
    assert verdict.reward == -1 and verdict.correct is False, (verdict.reward, verdict.error, sampled)
    assert verdict.policy_violations and verdict.policy_violations[0].startswith("torch compute: "), \
        (verdict.error, verdict.policy_violations, sampled)


def test_the_sampler_s_period_is_the_judge_s_setting_and_one_that_would_sample_nothing_is_refused():
    """`cpu_sample_period_us` sets the period (1 ms unset); under a microsecond it is refused, not run as an event that
    counts and never samples (every candidate undecided)."""
    from types import SimpleNamespace

    from cuda_agent.judge.config import JudgeConfig
    from cuda_agent.judge.judge import Judge

    def period(us):
        return Judge.sample_period_ns(SimpleNamespace(config=JudgeConfig(cpu_sample_period_us=us)))

    assert period(None) == cpu_sampler.PERIOD_NS == 1_000_000 and period(250) == 250_000
    for bad in (0, -5, 0.4, float("nan")):
        with pytest.raises(ValueError, match="cpu_sample_period_us"):
            period(bad)
