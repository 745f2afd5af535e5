"""tilecraft on CUDA side by side with torch on the same GPU, in one run: matmul 4096^3 fp32 and fp16
(tensor cores, float accumulation), a row softmax, sums (a full reduce and a row reduce); with
--models, light ONNX models on CUDA (time per call, first call, checked against onnxruntime on CPU). Each tilecraft kernel is timed with CUDA events
(CompiledRunner), torch with torch.cuda events, both best of --runs after a warmup, interleaved.
Results are checked against torch (or numpy where torch is missing). "ratio" is torch time /
tilecraft time: above 1 tilecraft is faster. TF32 is off for torch's fp32 matmul (a fair fp32
comparison); its TF32 time is printed too.

Run: python bench/bench_cuda.py [--quick] [--json PATH] [--models squeezenet,resnet50] [--reduces]  (needs a GPU and cuda-python)
"""
from __future__ import annotations
import argparse, json, os, sys, time
from typing import Any, Callable, Optional
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tilecraft import Tensor  # noqa: E402
from tilecraft.device import Device  # noqa: E402
from tilecraft.engine.realize import get_runner  # noqa: E402
from tilecraft.ops import MetaOps  # noqa: E402

def tilecraft_case(make: Callable[[], Tensor]) -> tuple[Callable[[], float], Callable[[], np.ndarray], list[Any], float]:
  """(run once -> summed kernel seconds, result, the runners, compile seconds) for a realized expression."""
  out = make()
  items = [si for si in out.schedule() if si.ast.op is MetaOps.KERNEL]
  t0 = time.perf_counter()
  out.realize()
  compile_s = time.perf_counter() - t0
  runners = [get_runner(si.ast, "CUDA", list(si.bufs)) for si in items]
  def once() -> float: return sum(r(list(si.bufs), si.var_vals, wait=True) or 0.0 for r, si in zip(runners, items))
  return once, out.numpy, runners, compile_s

def torch_timer(torch: Any, fn: Callable[[], Any]) -> Callable[[], float]:
  start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
  def once() -> float:
    start.record(); fn(); end.record(); end.synchronize()  # noqa: E702
    return start.elapsed_time(end) * 1e-3
  return once

def best(fns: list[Optional[Callable[[], float]]], runs: int, warmup: int) -> list[Optional[float]]:
  for _ in range(warmup):
    for f in fns:
      if f is not None: f()
  out: list[Optional[float]] = [None if f is None else float("inf") for f in fns]
  for _ in range(runs):
    for i, f in enumerate(fns):
      if f is not None: out[i] = min(out[i], f())  # type: ignore[type-var]
  return out

