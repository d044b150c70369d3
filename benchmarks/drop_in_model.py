"""The kernel engineer's path end to end on a real CUDA kernel: a Llama (SmolLM2-135M's shape by default, random
weights), its MLP made a task (`task new --hf-model`), a fused SiLU-and-multiply CUDA kernel for it judged
(`eval`), exported (`export`), the whole model checked with every MLP replaced (`check-model`: outputs and time),
and the `kernels` build swapped into every MLP by `kernelize` (outputs and time again).

    python3 benchmarks/drop_in_model.py --out drop_in.json [--layers 30 --hidden 576 --intermediate 1536 --tokens 512]

The kernel is the whole MLP in one C++ call: the three projections as cuBLAS SGEMMs (the judge allows cuBLAS for GEMM
only; torch's own nn.Linear is the same SGEMM), `silu(gate) * up` fused into one pass instead of two, so the MLP
gains little: the point is the path and an honest end-to-end number.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import traceback
from pathlib import Path

import _common  # noqa: F401  (puts src/ on the path)
import torch
from typer.testing import CliRunner

from cuda_agent.cli import app
from cuda_agent.judge.config import JudgeConfig
from cuda_agent.judge.wire.timing import time_callable
from cuda_agent.backend import get_backend

SOLUTION = '''import torch
from torch import nn
from torch.utils.cpp_extension import load_inline

CUDA = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cublas_v2.h>

__global__ void silu_mul_kernel(const float4* __restrict__ g, const float4* __restrict__ u, float4* __restrict__ o,
                                int64_t n4) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        float4 a = g[i], b = u[i], r;
        r.x = a.x / (1.f + __expf(-a.x)) * b.x;
        r.y = a.y / (1.f + __expf(-a.y)) * b.y;
        r.z = a.z / (1.f + __expf(-a.z)) * b.z;
        r.w = a.w / (1.f + __expf(-a.w)) * b.w;
        o[i] = r;
    }
}

// y [rows, n] = x [rows, k] @ w [n, k].T (nn.Linear's layout), cuBLAS column-major: y.T = w @ x.T
static void linear(cublasHandle_t handle, float* y, const float* x, const float* w, int64_t rows, int64_t n,
                   int64_t k) {
    const float one = 1.f, zero = 0.f;
    cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)rows, (int)k, &one, w, (int)k, x, (int)k, &zero, y,
                (int)n);
}

// down(silu(gate(x)) * up(x)): two GEMMs into one buffer, the fused SiLU-and-multiply in place of two passes, a GEMM
torch::Tensor llama_mlp(torch::Tensor x, torch::Tensor wg, torch::Tensor wu, torch::Tensor wd) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat && x.is_contiguous(), "x: contiguous fp32 CUDA");
    TORCH_CHECK(wg.is_contiguous() && wu.is_contiguous() && wd.is_contiguous(), "contiguous weights");
    const int64_t k = x.size(-1), n = wg.size(0), rows = x.numel() / k;
    TORCH_CHECK(n % 4 == 0, "intermediate size: a multiple of 4");
    auto gu = torch::empty({2, rows, n}, x.options());
    auto h = torch::empty({rows, n}, x.options());
    auto out = torch::empty(x.sizes(), x.options());
    cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();
    float* g = gu.data_ptr<float>();
    float* u = g + rows * n;
    linear(handle, g, x.data_ptr<float>(), wg.data_ptr<float>(), rows, n, k);
    linear(handle, u, x.data_ptr<float>(), wu.data_ptr<float>(), rows, n, k);
    const int64_t n4 = rows * n / 4;
    const int blocks = (int)std::min<int64_t>((n4 + 255) / 256, 132 * 16);
    silu_mul_kernel<<<blocks, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<const float4*>(g), reinterpret_cast<const float4*>(u),
        reinterpret_cast<float4*>(h.data_ptr<float>()), n4);
    linear(handle, out.data_ptr<float>(), h.data_ptr<float>(), wd.data_ptr<float>(), rows, k, n);
    return out;
}
"""

ext = load_inline("llama_mlp_fused", cuda_sources=CUDA, functions=["llama_mlp"], extra_cuda_cflags=["-O3"],
                  extra_ldflags=["-lcublas"],
                  cpp_sources="torch::Tensor llama_mlp(torch::Tensor x, torch::Tensor wg, torch::Tensor wu, "
                              "torch::Tensor wd);")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(HIDDEN, INTER, bias=False)
        self.up_proj = nn.Linear(HIDDEN, INTER, bias=False)
        self.down_proj = nn.Linear(INTER, HIDDEN, bias=False)

    def forward(self, x):
        return ext.llama_mlp(x.contiguous(), self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight)
