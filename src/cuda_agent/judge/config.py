"""Judge settings. Defaults follow the CUDA Agent paper (5 trials, atol=rtol=1e-2, 5% speedup threshold)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Ops a candidate's forward may run through torch: allocation, views, metadata, and initialising fills.
DEFAULT_ALLOWED_OPS = (
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like",
    "new_zeros", "zero_", "fill_", "resize_", "set_", "lift_fresh", "detach", "alias", "view", "_unsafe_view",
    "_reshape_alias", "as_strided", "t", "transpose", "permute", "unsqueeze", "squeeze", "expand", "slice",
    "select", "split", "split_with_sizes", "unbind", "chunk", "narrow", "diagonal", "unfold", "view_as_real",
    "view_as_complex", "_local_scalar_dense", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
    "is_contiguous", "size", "stride", "dim", "numel", "is_same_size", "record_stream",
    # composites whose work, where there is any (a copy, a cast), is an op of its own that the audit counts
    "contiguous", "reshape", "reshape_as", "view_as", "expand_as", "flatten", "unflatten", "movedim", "to",
    "type_as", "resolve_conj", "resolve_neg", "item",
)
# C++ functions in torch::/at:: that only allocate or describe (everything else there is compute).
DEFAULT_ALLOWED_CXX_CALLS = (
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "from_blob", "TensorOptions", "dtype",
    "device", "requires_grad", "layout", "scalarTypeToTypeMeta", "typeMetaToScalarType", "elementSize",
    "getCurrentCUDAStream", "getDefaultCUDAStream", "getStreamFromPool", "getCurrentCUDABlasHandle",
    "getCurrentDeviceProperties", "getDeviceProperties", "current_device", "set_device", "device_count",
    "OptionalCUDAGuard", "CUDAGuard", "checkAllSameGPU", "IntArrayRef", "get_num_threads", "Device",
)
# Header prefixes of libraries other than cuBLAS (GEMM only) and cuDNN (convolution only).
DEFAULT_FORBIDDEN_INCLUDES = (
    "cufft", "curand", "cusparse", "cusolver", "cutensor", "cudss", "cutlass", "cute/", "thrust/", "nccl",
    "npp", "nvshmem", "magma", "mkl", "oneapi/", "dnnl", "Eigen/", "ATen/native/", "ATen/ops/", "torch/nn",
    "torch/csrc/api/include/torch/nn", "torch/torch.h", "torch/all.h", "c10/cuda/CUDACachingAllocator",
)


@functools.lru_cache(maxsize=None)
def judge_version() -> str:
    """The package version and a hash of the code that reaches a verdict (the judge, the workspace builder, the
    sandbox, the backends, task loading): a changed judge, released or not, never reuses an old verdict."""
    from .. import __version__

    root = Path(__file__).resolve().parent.parent
    files = sorted([*root.glob("judge/**/*.py"), *root.glob("workspace/**/*.py"), *root.glob("sandbox/**/*.py"),
                    root / "backend.py", root / "gpu_timing.py", root / "task.py", root / "pyparse.py"])
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return f"{__version__}+{digest.hexdigest()[:12]}"


@dataclass
class PolicyConfig:
    allowed_ops: tuple[str, ...] = DEFAULT_ALLOWED_OPS
    allowed_cxx_calls: tuple[str, ...] = DEFAULT_ALLOWED_CXX_CALLS
    forbidden_includes: tuple[str, ...] = DEFAULT_FORBIDDEN_INCLUDES
    allow_cublas_gemm: bool = True
    allow_cudnn_conv: bool = True


POLICIES = ("strict", "kernelbench")
TIMINGS = ("ours", "kernelbench", "kernelbench-v0.1")  # kernelbench.TIMINGS, and ours


def default_cache_dir() -> Path:
    env = os.environ.get("CUDA_AGENT_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cuda-agent"


@dataclass
class JudgeConfig:
    atol: float = 1e-2
    rtol: float = 1e-2
    max_relative_error: float = 0.5  # normwise; catches zeros/constants passing atol on tiny outputs (compare.py)
    num_trials: int = 5  # fresh random input sets, seeds drawn by the judge per evaluation
    seeds: tuple[int, ...] | None = None  # fix them only for reproducing a verdict
    extra_shapes: bool = True  # one more input set with the sizes only get_inputs() uses changed (task.py)
    # floating-point inputs scaled: one more input set by 2-4, and (cpu backend) every other call's by a factor drawn
    # for it in [1, 4], so that no check is told apart by its values (the input distribution cannot be exploited)
    scaled_inputs: bool = True
    allow_tf32: bool = False  # applied identically to baselines and candidate
    speedup_threshold: float = 0.05
    # Strict precision: fail when the candidate's error against fp64 exceeds this many times fp32 eager's own (and
    # 1e-6 relative); None: only warn above PRECISION_WARN_RATIO. TF32 and fp16 land near 1e4x, bf16 near 1e5x;
    # fp32 kernels that only sum in another order within 10x.
    max_error_ratio: float | None = 1000.0
    compile_mode: str = "default"
    device_peaks: dict[str, float] | None = None  # peak rates (backend.peak_rates keys); None: the backend's table
    speed_of_light_fails: bool = True  # a time no honest kernel reaches (work.hard_problem) fails; else a warning
    warmup: int = 5
    min_iters: int = 10
    max_iters: int = 100
    target_time_s: float = 0.3  # timed iterations aim for this much total time per model
    # timed calls whose outputs are checked too: each on its own, drawn by the trusted side with the same probability
    # whatever the candidate saw of earlier checks, so that one wrong on half its timed calls (what moving the median
    # takes) escapes every check with probability 2**-timed_check_bits (about 13 of 100 calls checked; 0: none)
    timed_check_bits: int = 10
    check_iters: int = 10  # calls of the short eager timings taken just before and after the candidate's
    baseline_tolerance: float = 0.10  # both beyond this (plus half the spreads) from the cached eager: re-time it
    max_spread: float = 0.5  # (p80 - p20) / median of the candidate's calls (less the clock's own spread) beyond
    # which its timing is retaken
    timing_attempts: int = 2  # timings of the candidate before the verdict says "too noisy" instead of a speedup
    # (strict, cpu) the trusted CPU sampler's period: a sample per this much of a thread's CPU time, the candidate's
    # and the baseline callee's alike (None: cpu_sampler.PERIOD_NS, 1 ms). Calls adding up to under 20 periods of
    # compiled code decide nothing: lower it for kernels that short (each sample costs the thread ~20 us)
    cpu_sample_period_us: float | None = None
    build_timeout_s: float = 900.0  # one build (the workspace's objects, or one load_inline call)
    build_budget_s: float = 600.0  # all of one evaluation's builds together (load_inline calls stop when it is spent)
    max_builds: int = 8  # load_inline calls one evaluation may build
    cache_budget_gb: float | None = 20.0  # built objects and load_inline libraries kept, least recently used removed
    # beyond it (workspace/cache_budget.py; None: no bound)
    run_timeout_s: float = 300.0  # candidate process: load, verify and time
    reference_timeout_s: float = 900.0  # reference process, including the torch.compile baseline
    warm_references: int = 4  # reference workers kept warm across evaluations (judge/references.py; 0: none)
    warm_memory_gb: float = 16.0  # and at most this much device memory (host RAM on cpu) held by idle ones
    spare_candidates: int = 2  # candidate workers started ahead of their evaluations (judge/spares.py; 0: none)
    cache_dir: Path = field(default_factory=default_cache_dir)
    keep_run_dirs: bool = False
    sandbox: str = "auto"  # candidate isolation: auto (namespaces where they work, else plain), required, none
    memory_limit_gb: float | None = None  # sandbox memory: cgroup, plus address space on cpu (None: 80% of RAM)
    max_processes: int = 4096  # sandbox process/thread count (cgroup pids, or RLIMIT_NPROC when not root)
    # strict: CUDA Agent's rules (compute only in the candidate's own kernels; the only policy rewards use);
    # kernelbench: KernelBench's (torch ops allowed in ModelNew), every correctness, isolation and timing defence kept.
    policy: str = "strict"
    # ours (the judge's clock, the only one verdicts use), or also a KernelBench revision's own timing beside it,
    # measured in the candidate's process and reported in `verdict.kernelbench_timing` (kernelbench.TIMINGS)
    timing: str = "ours"
    rules: PolicyConfig = field(default_factory=PolicyConfig)  # what `strict` allows

    def timing_key(self) -> str:
        """What changes baseline timings besides task, device and torch version."""
        return f"tf32={self.allow_tf32};mode={self.compile_mode};warmup={self.warmup};" \
               f"iters={self.min_iters}-{self.max_iters};target={self.target_time_s};scaled={self.scaled_inputs};" \
               "held-outputs-v6"  # (v5: the callee keeps two calls' outputs alive, eager's too; v6: the CPU
        # flush at most 64 MiB)

    def verdict_key(self) -> str:
        """Every setting that can change a verdict (all but where files go and how many workers stay warm) and the
        judge's own code (`judge_version`), for results stored across runs."""
        settings = {k: v for k, v in self.to_dict().items()
                    if k not in ("cache_dir", "keep_run_dirs", "warm_references", "warm_memory_gb",
                                 "spare_candidates")}
        text = json.dumps({"settings": settings, "judge": judge_version()}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["cache_dir"] = str(self.cache_dir)
        return d
