"""CPU code generation: a 1024^3 fp32 matmul with and without opts (and on 1 vs all cores), and
codegen latency (AST -> source, Python only) for matmul, 3x3 conv and elementwise kernels.

Run: python bench/bench_cpu_codegen.py
"""
from __future__ import annotations
import ctypes, ctypes.util, os, statistics, sys, time
import numpy as np
sys.path.insert(0, os.path.dirname(__file__))
from common import best_of, conv3x3_ast, elementwise_ast, matmul_ast  # noqa: E402
from tilecraft.codegen.kernel import Kernel, Opt, OptOps  # noqa: E402
from tilecraft.device import Buffer, CompiledRunner, Device  # noqa: E402
from tilecraft.dtype import dtypes  # noqa: E402

MATMUL_OPTS = [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UNROLL, 0, 4)]

def set_threads(n: int) -> None:
  """OpenMP thread count of the process-wide libgomp the kernels use."""
  ctypes.CDLL(ctypes.util.find_library("gomp") or "libgomp.so.1").omp_set_num_threads(n)

def run_matmul() -> None:
  N = 1024
  rng = np.random.default_rng(0)
  a, b = rng.random((N, N), dtype=np.float32), rng.random((N, N), dtype=np.float32)
  bufs = [Buffer("CPU", N * N, dtypes.float32).allocate() for _ in range(3)]
  bufs[1].copyin(a.ravel()); bufs[2].copyin(b.ravel())
  ref = a @ b
  results = {}
  for label, opts in (("no opts", []), ("opts", MATMUL_OPTS)):
    k = Kernel(matmul_ast(N, N, N), Device["CPU"].renderer)
    for o in opts: k.apply_opt(o)
    runner = CompiledRunner(k.to_program())
    runner(bufs)
    err = float(np.abs(bufs[0].numpy().reshape(N, N) - ref).max())
    assert err < 1e-2, f"matmul {label} is wrong: max error {err}"
    results[label] = best_of(lambda: runner(bufs), 1 if not opts else 5)
    if opts:
      set_threads(1)
      results["opts, 1 core"] = best_of(lambda: runner(bufs), 3)
      set_threads(os.cpu_count() or 1)
  print(f"matmul 1024x1024x1024 fp32 on CPU ({os.cpu_count()} cores); opts = {MATMUL_OPTS}")
  for label, t in results.items(): print(f"  {label:14s} {t*1e3:9.1f} ms  {2*N**3/t/1e9:7.1f} GFLOPS")
  print(f"  speedup of opts over no opts: {results['no opts']/results['opts']:.1f}x")
  print(f"  speedup of all cores over 1 core (opts): {results['opts, 1 core']/results['opts']:.2f}x")

def latency(make, opts, n=20) -> float:
  def once() -> float:
    t0 = time.perf_counter()
    k = Kernel(make(), Device["CPU"].renderer)
    for o in opts: k.apply_opt(o)
    k.to_program()
    return time.perf_counter() - t0
  once()
  return statistics.median(once() for _ in range(n))

def run_latency() -> None:
  print("codegen latency (AST -> C source, median of 20, Python only):")
  cases = [("matmul 1024 + UPCAST/UNROLL", lambda: matmul_ast(1024, 1024, 1024), MATMUL_OPTS, 20),
           ("conv 3x3 64->64 56x56", lambda: conv3x3_ast(64, 64, 56, 56), [Opt(OptOps.UPCAST, 2, 8), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 2, 3)], 30),
           ("elementwise 16M", lambda: elementwise_ast(1 << 24), [Opt(OptOps.UPCAST, 0, 16)], 5)]
  for name, make, opts, target in cases:
    ms = latency(make, opts) * 1e3
    print(f"  {name:30s} {ms:7.2f} ms  (target <= {target} ms: {'ok' if ms <= target else 'MISSED'})")

if __name__ == "__main__":
  run_matmul()
  run_latency()
