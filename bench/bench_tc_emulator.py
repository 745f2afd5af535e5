"""Tensor-core kernels on the PYTHON emulator (EMULATE=CUDA|AMD|METAL), side by side in one run: for a
64^3 matmul and a 3x3 conv in each vendor's first core's dtypes, the time to build the program
(Kernel + opts + to_program: lowering, rewriting, rendering) and to run it on the emulator, for
TC use 1 (WMMA), 2 (MUL/SUM in the TC layout), 3 (WMMA emulated through local memory) and for the
hand-coded opts without tensor cores. CPU time of this (single) Python thread, best of --reps;
read the ratios to use 2, not the absolute times.

Run: python bench/bench_tc_emulator.py [--reps 3]
"""
from __future__ import annotations
import argparse, time
import numpy as np
from tilecraft.codegen.kernel import Kernel
from tilecraft.device import Buffer, CompiledRunner, Device
from tilecraft.helpers import Context
from tilecraft.renderer.tensor_cores import TENSOR_CORES
from tilecraft.testing.fuzz import buffer_size, buffer_views
from tilecraft.testing.tc_cases import conv, matmul, np_dtype

def best(fn, reps: int) -> float:
  out = []
  for _ in range(reps):
    t = time.process_time()
    fn()
    out.append(time.process_time() - t)
  return min(out)

def build(ast, ren, use: int, axis: int):
  k = Kernel(ast, opts=ren)
  if use: k.apply_tensor_cores(use, axis=axis, tc_opt=1)
  else: k.hand_coded_optimizations()
  return k.to_program()

def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--reps", type=int, default=3)
  args = ap.parse_args()
  rng = np.random.default_rng(0)
  print(f"{'core':28s} {'kernel':6s} {'opts':8s} {'build ms':>9s} {'x use2':>7s} {'run ms':>9s} {'x use2':>7s}")
  for vendor in ("CUDA", "AMD", "METAL"):
    tc = TENSOR_CORES[vendor][0]
    with Context(EMULATE=vendor):
      ren = Device["PYTHON"].renderer
      for name, (ast, inputs, want), axis in (("mm64", matmul(rng, 64, 64, 64, tc.dtype_in, tc.dtype_out), 0),
                                              ("conv", conv(rng, tc.dtype_in, tc.dtype_out), 3)):
        rows = {}
        for use in (0, 1, 2, 3):
          with Context(TC=use):
            t_build = best(lambda: build(ast, ren, use, axis), args.reps)
            p = build(ast, ren, use, axis)
            views = buffer_views(ast)
            bufs = []
            for i in p.globals:
              b = Buffer("PYTHON", buffer_size(views[i]), views[i][0].dtype).allocate()
              if i in inputs: b.copyin(inputs[i].astype(np_dtype(views[i][0].dtype)).reshape(-1))
              bufs.append(b)
            runner = CompiledRunner(p)
            runner(bufs)
            got = bufs[0].numpy().reshape(-1)[:want.size].astype(np.float64)
            assert np.allclose(got.reshape(want.shape), want, rtol=2e-2, atol=0.2), f"{vendor} {name} use {use}: wrong result"
            rows[use] = (t_build, best(lambda: runner(bufs), args.reps))
        for use, (tb, tr) in rows.items():
          print(f"{str(tc):28s} {name:6s} {'no TC' if not use else f'use {use}':8s} {tb * 1e3:9.1f} {tb / rows[2][0]:7.2f} {tr * 1e3:9.1f} {tr / rows[2][1]:7.2f}",
                flush=True)

if __name__ == "__main__":
  main()
