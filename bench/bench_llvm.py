"""LLVM vs CPU (gcc) on the bench suite, side by side in one run: per bench kernel the kernel time on
each device (hand-coded opts, both verified against numpy by `tilecraft bench`'s run_case), the
ratio LLVM / gcc (the target is <= 1.25), the cores each uses on it (process CPU time / wall time
while the kernels run back to back for ~0.3 s; the big kernels should use >= 1.6 of 2 cores), and
the compile latency per kernel: the LLVM JIT (parse + O3 pipeline + codegen, in process) next to
gcc (a subprocess), both uncached.

Run: python bench/bench_llvm.py [--quick] [-k NAME] [--json PATH]
"""
from __future__ import annotations
import argparse, json, os, sys, time
from typing import Any
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tilecraft.cli import fmt_time, format_table  # noqa: E402
from tilecraft.cli.bench import run_case  # noqa: E402
from tilecraft.cli.suite import select, suite  # noqa: E402
from tilecraft.device import Device  # noqa: E402

DEVICES = ("CPU", "LLVM")
BIG_S = 1e-3  # a kernel taking >= 1 ms (on gcc's build) counts as big: its cores used are checked

def cores_used(case: Any, device: str, seconds: float = 0.3) -> float:
  """CPU time / wall time of this process while the case's kernels run back to back."""
  from tilecraft import Tensor
  from tilecraft.engine.realize import get_runner
  from tilecraft.ops import MetaOps
  import numpy as np
  arrays = case.make_inputs(np.random.default_rng(0))
  out = case.tilecraft_fn(*[Tensor(a, device=device) for a in arrays])
  items = [si for si in out.schedule() if si.ast.op is MetaOps.KERNEL]
  out.realize()
  runners = [(get_runner(si.ast, device, list(si.bufs)), si) for si in items]
  for r, si in runners: r(list(si.bufs), si.var_vals)
  cpu0, wall0, n = time.process_time(), time.perf_counter(), 0
  while time.perf_counter() - wall0 < seconds or n < 3:
    for r, si in runners: r(list(si.bufs), si.var_vals)
    n += 1
  return (time.process_time() - cpu0) / (time.perf_counter() - wall0)

def compile_latency(rec: dict[str, Any], device: str, case: Any) -> float:
  """Seconds to compile every kernel of the case from source, no cache (the sum over its kernels)."""
  from tilecraft import Tensor
  from tilecraft.engine.realize import get_runner
  from tilecraft.ops import MetaOps
  import numpy as np
  arrays = case.make_inputs(np.random.default_rng(0))
  out = case.tilecraft_fn(*[Tensor(a, device=device) for a in arrays])
  srcs = [get_runner(si.ast, device, list(si.bufs)).p.src for si in out.schedule() if si.ast.op is MetaOps.KERNEL]
  comp = Device[device].compiler
  t0 = time.perf_counter()
  for s in srcs: comp.compile(s)
  return time.perf_counter() - t0

def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--quick", action="store_true", help="the small bench sizes")
  ap.add_argument("-k", "--only", action="append", help="only kernels whose name contains this")
  ap.add_argument("--runs", type=int, default=None)
  ap.add_argument("--json", help="write the records here")
  args = ap.parse_args()
  runs = args.runs or (3 if args.quick else 10)
  cases = select(suite(args.quick), args.only)
  rows, records, ok = [], [], True
  for case in cases:
    rec: dict[str, Any] = {"name": case.key}
    for dev in DEVICES:
      print(f"{case.key} on {dev} ...", file=sys.stderr, flush=True)
      r = run_case(case, dev, runs, 2, min_time=0.1 if args.quick else 0.25)
      ok &= r["ok"]
      rec[dev] = {"time_s": r["time_s"], "ok": r["ok"], "error": r["error"], "kernels": len(r["schedule"]),
                  "compile_s": compile_latency(r, dev, case), "cores": cores_used(case, dev)}
    c, l = rec["CPU"], rec["LLVM"]
    rec["ratio"] = l["time_s"] / c["time_s"] if c["time_s"] and l["time_s"] else None
    rec["big"] = bool(c["time_s"] and c["time_s"] >= BIG_S)
    records.append(rec)
    rows.append([case.key, l["kernels"], fmt_time(c["time_s"]), fmt_time(l["time_s"]), "-" if rec["ratio"] is None else f"{rec['ratio']:.2f}x",
                 f"{c['cores']:.2f}", f"{l['cores']:.2f}" + (" (big)" if rec["big"] else ""), fmt_time(c["compile_s"]), fmt_time(l["compile_s"]),
                 "ok" if c["ok"] and l["ok"] else "FAIL"])
  print(f"LLVM vs CPU (gcc), hand-coded opts, {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at the end")
  print(format_table(["kernel", "k", "gcc time", "LLVM time", "LLVM/gcc", "gcc cores", "LLVM cores", "gcc compile", "LLVM compile", "check"], rows,
                     "lrrrrrrrrl"))
  ratios = [r["ratio"] for r in records if r["ratio"]]
  if ratios:
    geo = 1.0
    for x in ratios: geo *= x
    big = ", ".join(f"{r['name']} {r['LLVM']['cores']:.2f}" for r in records if r["big"]) or "-"
    print(f"geomean LLVM/gcc kernel time: {geo ** (1 / len(ratios)):.2f}x over {len(ratios)} kernels; worst {max(ratios):.2f}x; "
          f"LLVM cores on the big kernels: {big}")
  if args.json:
    with open(args.json, "w") as f: json.dump(records, f, indent=1)
  return 0 if ok else 1

if __name__ == "__main__": sys.exit(main())
