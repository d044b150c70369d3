"""Held out by a red team (2026-12-05, cpu backend): a candidate whose native thread takes over the call socket
(`tests/data/attacks/proxy_loop.py`: found from `/proc/self/task/TID/syscall` while the harness waits in `recvmsg`,
then `dup2`) and answers the trusted side's calls itself, relaying the rest to the harness. Its kernel was timed
13-28% faster than the same kernel through the harness (the harness's Python handshake, which eager and
torch.compile pay in the baseline callee, skipped), and its calls escaped the in-process audits."""

from pathlib import Path

from conftest import TASKS

from cuda_agent.judge.checks.symbols import symbol_problem

AFFINE = TASKS / "affine_relu.py"
PROXY = Path(__file__).resolve().parent / "data" / "attacks" / "proxy_loop.py"


def test_calls_answered_outside_the_harness_s_callee_are_reported_under_strict(cpu_judge):
    """The same proxy under the strict policy: every call after the first ones is answered by the candidate's own
    thread, so the harness's audited callee (op audit, all-threads profiler, integrity checks) never sees it; the
    verdict was correct with no policy violation. The trusted side knows how many calls it made and the harness
    says how many it served (`Ended.calls`): a second line (the candidate could rewrite that count too), but the
    plain proxy is then visible."""
    verdict = cpu_judge.evaluate(AFFINE, PROXY)
    assert not verdict.correct and "served" in (verdict.error or ""), (verdict.correct, verdict.error,
                                                                          verdict.policy_violations)


def test_torch_compute_in_a_proxied_call_is_a_policy_violation_whatever_the_relayed_report_says(cpu_judge,
                                                                                                 tmp_path):
    """The proxy's native thread computes with torch's own kernels (C++ tensor methods, which the source scan does
    not see): the all-threads profiler records them (`aten::mul` 338x ...), but its report reaches the trusted side
    inside the harness's `ended` answer, which the proxy relays with `"violations": []` (and the served count made
    the trusted side's). Strict: correct, no policy violation, reward 3 with no kernel of its own."""
    silent = tmp_path / "proxy_torch_silent.py"
    silent.write_text(PROXY.read_text().replace("SILENT = False", "SILENT = True"))
    verdict = cpu_judge.evaluate(AFFINE, silent)
    assert not verdict.correct and "policy violation" in (verdict.error or ""), (verdict.correct, verdict.reward,
                                                                                verdict.policy_violations)
    assert any("at::_ops::mul_Scalar" in v for v in verdict.policy_violations), verdict.policy_violations


def test_torch_ops_linked_into_native_code_are_refused_but_allocation_views_and_fills_are_not():
    """The first line under the audit's report: what the library links, read by the judge (`checks/symbols.py`)."""
    refused = ["at::_ops::mul_Tensor::call(at::Tensor const&, at::Tensor const&)", "at::_ops::t_copy::call(x)",
               "at::_ops::relu::redispatch(c10::DispatchKeySet, at::Tensor const&)",
               "c10::Dispatcher::findSchemaOrThrow(char const*, char const*)"]
    allowed = ["at::_ops::empty_memory_format::call(x)", "at::_ops::fill__Scalar::call(x)",
               "at::_ops::zeros_like::call(x)", "at::_ops::view::call(x)", "at::_ops::contiguous::call(x)"]
    assert all(symbol_problem(name) for name in refused)
    assert not [name for name in allowed if symbol_problem(name)]
