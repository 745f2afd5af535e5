"""Per-kernel profile of an ONNX model on the CPU: which kernels a call spends its time in, with the
hand-coded opts of the current heuristics, and optionally those of another version of
`tilecraft/codegen/heuristic.py` timed side by side in the same run (interleaved, best of --reps).

  python bench/profile_onnx_kernels.py --models squeezenet [--threads 2] [--reps 5] [--top 25]
      [--before REV]   # a git revision (e.g. HEAD~1), or an older single heuristic.py file

One call of the model is run with its schedule recorded; each distinct kernel (AST) is then compiled
with each heuristic and timed on the very buffers the call used (each kernel's inputs hold the real
activations). Rows are sorted by time x launches per call; `share` is a kernel's part of the sum over
all kernels (the current heuristics' times), `ratio` is before / now (above 1: now is faster).
Every kernel's output under the "before" opts is compared with the current one's (max relative diff).
"""
from __future__ import annotations
import argparse, importlib.util, os, subprocess, sys, tempfile, time
from typing import Any, Optional

def _args() -> argparse.Namespace:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--models", default="squeezenet")
  ap.add_argument("--threads", type=int, default=2)
  ap.add_argument("--reps", type=int, default=5, help="timed calls per kernel per heuristic (best counts)")
  ap.add_argument("--top", type=int, default=25, help="rows printed per model")
  ap.add_argument("--before", default=None, help="another version of the heuristics to time side by side: a git revision, or a heuristic.py file")
  ap.add_argument("--only", default=None, help="only kernels whose name contains this")
  return ap.parse_args()

def _load_module(spec: str) -> Any:
  """The hand-coded heuristics of another version: a git revision (its codegen/heuristic.py and, where it
  has one, codegen/heuristic_cpu.py, loaded as a pair outside the package), or one heuristic.py file of
  a version before the CPU rules had their own file."""
  d = tempfile.mkdtemp(prefix="heuristic_before_")
  if os.path.exists(spec): path = spec
  else:
    def show(f: str) -> Optional[str]:
      r = subprocess.run(["git", "show", f"{spec}:tilecraft/codegen/{f}"], capture_output=True, text=True, cwd=os.path.dirname(os.path.abspath(__file__)))
      return r.stdout if r.returncode == 0 else None
    if (src := show("heuristic.py")) is None: raise SystemExit(f"--before {spec}: neither a file nor a git revision with tilecraft/codegen/heuristic.py")
    if (cpu := show("heuristic_cpu.py")) is not None:
      with open(os.path.join(d, "heuristic_cpu_before.py"), "w") as f: f.write(cpu)
      src = src.replace("from tilecraft.codegen.heuristic_cpu import", "from heuristic_cpu_before import")
    path = os.path.join(d, "heuristic_before.py")
    with open(path, "w") as f: f.write(src)
  sys.path.insert(0, d)
  try:
    mspec = importlib.util.spec_from_file_location("heuristic_before", path)
    assert mspec is not None and mspec.loader is not None
    mod = importlib.util.module_from_spec(mspec)
    mspec.loader.exec_module(mod)
  finally: sys.path.remove(d)
  return mod

def record_schedule(model: Any, feed: dict) -> list:
  """The schedule items one call of `model` (a tilecraft OnnxModel) runs: its capture's schedule."""
  model.run(feed)  # builds, compiles and captures the graph for this input signature
  caps = list(model._captures.values())
  if not caps: raise RuntimeError("the model made no capture (its structure reads input data): nothing to profile")
  return list(caps[-1].schedule)

def _runner(ast: Any, heuristic: Any) -> Any:
  from tilecraft.codegen.kernel import Kernel
  from tilecraft.device import CompiledRunner, Device
  k = Kernel(ast, Device["CPU"].renderer)
  k = heuristic(k.copy())
  return CompiledRunner(k.to_program())

