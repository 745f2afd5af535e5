"""The PYTHON emulator's speed: the same kernels, with the GPU heuristics' opts, on PYTHON
(EMULATE=CUDA) and on OPENCL (PoCL on the CPU; CPU when OpenCL is missing), side by side in one
run. Reports each kernel's time on both, the ratio, and the emulator's rate in lane-ops per
second (instructions executed x threads). Done-when of issue 11: the 256^3 fp32 matmul runs on
PYTHON (EMULATE=CUDA) in under 5 s on one core.

Run: python bench/bench_emulator.py [--quick]
"""
from __future__ import annotations
import os, sys
import numpy as np
sys.path.insert(0, os.path.dirname(__file__))
from common import best_of, conv3x3_ast, elementwise_ast, matmul_ast  # noqa: E402
from tilecraft.codegen.kernel import Kernel  # noqa: E402
from tilecraft.device import Buffer, CompiledRunner, Device  # noqa: E402
from tilecraft.dtype import dtypes  # noqa: E402
from tilecraft.testing.fuzz import buffer_size, buffer_views  # noqa: E402
from tilecraft.helpers import Context  # noqa: E402
from tilecraft.ops import LazyOp, ReduceOps  # noqa: E402
from tilecraft.testing.corpus import ST, kernel, ld, red, store  # noqa: E402

def sum_rows_ast(M: int, N: int) -> LazyOp:
  return kernel(store(0, dtypes.float32, ST((M, 1)), red(ReduceOps.SUM, ld(1, dtypes.float32, ST((M, N))), (1,))))

def max_all_ast(n: int) -> LazyOp:
  return kernel(store(0, dtypes.float32, ST((1,)), red(ReduceOps.MAX, ld(1, dtypes.float32, ST((n,))), (0,))))

def run_on(ast: LazyOp, device: str, inputs: dict[int, np.ndarray], reps: int) -> tuple[float, np.ndarray, object, list]:
  k = Kernel(ast, Device[device].renderer)
  k.hand_coded_optimizations()
  p = k.to_program()
  views = buffer_views(ast)
  bufs = []
  for i in p.globals:
    b = Buffer(device, buffer_size(views[i]), dtypes.float32).allocate()
    if i in inputs: b.copyin(inputs[i].reshape(-1))
    bufs.append(b)
  runner = CompiledRunner(p)
  runner(bufs)  # warm up (and the result to check)
  t = best_of(lambda: runner(bufs), reps)
  return t, bufs[0].numpy(), runner, list(k.applied_opts)

def main() -> None:
  quick = "--quick" in sys.argv
  other = "OPENCL" if "OPENCL" in Device.available() else "CPU"
  rng = np.random.default_rng(0)
  N = 256
  a, b = rng.standard_normal((N, N), dtype=np.float32), rng.standard_normal((N, N), dtype=np.float32)
  img, w = rng.standard_normal((16, 32, 32), dtype=np.float32), rng.standard_normal((16, 16, 3, 3), dtype=np.float32)
  x = rng.standard_normal(1 << 20, dtype=np.float32)
  rows = rng.standard_normal((512, 1024), dtype=np.float32)
  cases = [(f"matmul {N}x{N}x{N}", matmul_ast(N, N, N), {1: a, 2: b}, lambda: a @ b, 2 * N**3),
           ("conv 3x3 16->16 32x32", conv3x3_ast(16, 16, 32, 32), {1: img, 2: w}, None, 2 * 16 * 16 * 9 * 32 * 32),
           ("elementwise 1M", elementwise_ast(1 << 20), {1: x, 2: x, 3: x}, lambda: np.maximum(x * x + x, 0), 3 << 20),
           ("sum rows 512x1024", sum_rows_ast(512, 1024), {1: rows}, lambda: rows.sum(1), 512 * 1024),
           ("max all 1M", max_all_ast(1 << 20), {1: x}, lambda: x.max(), 1 << 20)]
  if quick: cases = cases[:1]
  print(f"PYTHON emulator (EMULATE=CUDA, one Python thread) vs {other}, hand-coded GPU opts on each; best of runs")
  print(f"{'kernel':24s} {'PYTHON':>10s} {other:>10s} {'ratio':>8s} {'lane-ops/s':>12s}  opts on PYTHON")
  for name, ast, inputs, ref, flops in cases:
    with Context(EMULATE="CUDA"):
      tp, out, runner, opts = run_on(ast, "PYTHON", inputs, 1 if quick else 2)
    lane_ops = runner.clprg.last_lane_ops
    to, out_o, _, _ = run_on(ast, other, inputs, 5)
    if ref is not None:
      want = np.asarray(ref()).reshape(-1)
      assert np.allclose(out[:want.size], want, rtol=1e-3, atol=1e-3), f"{name}: PYTHON result is wrong"
    assert np.allclose(out, out_o, rtol=1e-3, atol=1e-3), f"{name}: PYTHON and {other} disagree"
    print(f"{name:24s} {tp:9.3f}s {to*1e3:8.2f}ms {tp/to:7.0f}x {lane_ops/tp:12.3g}  {[str(o) for o in opts]}")
  print(f"done-when: matmul {N}^3 on PYTHON (EMULATE=CUDA) must take < 5 s on one core")

if __name__ == "__main__": main()
