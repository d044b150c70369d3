"""Rejection fine-tuning data: which agent trajectories are kept, and the export."""

import json

import pyarrow.parquet as pq

from cuda_agent.rl.rft import export, run_folders


def call(name, **arguments):
    return {"id": "c", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def episode(*turns, reward=2, violations=()):
    """Trajectory records: each turn is (tool_calls, observations) with observations as (text, extra fields)."""
    records = [{"type": "system", "message": {"role": "system", "content": "S"}},
               {"type": "user", "message": {"role": "user", "content": "T"}}]
    for n, (calls, observations) in enumerate(turns, 1):
        records.append({"type": "assistant", "turn": n, "message": {"role": "assistant", "content": "",
                                                                     "tool_calls": calls}})
        if not calls:
            records.append({"type": "user", "message": {"role": "user", "content": "No tool was called."}})
        for text, extra in observations:
            records.append({"type": "tool", "turn": n, "message": {"role": "tool", "tool_call_id": "c",
                                                                    "content": text}, **extra})
    final = {"reward": reward, "policy_violations": list(violations), "speedup_vs_compile": 1.2}
    records.append({"type": "result", "summary": {"reference": "task.py", "final_verdict": final}})
    return records


OK = ("ok", {})
FIX_LOOP = [([call("read_file", path="model.py")], [OK]),
            ([call("write_file", path="kernels/k.cu", content="a")], [OK]),
            ([call("verify")], [("wrong", {"verdict": {"correct": False}})]),
            ([call("edit", path="kernels/k.cu", old="a", new="b")], [OK]),
            ([call("verify")], [("right", {"verdict": {"correct": True}})]),
            ([call("finish")], [OK])]
CASES = {
    "good": (episode(*FIX_LOOP), None),
    "low": (episode(*FIX_LOOP, reward=-1), "reward below 1"),
    "violation": (episode(*FIX_LOOP, violations=["torch op"]), "policy violation"),
    "nudged": (episode(([], []), *FIX_LOOP), "a reply without a tool call"),
    "hallucinated": (episode(([call("run_tests")], [("error: unknown tool 'run_tests'; the tools are: ...",
                                                     {"error": True})]), *FIX_LOOP), "a hallucinated tool"),
    "malformed": (episode(([call("read_file", file="x")], [("error: read_file: bad arguments (...)",
                                                            {"error": True})]), *FIX_LOOP), "malformed arguments"),
    "looping": (episode(*[([call("glob", pattern="*")], [OK])] * 3, *FIX_LOOP), "the same call 3 times in a row"),
    "unreadable": (episode(*FIX_LOOP)[:4] + [{"type": "user", "turn": 1, "malformed": 1, "message": {
        "role": "user", "content": "Your tool call could not be read: <tool_call> block 2: invalid JSON"}}]
        + episode(*FIX_LOOP)[4:], "an unreadable tool call"),
    "stubborn": (episode(([call("verify")], [("wrong", {"verdict": {"correct": False}})]),
                         ([call("verify")], [("wrong", {"verdict": {"correct": False}})]), *FIX_LOOP),
                 "a failing call sent again unchanged"),
}


def test_only_clean_successful_trajectories_are_kept_and_exported(tmp_path):
    runs = []
    for name, (records, _) in CASES.items():
        run = tmp_path / "runs" / name
        run.mkdir(parents=True)
        (run / "trajectory.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        runs.append(run)
    runs.append(tmp_path / "runs" / "missing")
    stats = export(runs, tmp_path / "rft")
    expected = {}
    for _, why in CASES.values():
        if why:
            expected[why] = expected.get(why, 0) + 1
    assert stats == {"kept": 1, "seen": len(CASES) + 1, "rejected": {**expected, "no trajectory.jsonl": 1}}
    table = pq.read_table(tmp_path / "rft" / "rft.parquet").to_pylist()
    assert len(table) == 1 and table[0]["reward"] == 2 and table[0]["run_dir"].endswith("good")
    messages = json.loads(table[0]["messages"])
    assert [m["role"] for m in messages][:4] == ["system", "user", "assistant", "tool"]
    assert messages == [r["message"] for r in CASES["good"][0][:-1]]
    assert {t["function"]["name"] for t in json.loads(table[0]["tools"])} >= {"verify", "finish"}
    assert (tmp_path / "rft" / "rft.jsonl").read_text().count("\n") == 1


def write_run(folder, records, summary=None):
    """A run folder as the loop leaves it: trajectory.jsonl, summary.json and (with a final verdict)
    best_verdict.json; `summary`: what summary.json says instead of the result record's summary."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trajectory.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = summary or records[-1]["summary"]
    (folder / "summary.json").write_text(json.dumps(summary, indent=2))
    if summary.get("final_verdict"):
        (folder / "best_verdict.json").write_text(json.dumps(summary["final_verdict"], indent=2))


def test_trajectories_the_policy_plants_in_its_workspace_are_never_exported(tmp_path):
    """The policy writes workspace/ of its run folder (and the loop may leave it there): trajectory.jsonl files it
    plants there (with summary.json and best_verdict.json to match), at any depth, are not run folders; a run folder
    whose trajectory claims more than its own verdict files say is refused. The genuine positive run is kept, whether
    the folders come from `run_folders` or from a glob of every trajectory.jsonl."""
    runs = tmp_path / "runs"
    write_run(runs / "level1" / "good", episode(*FIX_LOOP, reward=2))
    failed = runs / "level1" / "failed"  # the episode the policy played: it verified nothing
    write_run(failed, episode(*FIX_LOOP, reward=-1))
    forged = episode(*FIX_LOOP, reward=3)
    for folder in ("workspace", "workspace/copy1", "workspace/a/b/copy2", "workspace/runs/level1/x"):
        write_run(failed / folder, forged)
    killed = runs / "level1" / "killed"  # a run killed mid-episode: no result record, no summary.json
    killed.mkdir()
    (killed / "trajectory.jsonl").write_text(json.dumps(forged[0]) + "\n")
    write_run(killed / "workspace" / "copy", forged)
    claims = runs / "level2" / "claims"  # its trajectory overwritten: the loop's own verdict files disagree
    write_run(claims, forged, summary=episode(*FIX_LOOP, reward=-1)[-1]["summary"])
    verdict = runs / "level2" / "verdict"
    write_run(verdict, forged)
    (verdict / "best_verdict.json").write_text(json.dumps({**forged[-1]["summary"]["final_verdict"], "reward": 1}))

    found = run_folders(runs)
    assert found == sorted([runs / "level1" / "good", failed, killed, claims, verdict])
    assert run_folders(failed / "workspace") == [] and run_folders(failed) == [failed]
    every = sorted(p.parent for p in runs.rglob("trajectory.jsonl"))  # a caller that globs them all: still refused
    stats = export(every, tmp_path / "rft")
    assert stats == {"kept": 1, "seen": 10, "rejected": {
        "inside another run folder": 5, "reward below 1": 1, "unfinished episode": 1,
        "result record contradicts summary.json": 1, "result record contradicts best_verdict.json": 1}}
    table = pq.read_table(tmp_path / "rft" / "rft.parquet").to_pylist()
    assert [(row["run_dir"], row["reward"]) for row in table] == [(str(runs / "level1" / "good"), 2)]