def main(argv: Optional[list[str]] = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--quick", action="store_true", help="smaller sizes (a smoke test)")
  ap.add_argument("--runs", type=int, default=10)
  ap.add_argument("--json", metavar="PATH")
  ap.add_argument("--models", default="", help="comma-separated light ONNX models to run on CUDA too")
  ap.add_argument("--reduces", action="store_true", help="then reduces at model shapes under GPU_FILL's default and 0, side by side")
  args = ap.parse_args(argv)
  dev = Device["CUDA"]
  if dev.render_only is not None:
    print(f"CUDA can't run kernels here: {dev.render_only}")
    return 2
  try:
    import torch
    if not torch.cuda.is_available(): raise ImportError("torch.cuda.is_available() is False")
    torch.backends.cuda.matmul.allow_tf32 = False
  except ImportError as e:
    print(f"(torch on the GPU is not available: {e}; tilecraft times only, checked against numpy)")
    torch = None
  from tilecraft.runtime.cuda import _context
  c = _context()
  print(f"GPU: {c.name} ({c.arch}); compiler: {dev.compiler.cachekey}" + (f"; torch {torch.__version__}" if torch else ""))
  N = 1024 if args.quick else 4096
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((N, N), dtype=np.float32), rng.standard_normal((N, N), dtype=np.float32)
  a16, b16 = a.astype(np.float16), b.astype(np.float16)
  x = rng.standard_normal((N, N), dtype=np.float32)
  v = rng.standard_normal(N * N * 4, dtype=np.float32)
  def np_softmax(m: np.ndarray) -> np.ndarray:
    e = np.exp(m - m.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)
  cases = [  # name, tilecraft expression, torch expression on (tensors), numpy reference, inputs, flops, bytes
    (f"matmul {N}^3 fp32", lambda: Tensor(a, device="CUDA") @ Tensor(b, device="CUDA"), lambda t: t[0] @ t[1], np.matmul, (a, b), 2 * N**3, 3 * 4 * N * N),
    (f"matmul {N}^3 fp16", lambda: Tensor(a16, device="CUDA") @ Tensor(b16, device="CUDA"), lambda t: t[0] @ t[1],
     lambda x, y: (x.astype(np.float32) @ y.astype(np.float32)).astype(np.float16), (a16, b16), 2 * N**3, 3 * 2 * N * N),
    (f"softmax rows {N}x{N}", lambda: Tensor(x, device="CUDA").softmax(-1), lambda t: torch.softmax(t[0], -1), np_softmax, (x,), 5 * N * N, 2 * 4 * N * N),
    (f"sum {N * N * 4 // 2**20}M", lambda: Tensor(v, device="CUDA").sum(), lambda t: t[0].sum(), np.sum, (v,), N * N * 4, 4 * N * N * 4),
    (f"sum rows {N}x{N}", lambda: Tensor(x, device="CUDA").sum(-1), lambda t: t[0].sum(-1), lambda m: m.sum(-1), (x,), N * N, 4 * N * N),
  ]
  rows, recs, ok = [], [], True
  for name, tc_fn, torch_fn, np_fn, arrs, flops, nbytes in cases:
    rec: dict[str, Any] = {"name": name}
    try:
      once, result, runners, compile_s = tilecraft_case(tc_fn)
      got = result()
      t_once = None
      if torch is not None:
        tt = [torch.from_numpy(arr).cuda() for arr in arrs]
        want = torch_fn(tt).double().cpu().numpy()
        t_once = torch_timer(torch, lambda: torch_fn(tt))
      else: want = np_fn(*[arr.astype(np.float64) for arr in arrs])
      err = float(np.max(np.abs(got.reshape(want.shape) - want)) / (np.max(np.abs(want)) + 1e-30))
      rec["max_rel_error"] = err
      if not err < (1e-2 if got.dtype == np.float16 else 1e-3): raise AssertionError(f"result differs from {'torch' if torch else 'numpy'}: max relative error {err:.2e}")
      t_tc, t_torch = best([once, t_once], args.runs, 2)
      rec.update(tilecraft_s=t_tc, torch_s=t_torch, compile_s=compile_s, opts=[[str(o) for o in r.p.applied_opts] for r in runners],
                 launch=[(r.p.global_size, r.p.local_size) for r in runners])
      if torch is not None and "matmul" in name:
        torch.backends.cuda.matmul.allow_tf32 = True
        rec["torch_tf32_s"] = best([t_once], args.runs, 2)[0]
        torch.backends.cuda.matmul.allow_tf32 = False
      ratio = f"{t_torch / t_tc:.3f}" if t_torch else "-"
      rows.append(f"{name:22s} {t_tc * 1e3:10.3f} {t_torch * 1e3 if t_torch else float('nan'):10.3f} {ratio:>8s} {flops / t_tc / 1e9:9.1f} {nbytes / t_tc / 1e9:8.1f}"
                  + (f"   torch tf32 {rec['torch_tf32_s'] * 1e3:.3f} ms" if "torch_tf32_s" in rec else ""))
      print(f"  {name}: opts {rec['opts']}, launch {rec['launch']}, compile {compile_s:.1f} s")
    except Exception as e:  # noqa: BLE001 - report every case
      ok = False
      rec["error"] = f"{type(e).__name__}: {e}"
      rows.append(f"{name:22s} FAILED: {rec['error'][:200]}")
    recs.append(rec)
  print(f"\n{'case':22s} {'tc ms':>10s} {'torch ms':>10s} {'ratio':>8s} {'GFLOPS':>9s} {'GB/s':>8s}   (ratio = torch / tilecraft)")
  print("\n".join(rows))
  if args.reduces: ok = reduce_table(torch, rng, args.runs, recs) and ok
  models = [m for m in args.models.split(",") if m]
  if models:
    print(f"\n{'model':14s} {'ms/call':>9s} {'first call s':>13s} {'kernels':>8s} {'max rel err vs ORT':>19s}")
    for m in models:
      try: recs.append(rec := model_case(m, args.runs))
      except Exception as e:  # noqa: BLE001 - report every model
        ok = False
        recs.append({"model": m, "error": f"{type(e).__name__}: {e}"})
        print(f"{m:14s} FAILED: {type(e).__name__}: {str(e)[:300]}")
        continue
      print(f"{m:14s} {rec['call_s'] * 1e3:9.3f} {rec['first_call_s']:13.1f} {rec['kernels']:8d} {rec['max_rel_error']:19.2e}")
  if args.json:
    with open(args.json, "w") as f: json.dump({"gpu": c.name, "arch": c.arch, "cases": recs}, f, indent=1, default=str)
  return 0 if ok else 1

REDUCE_CASES = [  # name, shape, tilecraft expression, torch expression (on the one input)
  ("sum rows 4096x4096", (4096, 4096), lambda t: t.sum(-1), lambda t: t.sum(-1)),
  ("sum rows 16384x1024", (16384, 1024), lambda t: t.sum(-1), lambda t: t.sum(-1)),
  ("sum 64M", (64 << 20,), lambda t: t.sum(), lambda t: t.sum()),
  ("sum cols 4096x4096", (4096, 4096), lambda t: t.sum(0), lambda t: t.sum(0)),
  ("softmax 4096x4096", (4096, 4096), lambda t: t.softmax(-1), lambda t: t.softmax(-1)),
  ("softmax attn 12x128x128", (12, 128, 128), lambda t: t.softmax(-1), lambda t: t.softmax(-1)),
  ("layernorm 4096x768", (4096, 768), lambda t: t.layernorm(), lambda t: __import__("torch").nn.functional.layer_norm(t, (768,), eps=1e-5)),
  ("mean hw 8x256x56x56", (8, 256, 56, 56), lambda t: t.mean((2, 3)), lambda t: t.mean((2, 3))),
  ("bn stats 32x64x28x28", (32, 64, 28, 28), lambda t: t.mean((0, 2, 3)), lambda t: t.mean((0, 2, 3))),
]

def reduce_table(torch: Any, rng: Any, runs: int, recs: list) -> bool:
  """Reduces at model shapes with the GPU_FILL rule (codegen/heuristic.py: grouped memory-bound reduces) and
  without it (GPU_FILL=0, the reference's rule), and torch, all timed interleaved in one run."""
  from tilecraft import Context
  from tilecraft.helpers import GPU_FILL
  print(f"\n{'reduce':26s} {'fill ms':>9s} {'fill=0 ms':>10s} {'torch ms':>9s} {'fill/0':>7s} {'torch/fill':>10s} {'GB/s':>7s}  (GPU_FILL={int(GPU_FILL)})")
  ok = True
  for name, shape, tc_fn, torch_fn in REDUCE_CASES:
    x = rng.standard_normal(shape, dtype=np.float32)
    try:
      variants = []
      for fill in (int(GPU_FILL), 0):
        with Context(GPU_FILL=fill): variants.append(tilecraft_case(lambda: tc_fn(Tensor(x, device="CUDA"))))
      want = None
      t_once = None
      if torch is not None:
        xt = torch.from_numpy(x).cuda()
        want = torch_fn(xt).double().cpu().numpy()
        t_once = torch_timer(torch, lambda: torch_fn(xt))
      for once, result, runners, _ in variants:
        got = result()
        if want is not None and not np.allclose(got.reshape(want.shape), want, rtol=1e-3, atol=1e-3 * float(np.abs(want).max())):
          raise AssertionError(f"differs from torch: max abs error {float(np.max(np.abs(got.reshape(want.shape) - want))):.2e}")
      t_fill, t_0, t_torch = best([variants[0][0], variants[1][0], t_once], runs, 2)
      rec = {"name": f"reduce {name}", "fill_s": t_fill, "fill0_s": t_0, "torch_s": t_torch,
             "opts": [[str(o) for o in r.p.applied_opts] for r in variants[0][2]], "launch": [(r.p.global_size, r.p.local_size) for r in variants[0][2]],
             "opts_fill0": [[str(o) for o in r.p.applied_opts] for r in variants[1][2]]}
      recs.append(rec)
      gbs = x.nbytes / t_fill / 1e9
      print(f"{name:26s} {t_fill * 1e3:9.3f} {t_0 * 1e3:10.3f} {t_torch * 1e3 if t_torch else float('nan'):9.3f} {t_0 / t_fill:7.2f} "
            f"{t_torch / t_fill if t_torch else float('nan'):10.2f} {gbs:7.0f}  {rec['launch']}")
    except Exception as e:  # noqa: BLE001 - report every case
      ok = False
      recs.append({"name": f"reduce {name}", "error": f"{type(e).__name__}: {e}"})
      print(f"{name:26s} FAILED: {type(e).__name__}: {str(e)[:200]}")
  return ok

def model_case(name: str, runs: int, device: str = "CUDA") -> dict[str, Any]:
  """Light ONNX model `name` on CUDA: first call (compiles), best wall time per call of `runs`, the
  kernels per call, and the largest error against onnxruntime on CPU relative to each output's max."""
  import onnxruntime as ort
  from tilecraft.onnx import load
  from tilecraft.onnx.light import light_input, light_model
  model = light_model(name, seed=0)
  inp = light_input(model, seed=0)
  ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inp)
  tm = load(model, device)
  t0 = time.perf_counter()
  out = tm.run(inp)
  first = time.perf_counter() - t0
  err = max(float(np.max(np.abs(out[o.name] - r)) / (np.max(np.abs(r)) + 1e-30)) for o, r in zip(model.graph.output, ref))
  if not err < 1e-3: raise AssertionError(f"{name} on {device} differs from onnxruntime: max relative error {err:.2e}")
  best_s = float("inf")
  for _ in range(max(runs, 3)):
    t0 = time.perf_counter()
    tm.run(inp)
    best_s = min(best_s, time.perf_counter() - t0)
  return {"model": name, "call_s": best_s, "first_call_s": first, "kernels": kernel_count(tm, inp), "max_rel_error": err}

def kernel_count(tm: Any, inp: dict) -> int:
  """Kernels launched by one call of the loaded model."""
  from tilecraft.engine import realize
  k0 = realize.kernel_count
  tm.run(inp)
  return realize.kernel_count - k0

if __name__ == "__main__": sys.exit(main())