def time_side_by_side(items: list, reps: int, before: Optional[Any], only: Optional[str] = None) -> list[dict]:
  """Each (ast, bufs, var_vals, count) of `items` compiled with the current heuristics and, if `before` (a
  heuristic module) is given, with its opts too; timed interleaved on `bufs`, best of `reps` each. One row
  per item: name, count, now/before seconds, GFLOPS, both opts and the outputs' max relative difference."""
  import numpy as np
  from tilecraft.codegen.heuristic import hand_coded_optimizations
  rows = []
  for ast, bufs, var_vals, count in items:
    now = _runner(ast, hand_coded_optimizations)
    if only and only not in now.p.name: continue
    old = _runner(ast, before.hand_coded_optimizations) if before is not None else None
    out_now = out_old = None
    now(bufs, var_vals)
    if old is not None:
      old(bufs, var_vals)
      out_old = bufs[0].numpy().copy()
    now(bufs, var_vals)
    out_now = bufs[0].numpy().copy()
    t_now, t_old = [], []
    for _ in range(reps):  # interleaved: load bursts hit both sides
      t_now.append(now(bufs, var_vals))
      if old is not None: t_old.append(old(bufs, var_vals))
    diff = None
    if out_old is not None:
      scale = max(float(np.abs(out_now[np.isfinite(out_now)]).max(initial=0.0)), 1e-30)
      with np.errstate(invalid="ignore"):  # (equal infinities, a -inf padding, count as equal)
        diff = float(np.where(out_now == out_old, 0.0, np.abs(out_now.astype(np.float64) - out_old)).max()) / scale
    rows.append({"name": now.p.name, "count": count, "now": min(t_now), "before": min(t_old) if t_old else None,
                 "gflops": (now.p.op_estimate or 0) / max(min(t_now), 1e-9) / 1e9 if isinstance(now.p.op_estimate, int) else None,
                 "opts": [f"{o.op.name}{o.axis},{o.amt}" for o in now.p.applied_opts],
                 "opts_before": [f"{o.op.name}{o.axis},{o.amt}" for o in old.p.applied_opts] if old is not None else None, "diff": diff})
  return rows

def profile(name: str, reps: int, before: Optional[Any], only: Optional[str]) -> list[dict]:
  from tilecraft.onnx import load
  from tilecraft.onnx.light import light_input, light_model
  from tilecraft.ops import MetaOps
  model = light_model(name)
  m = load(model)
  feed = light_input(model)
  items = [si for si in record_schedule(m, feed) if si.ast.op is not MetaOps.COPY]
  by_ast: dict = {}
  for si in items:
    by_ast.setdefault(si.ast, []).append(si)
  return time_side_by_side([(ast, list(sis[0].bufs), sis[0].var_vals, len(sis)) for ast, sis in by_ast.items()], reps, before, only)

def print_rows(title: str, rows: list[dict], before: Optional[Any], top: int) -> None:
  """The rows sorted by time x count, with each one's share of the total (and before/now ratios)."""
  total = sum(r["now"] * r["count"] for r in rows)
  total_old = sum(r["before"] * r["count"] for r in rows) if before is not None else None
  print(f"\n== {title}: {len(rows)} distinct kernels, {sum(r['count'] for r in rows)} launches, sum of kernel times {total * 1e3:.2f} ms"
        + (f" (before: {total_old * 1e3:.2f} ms, ratio {total_old / total:.2f}x)" if total_old else ""))
  print(f"{'kernel':42s} {'n':>3s} {'us':>9s} {'share':>6s} {'GFLOPS':>7s}" + (f" {'before':>9s} {'ratio':>6s} {'diff':>8s}" if before else "") + "  opts")
  for r in sorted(rows, key=lambda r: -r["now"] * r["count"])[:top]:
    line = f"{r['name'][:42]:42s} {r['count']:3d} {r['now'] * 1e6:9.1f} {100 * r['now'] * r['count'] / total:5.1f}% {r['gflops'] or 0:7.1f}"
    if before is not None: line += f" {r['before'] * 1e6:9.1f} {r['before'] / r['now']:5.2f}x {r['diff']:8.1e}"
    line += "  " + " ".join(r["opts"])
    if before is not None and r["opts_before"] != r["opts"]: line += "  | before: " + " ".join(r["opts_before"])
    print(line)
  sys.stdout.flush()

def main() -> None:
  args = _args()
  os.environ["OMP_NUM_THREADS"] = str(args.threads)
  before = _load_module(args.before) if args.before else None
  for name in args.models.split(","):
    t0 = time.perf_counter()
    rows = profile(name, args.reps, before, args.only)
    print_rows(f"{name} [{time.perf_counter() - t0:.0f} s]", rows, before, args.top)

if __name__ == "__main__":
  main()
