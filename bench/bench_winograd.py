"""Direct against Winograd 3x3 convs (frontend/winograd.py) on ResNet-50's 3x3 stride-1 shapes at batch 1
(padding 1, bias, relu), side by side in one process: each variant's kernels timed in turn, several
rounds, medians; the weight transform is excluded (ONNX models compute it once, at load).

  python bench/bench_winograd.py [--rounds 5] [--reps 10] [--shapes 64x56,128x28,256x14,512x7]
  python bench/bench_winograd.py --model resnet50 [--rounds 20]

Prints per shape (CHANNELS: in = out) the median time of the direct conv, F(2x2,3x3) and F(4x4,3x3), the ratios direct /
Winograd (> 1: Winograd faster) and each Winograd variant's error against a float64 reference relative
to the output's largest |value| (the direct conv's for scale). Run under CPU_ARCH=haswell for AVX2 code.
--model NAME: a light ONNX model (tilecraft.onnx.light) built twice in one process, WINO=0 and WINO=1,
called alternately (--rounds pairs, the order swapped every pair), medians, kernels per call, and the
largest difference between the two outputs relative to the largest |value|."""
from __future__ import annotations
import argparse
import numpy as np
from tilecraft import Context, Tensor
from tilecraft.engine.realize import get_runner
from tilecraft.frontend.winograd import MATRICES, u_block, winograd_apply
from tilecraft.ops import MetaOps

def _prep(f, arrays):  # the kernels of f(*arrays) on realized inputs, run once; (output, runners, items)
  ts = [Tensor(a).realize() for a in arrays]
  out = f(*ts)
  items = [si for si in out.schedule() if si.ast.op is MetaOps.KERNEL]
  out.realize()
  return out.numpy(), [get_runner(si.ast, si.bufs[0].device, list(si.bufs)) for si in items], items

def _time(runners, items, reps: int) -> float:  # best of reps of the sum of the kernels' times
  return min(sum(r(list(si.bufs), si.var_vals, wait=True) for r, si in zip(runners, items)) for _ in range(reps))

def _reference(x, w, b):  # float64 conv (padding 1) + bias, relu
  n, c, h, wd = x.shape
  xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
  out = sum(np.einsum("nchw,oc->nohw", xp[:, :, i:i + h, j:j + wd], w[:, :, i, j].astype(np.float64)) for i in range(3) for j in range(3))
  return np.maximum(out + b.reshape(1, -1, 1, 1), 0)

def model_ab(name: str, rounds: int) -> None:
  import time
  from tilecraft.engine import realize
  from tilecraft.onnx import load
  from tilecraft.onnx.light import light_input, light_model
  proto = light_model(name)
  feed = light_input(proto)
  models, outs, kernels = {}, {}, {}
  for mode in (0, 1):
    with Context(WINO=mode):
      models[mode] = load(proto)
      models[mode].run(feed)
      k0 = realize.kernel_count
      outs[mode] = models[mode].run(feed)
      kernels[mode] = realize.kernel_count - k0
  times: dict[int, list[float]] = {0: [], 1: []}
  for r in range(rounds):
    for mode in ((0, 1) if r % 2 == 0 else (1, 0)):
      models[mode].run(feed)  # (each timed on the second call of its pair: its own threads warm)
      t0 = time.perf_counter()
      models[mode].run(feed)
      times[mode].append(time.perf_counter() - t0)
  med = {k: float(np.median(v)) for k, v in times.items()}
  diff = max(float(np.abs(outs[0][k] - outs[1][k]).max() / max(np.abs(outs[0][k]).max(), 1e-30)) for k in outs[0])
  print(f"{name}: WINO=0 {med[0] * 1e3:.2f} ms ({kernels[0]} kernels)  WINO=1 {med[1] * 1e3:.2f} ms ({kernels[1]} kernels)  "
        f"ratio {med[0] / med[1]:.3f}  max rel diff {diff:.1e}  (medians of {rounds})", flush=True)

def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--reps", type=int, default=10)
  ap.add_argument("--shapes", default="64x56,128x28,256x14,512x7", help="CHANNELSxSIZE or CINxCOUTxSIZE, comma-separated")
  ap.add_argument("--model", default=None, help="a light ONNX model: WINO=0 against WINO=1, whole-model time")
  args = ap.parse_args()
  if args.model:
    for name in args.model.split(","): model_ab(name, args.rounds)
    return
  rng = np.random.default_rng(0)
  for spec in args.shapes.split(","):
    dims = list(map(int, spec.split("x")))
    c, co, hw = (dims[0], dims[0], dims[1]) if len(dims) == 2 else dims
    x = rng.standard_normal((1, c, hw, hw), dtype=np.float32)
    w = (rng.standard_normal((co, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    b = rng.standard_normal(co).astype(np.float32)
    ref = _reference(x, w, b)
    with Context(WINO=0): out, r, i = _prep(lambda x, w, b: x.conv2d(w, b, padding=1).relu(), [x, w, b])
    runs, errs = {"direct": (r, i)}, {"direct": np.abs(out - ref).max() / np.abs(ref).max()}
    for m in (2, 4):
      _, g, _ = MATRICES[m]
      u = np.einsum("ai,bj,ocij->abco", g, g, w.astype(np.float64)).reshape((m + 2) ** 2, c, co).astype(np.float32)
      u = np.ascontiguousarray(u.reshape((m + 2) ** 2, c, co // u_block(co), u_block(co)).transpose(0, 2, 1, 3))  # (weight_transform's blocks)
      out, r, i = _prep(lambda x, u, b, m=m: winograd_apply(x, u, b, (1, 1), m).relu(), [x, u, b])
      runs[f"F{m}"], errs[f"F{m}"] = (r, i), np.abs(out - ref).max() / np.abs(ref).max()
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.rounds):
      for k, (r, i) in runs.items(): times[k].append(_time(r, i, args.reps))
    med = {k: float(np.median(v)) for k, v in times.items()}
    print(f"{c:4d}->{co:<4d} {hw:3d}^2  " + "  ".join(f"{k} {v * 1e6:7.0f} us" for k, v in med.items())
          + f"   direct/F2 {med['direct'] / med['F2']:.2f}  direct/F4 {med['direct'] / med['F4']:.2f}   rel.err "
          + " ".join(f"{k} {e:.1e}" for k, e in errs.items()), flush=True)

if __name__ == "__main__":
  main()