'''


def solution(hidden: int, intermediate: int) -> str:
    return SOLUTION.replace("HIDDEN, INTER", f"{hidden}, {intermediate}").replace("INTER, HIDDEN",
                                                                                    f"{intermediate}, {hidden}")


def cli(*args) -> str:
    """What the command printed on stdout; its whole output when it fails."""
    result = CliRunner().invoke(app, [*map(str, args)])
    if result.exit_code != 0:
        trace = "".join(traceback.format_exception(result.exception)) if result.exception else ""
        raise SystemExit(f"cuda-agent {' '.join(map(str, args[:2]))} failed ({result.exit_code}):\n{result.output}"
                         f"{trace}")
    return result.stdout


def kernelized(model_dir: Path, exported: Path, ids: torch.Tensor) -> dict:
    """The `kernels` build swapped into every MLP by kernelize: outputs against the model as it is, both timed."""
    import transformers
    from kernels import LocalLayerRepository, Mode, kernelize, replace_kernel_forward_from_hub, use_kernel_mapping
    from transformers.models.llama.modeling_llama import LlamaMLP

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    cfg, backend = JudgeConfig(), get_backend("cuda")

    def median_us() -> float:
        return time_callable(lambda: model(ids), backend, cfg.warmup, cfg.min_iters, cfg.max_iters,
                             cfg.target_time_s)["median_us"]

    with torch.no_grad():
        want, before = model(ids).logits, median_us()
        replace_kernel_forward_from_hub(LlamaMLP, "LlamaMLP")
        with use_kernel_mapping({"LlamaMLP": {"cuda": LocalLayerRepository(exported, layer_name="llama_mlp")}}):
            kernelize(model, mode=Mode.INFERENCE, device="cuda")
        got, after = model(ids).logits, median_us()
    return {"match": bool(torch.allclose(got, want, atol=cfg.atol, rtol=cfg.rtol)),
            "max_abs_diff": float((got - want).abs().max()), "original_us": before, "kernelized_us": after,
            "speedup": before / after}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--intermediate", type=int, default=1536)
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--tokens", type=int, default=512, help="sample length (token ids)")
    parser.add_argument("--work", type=Path, help="folder for the model, task and export (default: a temporary one)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import transformers

    work = args.work or Path(tempfile.mkdtemp(prefix="drop-in-"))
    config = transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                                      intermediate_size=args.intermediate, num_attention_heads=args.heads,
                                      num_key_value_heads=args.kv_heads, max_position_embeddings=8192)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(work / "llama")
    sample = ",".join(str(i) for i in torch.randint(0, args.vocab, (args.tokens,)).tolist())
    (work / "mlp_new.py").write_text(solution(args.hidden, args.intermediate))
    steps, started = {}, time.perf_counter()
    steps["task new"] = cli("task", "new", "--hf-model", work / "llama", "--submodule", "model.layers.0.mlp",
                            "--sample", sample, "--out", work / "mlp_task.py")
    steps["eval"] = cli("eval", work / "mlp_task.py", "--solution", work / "mlp_new.py", "--backend", "cuda", "--json")
    steps["export"] = cli("export", work / "mlp_new.py", "--task", work / "mlp_task.py", "--name", "llama_mlp",
                          "--out", work / "exported", "--backend", "cuda")
    steps["check-model"] = cli("check-model", "--hf-model", work / "llama", "--replace",
                               f"model.layers.*.mlp={work / 'exported' / 'llama_mlp'}", "--sample", sample,
                               "--backend", "cuda", "--fail-on-reject")
    for name, output in steps.items():
        print(f"$ cuda-agent {name}\n{output if name != 'eval' else output[:2000]}")
    verdict = json.loads(steps["eval"])
    result = {"machine": _common.machine(), "config": vars(args) | {"work": str(work), "out": str(args.out)},
              "verdict": {k: verdict.get(k) for k in ("correct", "reward", "speedup_vs_eager", "speedup_vs_compile",
                                                       "times_us", "error")},
              "check_model": steps["check-model"], "kernelize": kernelized(work / "llama", work / "exported",
                                                                           torch.tensor([[int(t) for t in
                                                                                          sample.split(",")]]).cuda()),
              "seconds": time.perf_counter() - started}
    print(json.dumps({k: v for k, v in result.items() if k != "check_model"}, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    if not (verdict["correct"] and result["kernelize"]["match"]):
        raise SystemExit("FAILED: the kernel was not judged correct, or the kernelized model's outputs differ")


if __name__ == "__main__":
    main()
