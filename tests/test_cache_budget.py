"""The build caches' size budget (workspace/cache_budget.py): least recently used entries go beyond it, none in use."""

import fcntl
import os
import time
from pathlib import Path

from conftest import TASKS
from cuda_agent.workspace import cache_budget
from cuda_agent.workspace.candidate import load_candidate

HOUR = 3600.0
KEY = "ab" * 32


def entry(path: Path, size: int, age_s: float, now: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix in (".o", ".log"):
        path.write_bytes(b"x" * size)
    else:  # a published library's folder
        path.mkdir()
        (path / "lib.so").write_bytes(b"x" * size)
    os.utime(path, (now - age_s, now - age_s))
    return path


def test_the_least_recently_used_entries_go_beyond_the_budget_but_none_used_within_the_grace(tmp_path):
    now = time.time()
    objects, extensions = tmp_path / "build" / "objects", tmp_path / "extensions"
    oldest = entry(objects / "a-1.o", 400, 5 * HOUR, now)
    library = entry(extensions / ("cd" * 32), 300, 4 * HOUR, now)
    failed = entry(extensions / "failed" / "m.log", 100, 3 * HOUR, now)
    newer = entry(objects / "b-1.o", 300, 2 * HOUR, now)
    recent = entry(objects / "c-1.o", 500, 0.1 * HOUR, now)  # used within the grace: stays whatever the budget
    entry(tmp_path / "build" / "pch" / "x.o", 10_000, 9 * HOUR, now)  # not counted
    (objects / "a.deps").write_text("[]")  # manifests and locks are not entries
    assert cache_budget.trim(tmp_path, 2000, now=now).removed == 0  # 1,600 bytes: within the budget

    trimmed = cache_budget.trim(tmp_path, 1000, now=now)  # down to 800: the oldest first, until the grace
    assert trimmed.total_bytes == 1600 and trimmed.removed == 3 and trimmed.freed_bytes == 800
    assert not oldest.exists() and not library.exists() and not failed.exists()
    assert newer.exists() and recent.exists() and (objects / "a.deps").exists()

    trimmed = cache_budget.trim(tmp_path, 100, now=now)  # over budget, but the last two are recent enough
    assert trimmed.removed == 1 and not newer.exists() and recent.exists()


def test_a_library_being_published_is_not_removed(tmp_path):
    now = time.time()
    library = entry(tmp_path / "extensions" / KEY, 1000, 5 * HOUR, now)
    with open(tmp_path / "extensions" / f"{KEY}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (another process's InlineBuilder.build holds it)
        pid = os.fork()
        if pid == 0:  # flock is per open file: a trim in another process must find it held
            os._exit(cache_budget.trim(tmp_path, 10, now=now).removed)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert library.exists()
    assert cache_budget.trim(tmp_path, 10, now=now).removed == 1 and not library.exists()


def test_a_cached_object_is_touched_when_a_build_uses_it(cpu_judge, tmp_path):
    """A build served from the cache marks what it used, so an object used every day is not the first to go."""
    candidate = load_candidate(TASKS.parent / "candidates" / "affine_relu_ok")
    first = cpu_judge.builder.build(candidate, tmp_path / "first")
    assert first.ok, first.error
    objects = sorted((cpu_judge.cache_dir / "build" / "objects").glob("*.o"))
    long_ago = time.time() - 10 * HOUR
    for obj in objects:
        os.utime(obj, (long_ago, long_ago))
    again = cpu_judge.builder.build(candidate, tmp_path / "again")
    assert again.ok and all(step.cached for step in again.steps if step.source != "<link>"), again.steps
    used = [obj for obj in objects if obj.stat().st_mtime > long_ago + HOUR]
    assert len(used) == len([s for s in again.steps if s.source != "<link>"]), (len(used), again.steps)


def test_an_entry_used_after_the_trim_listed_it_is_not_removed(tmp_path, monkeypatch):
    """Red team 2026-12-06: a trim lists (and sizes) every entry first, then removes the oldest by the times it
    listed: an object a build found in the cache and touched meanwhile (to link it seconds later), or a library
    `InlineBuilder.build` touched under its lock and the judge then copies for its candidate, was removed all the
    same: the honest candidate's link failed ("cannot find ...o") or its library copy did. The window is the
    listing of every entry (thousands in an RL run) and the removals before it."""
    now = time.time()
    obj = entry(tmp_path / "build" / "objects" / "a-1.o", 400, 5 * HOUR, now)
    library = entry(tmp_path / "extensions" / KEY, 300, 4 * HOUR, now)
    listed = cache_budget.entries

    def listing_then_used(cache_dir):
        found = listed(cache_dir)
        cache_budget.touch(obj)  # (a build in another thread: `Builder._compile` found it cached)
        with open(tmp_path / "extensions" / f"{KEY}.lock", "w") as lock:  # (`InlineBuilder.build`, cached)
            fcntl.flock(lock, fcntl.LOCK_EX)
            cache_budget.touch(library)
        return found

    monkeypatch.setattr(cache_budget, "entries", listing_then_used)
    trimmed = cache_budget.trim(tmp_path, 10, now=time.time())
    assert obj.exists() and library.exists(), trimmed


def test_one_build_cannot_add_more_than_its_share_to_the_cache(cpu_judge, tmp_path, monkeypatch):
    """Red team 2026-12-06: every entry is kept for the grace period whatever the budget, and a build's objects were
    all cached: 16 units of an assembler's `.fill` (240 MB each) added 3.6 GiB in 11 s, 256 units (a candidate's
    most) would add ~60 GiB, and `trim` removed none of it: the judge's disk filled by one evaluation. A build's new
    objects now take at most `BUILD_OBJECT_BYTES` of the cache together (lowered here to keep the test small); the
    rest are linked from the build folder, so the build itself still succeeds."""
    import shutil

    from cuda_agent.workspace import build

    monkeypatch.setattr(build, "BUILD_OBJECT_BYTES", 8 << 20, raising=False)
    source = tmp_path / "fill"
    shutil.copytree(TASKS.parent / "candidates" / "affine_relu_ok", source)
    for i in range(4):
        (source / "kernels" / f"pad{i}.cpp").write_text(
            f'asm(".section .data\\n.globl pad{i}\\npad{i}:\\n.fill 6000000, 1, {i + 1}\\n.text\\n");\n')
    objects = cpu_judge.cache_dir / "build" / "objects"
    before = {obj: obj.stat().st_size for obj in objects.glob("*.o")}
    built = cpu_judge.builder.build(load_candidate(source), tmp_path / "build")
    assert built.ok and any("not cached" in step.output for step in built.steps), built.error
    added = sum(obj.stat().st_size for obj in objects.glob("*.o") if obj not in before)
    assert added <= 8 << 20, f"{added >> 20} MiB of new objects cached by one build"
