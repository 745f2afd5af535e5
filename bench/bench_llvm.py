"""LLVM vs CPU (gcc) on the bench suite, side by side in one run. Per bench kernel:

  kernel time   the sum of the kernel times of its schedule (CompiledRunner, wall time around each
                call: OpenMP's parallel region for gcc, the thread pool's chunks for LLVM), best of
                `--rounds` rounds that alternate between the devices (so a load change on the machine
                hits both), each round the best of a few runs; both outputs verified against numpy
  LLVM/gcc      the ratio of those times (the target is <= 1.25)
  cores         process CPU time / wall time while the kernels run back to back for ~0.3 s (the big
                kernels, >= 1 ms, should use >= 1.6 of 2 cores)
  compile       the schedule's kernels compiled from source, uncached: the LLVM JIT in process
                (parse + O3 pipeline + codegen) next to gcc (a subprocess)

Run: python bench/bench_llvm.py [--quick] [-k NAME] [--rounds N] [--json PATH]
"""
from __future__ import annotations
import argparse, json, os, sys, time, zlib
from typing import Any
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tilecraft import Tensor  # noqa: E402
from tilecraft.cli import fmt_time, format_table  # noqa: E402
from tilecraft.cli.suite import BenchCase, select, suite  # noqa: E402
from tilecraft.device import Device  # noqa: E402
from tilecraft.engine.realize import get_runner  # noqa: E402
from tilecraft.ops import MetaOps  # noqa: E402

DEVICES = ("CPU", "LLVM")
BIG_S = 1e-3  # a bench kernel taking >= 1 ms with gcc counts as big: its cores used are checked

class Prepared:
  """One case realized on one device: its runners and buffers, verified against numpy."""
  def __init__(self, case: BenchCase, device: str):
    arrays = case.make_inputs(np.random.default_rng(zlib.crc32(case.key.encode())))
    out = case.tilecraft_fn(*[Tensor(a, device=device) for a in arrays])
    self.items = [si for si in out.schedule() if si.ast.op is MetaOps.KERNEL]
    out.realize()
    self.runners = [get_runner(si.ast, device, list(si.bufs)) for si in self.items]
    self.once()  # the output as a timed run leaves it
    with np.errstate(all="ignore"): ref = np.asarray(case.numpy_fn(*[a.astype(np.float64) for a in arrays]))
    got = out.numpy()
    scale = float(np.abs(ref).max()) or 1.0
    self.err = float(np.abs(got.astype(np.float64) - ref).max()) / scale if got.shape == ref.shape else float("inf")
    self.ok = bool(self.err <= case.tol)
    self.srcs = [r.p.src for r in self.runners]
    self.device = device
  def once(self) -> float:
    return sum(r(list(si.bufs), si.var_vals, wait=True) or 0.0 for r, si in zip(self.runners, self.items))
  def best(self, runs: int) -> float: return min(self.once() for _ in range(runs))
  def cores(self, seconds: float = 0.3) -> float:
    cpu0, wall0, n = time.process_time(), time.perf_counter(), 0
    while time.perf_counter() - wall0 < seconds or n < 3:
      self.once()
      n += 1
    return (time.process_time() - cpu0) / (time.perf_counter() - wall0)
  def compile_latency(self) -> float:
    comp = Device[self.device].compiler
    t0 = time.perf_counter()
    for s in self.srcs: comp.compile(s)
    return time.perf_counter() - t0

def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--quick", action="store_true", help="the small bench sizes")
  ap.add_argument("-k", "--only", action="append", help="only kernels whose name contains this")
  ap.add_argument("--rounds", type=int, default=5, help="alternating timing rounds (default 5)")
  ap.add_argument("--runs", type=int, default=3, help="runs per round, best counts (default 3)")
  ap.add_argument("--json", help="write the records here")
  args = ap.parse_args()
  rows, records, ok = [], [], True
  for case in select(suite(args.quick), args.only):
    print(f"{case.key} ...", file=sys.stderr, flush=True)
    preps = {d: Prepared(case, d) for d in DEVICES}
    best = {d: float("inf") for d in DEVICES}
    for _ in range(args.rounds):
      for d, p in preps.items(): best[d] = min(best[d], p.best(args.runs))
    rec: dict[str, Any] = {"name": case.key, "kernels": len(preps["LLVM"].runners)}
    for d, p in preps.items():
      ok &= p.ok
      rec[d] = {"time_s": best[d], "ok": p.ok, "max_rel_error": p.err, "cores": p.cores(), "compile_s": p.compile_latency()}
    c, l = rec["CPU"], rec["LLVM"]
    rec["ratio"], rec["big"] = l["time_s"] / c["time_s"], c["time_s"] >= BIG_S
    records.append(rec)
    rows.append([case.key, rec["kernels"], fmt_time(c["time_s"]), fmt_time(l["time_s"]), f"{rec['ratio']:.2f}x", f"{c['cores']:.2f}",
                 f"{l['cores']:.2f}" + (" (big)" if rec["big"] else ""), fmt_time(c["compile_s"]), fmt_time(l["compile_s"]),
                 "ok" if c["ok"] and l["ok"] else "FAIL"])
  print(f"LLVM vs CPU (gcc), hand-coded opts, {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at the end")
  print(format_table(["kernel", "k", "gcc time", "LLVM time", "LLVM/gcc", "gcc cores", "LLVM cores", "gcc compile", "LLVM compile", "check"], rows,
                     "lrrrrrrrrl"))
  if records:
    ratios = [r["ratio"] for r in records]
    geo = float(np.exp(np.mean(np.log(ratios))))
    comp = float(np.exp(np.mean(np.log([r["LLVM"]["compile_s"] / r["CPU"]["compile_s"] for r in records]))))
    big = ", ".join(f"{r['name']} {r['LLVM']['cores']:.2f}" for r in records if r["big"]) or "-"
    print(f"geomean LLVM/gcc kernel time {geo:.2f}x (worst {max(ratios):.2f}x); geomean compile latency LLVM/gcc {comp:.2f}x; "
          f"LLVM cores on the big kernels: {big}")
  if args.json:
    with open(args.json, "w") as f: json.dump(records, f, indent=1)
  return 0 if ok else 1

if __name__ == "__main__": sys.exit(main())
