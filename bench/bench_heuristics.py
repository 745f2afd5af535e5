"""Hand-coded optimizations vs none, on CPU and OPENCL, and the CPU kernels' speed as a ratio to
numpy measured side by side in the same run.

Run: python bench/bench_heuristics.py [--quick]
"""
from __future__ import annotations
import argparse, os, sys, time
from typing import Callable
import numpy as np
sys.path.insert(0, os.path.dirname(__file__))
from common import numpy_conv3x3  # noqa: E402
from tilecraft import Context, Tensor  # noqa: E402
from tilecraft.device import Device, DeviceUnavailable  # noqa: E402
from tilecraft.engine.realize import get_runner  # noqa: E402

def kernel_time(make: Callable[[], Tensor], device: str, reps: int = 5) -> tuple[float, np.ndarray, list]:
  """Sum over the schedule's kernels of each kernel's best time; also the result and the opts."""
  out = make()
  sched = out.schedule()
  total, opts = 0.0, []
  for si in sched:
    for b in si.bufs:
      if not b.is_allocated(): b.allocate()
    r = get_runner(si.ast, device, list(si.bufs))
    r(list(si.bufs), si.var_vals)  # warm up, and compute the inputs of the next kernel
    total += min(r(list(si.bufs), si.var_vals) for _ in range(reps))
    opts.append([f"{o.op.name}{o.axis},{o.amt}" for o in r.p.applied_opts])
  return total, out.numpy(), opts

def np_time(fn: Callable[[], object], reps: int = 5) -> float:
  fn()
  best = float("inf")
  for _ in range(reps):
    t0 = time.perf_counter(); fn(); best = min(best, time.perf_counter() - t0)
  return best

def cases(quick: bool, rng: np.random.Generator) -> list:
  n = 1 << (20 if quick else 24)
  R, C = (256, 1024) if quick else (4096, 1024)
  a, b, c = (rng.random(n, dtype=np.float32) for _ in range(3))
  m = rng.random((R, C), dtype=np.float32)
  sq = rng.random((4096, 4096) if not quick else (512, 512), dtype=np.float32)
  mats = {s: (rng.random((s, s), dtype=np.float32), rng.random((s, s), dtype=np.float32)) for s in ((128, 256) if quick else (512, 1024))}
  img = rng.random((64, 56, 56) if not quick else (8, 16, 16), dtype=np.float32)
  w = rng.random((64, 64, 3, 3) if not quick else (8, 8, 3, 3), dtype=np.float32)
  out = []
  for s, (x, y) in mats.items():
    out.append((f"matmul {s}", lambda dev, x=x, y=y: Tensor(x, dev) @ Tensor(y, dev), lambda x=x, y=y: x @ y, 2 * s ** 3, 12 * s * s, "flops"))
  out += [
    ("a+b 16M" if not quick else "a+b 1M", lambda dev: Tensor(a, dev) + Tensor(b, dev), lambda: a + b, n, 12 * n, "bw"),
    ("(a*b+c).relu()", lambda dev: (Tensor(a, dev) * Tensor(b, dev) + Tensor(c, dev)).relu(), lambda: np.maximum(a * b + c, 0), 3 * n, 16 * n, "bw"),
    ("sum 16M" if not quick else "sum 1M", lambda dev: Tensor(a, dev).sum(), lambda: a.sum(), n, 4 * n, "bw"),
    ("row sums (axis 1)", lambda dev: Tensor(sq, dev).sum(1), lambda: sq.sum(1), sq.size, 4 * sq.size, "bw"),
    ("col sums (axis 0)", lambda dev: Tensor(sq, dev).sum(0), lambda: sq.sum(0), sq.size, 4 * sq.size, "bw"),
    (f"softmax {R}x{C}", lambda dev: Tensor(m, dev).softmax(1), lambda: (lambda e: e / e.sum(1, keepdims=True))(np.exp(m - m.max(1, keepdims=True))), 5 * m.size, 8 * m.size, "softmax"),
    ("conv3x3 64->64 56x56" if not quick else "conv3x3 small", lambda dev: Tensor(img[None], dev).conv2d(Tensor(w, dev), padding=1),
     lambda: numpy_conv3x3(img, w)[None], 2 * w.size * img.shape[1] * img.shape[2], 4 * (img.size + w.size + w.shape[0] * img.shape[1] * img.shape[2]), "flops"),
  ]
  return out

def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--quick", action="store_true")
  ap.add_argument("--devices", default="CPU,OPENCL", help="comma-separated devices to run")
  args = ap.parse_args()
  rng = np.random.default_rng(0)
  devices = []
  for d in args.devices.split(","):
    try:
      Device[d]; devices.append(d)
    except DeviceUnavailable as e: print(f"({d} skipped: {e})")
  copy_src = rng.random(1 << (20 if args.quick else 24), dtype=np.float32)
  copy_dst = np.empty_like(copy_src)
  t_copy = np_time(lambda: np.copyto(copy_dst, copy_src))
  copy_bw = 2 * copy_src.nbytes / t_copy
  print(f"numpy copy bandwidth: {copy_bw/1e9:.1f} GB/s")
  print(f"{'kernel':24s} {'device':7s} {'no opts':>10s} {'hand':>10s} {'speedup':>8s} {'numpy':>10s} {'vs numpy':>9s}  target  opts")
  for name, make, ref_fn, flops, nbytes, kind in cases(args.quick, rng):
    ref = np.asarray(ref_fn())
    t_np = np_time(ref_fn)
    for dev in devices:
      with Context(NOOPT=1): t0, r0, _ = kernel_time(lambda: make(dev), dev, reps=1 if "matmul" in name or "conv" in name else 3)
      t1, r1, opts = kernel_time(lambda: make(dev), dev)
      for r in (r0, r1):
        assert np.allclose(r.reshape(ref.shape), ref, rtol=2e-3, atol=2e-3 * max(1.0, float(np.abs(ref).max()))), f"{name} on {dev} is wrong"
      target = ""
      if dev == "CPU":
        if kind == "bw":
          ratio = (nbytes / t1) / copy_bw
          target = f"{ratio:.2f}x copy BW (>=0.85)"
        elif kind == "softmax":
          target = f"{t1 / (ref.nbytes * 2 / copy_bw):.2f}x the time of a numpy copy of the input (<=2)"
        else:
          target = f"{t_np / t1:.2f}x numpy (>=0.3)"
      print(f"{name:24s} {dev:7s} {t0*1e3:9.2f}ms {t1*1e3:9.2f}ms {t0/t1:7.1f}x {t_np*1e3:9.2f}ms {t_np/t1:8.2f}x  {target}  {opts}")

if __name__ == "__main__":
  main()
