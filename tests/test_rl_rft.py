"""Rejection fine-tuning data: which agent trajectories are kept, and the export."""

import json

import pyarrow.parquet as pq

from cuda_agent.rl.rft import export


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
