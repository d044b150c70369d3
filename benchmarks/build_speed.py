"""Build speed of the judge's workspace builder, with the anchors measured in the same run.

Targets (issue 2, H200 machine): cold build of a one-kernel workspace <= 10 s; rebuild after editing one
`.cu` <= 3 s. Anchors: bare nvcc of the kernel, the binding compiled without the precompiled header, and
torch's load_inline (torch/extension.h) of an equivalent single file.

    python benchmarks/build_speed.py --backend cuda --out build_speed.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, write

from cuda_agent import sandbox
from cuda_agent.backend import get_backend
from cuda_agent.workspace.build import Builder
from cuda_agent.workspace.candidate import load_candidate

CASES = {
    "cuda": ("affine_relu_cuda", "kernels/affine_relu.cu", "affine_relu_cuda_single.py"),
    "cpu": ("affine_relu_ok", "kernels/affine_relu.cpp", "affine_relu_single.py"),
}
CANDIDATES = ROOT / "tests" / "data" / "candidates"


def timed(cmd: list[str], cwd: Path, env: dict | None = None) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cuda", choices=sorted(CASES))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    backend = get_backend(args.backend)
    backend.check_toolchain()
    workspace, kernel, single = CASES[args.backend]
    tmp = Path(tempfile.mkdtemp(prefix="build-speed-"))
    ws = tmp / "ws"
    shutil.copytree(CANDIDATES / workspace, ws)
    # as the judge builds: compilers confined to the sandbox where it works (its start costs a little per compile)
    builder = Builder(backend, tmp / "cache", confined=[tmp / "cache"] if sandbox.probe() is None else None)
    rows: list[dict] = []

    def build(step: str) -> None:
        result = builder.build(load_candidate(ws), tmp / f"build{len(rows)}")
        if not result.ok:
            sys.exit(f"build failed: {result.error}\n{result.log}")
        rows.append({"step": step, "seconds": result.seconds,
                     "compiled": ", ".join(s.source for s in result.steps if not s.cached) or "-"})

    build("first build on a machine (includes building the precompiled header once)")
    shutil.rmtree(tmp / "cache" / "objects")
    (tmp / "cache" / "objects").mkdir()
    build("cold build of a new one-kernel workspace (nothing cached but the header)")
    (ws / kernel).write_text((ws / kernel).read_text() + "\n// edited\n")
    build(f"rebuild after editing {kernel}")
    (ws / "model_new.py").write_text((ws / "model_new.py").read_text() + "\n# edited\n")
    build("rebuild after editing model_new.py")
    build("rebuild with nothing changed")

    obj = str(tmp / "k.o")
    rows.append({"step": "anchor: kernel compiler alone on the kernel file",
                 "seconds": timed(backend.kernel_command(kernel, obj), ws), "compiled": kernel})
    binding = f"kernels/{Path(kernel).stem}_binding.cpp"
    shutil.copyfile(ROOT / "src/cuda_agent/workspace/template/binding_registry.h", ws / "binding_registry.h")
    rows.append({"step": "anchor: binding compiled without the precompiled header",
                 "seconds": timed([backend.cxx, *backend.binding_flags(), "-c", binding, "-o", obj], ws),
                 "compiled": binding})
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp / "torch_ext"), "PYTHONPATH": str(ROOT / "src")}
    if args.backend == "cuda":
        from cuda_agent.backend import detect_cuda_arch, torch_arch_list

        env["TORCH_CUDA_ARCH_LIST"] = torch_arch_list(detect_cuda_arch())
    loader = (f"import importlib.util as u; s = u.spec_from_file_location('m', '{CANDIDATES / single}'); "
              "u.module_from_spec(s).__spec__.loader.exec_module(u.module_from_spec(s))")
    rows.append({"step": "anchor: torch load_inline (torch/extension.h) of the same kernel as a single file",
                 "seconds": timed([sys.executable, "-c", loader], tmp, env), "compiled": single})
    write(args.out, f"Build speed ({args.backend}, compilers {'sandboxed' if builder.confined else 'plain'})", rows,
          ["step", "seconds", "compiled"], {"backend": args.backend, "sandboxed": builder.confined is not None})
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
