"""What `realize()` costs on top of its kernels, for cached kernels: a 16x16 matmul (all Python), and
a few bench workloads. For each: `f(*inputs)` (building the lazy graph), `.realize()` of the built
tensor (schedule, runner lookup, output allocation, launch), the whole call, and the kernels alone.

With `--against CHECKOUT` the same measurements run on another checkout of tilecraft (e.g. a
`git worktree add --detach /tmp/base main~5`) side by side: one worker process per checkout,
timed in alternating rounds, so load on a shared machine hits both alike.

Times are medians over the calls of a round (tail latencies on a busy machine are descheduling,
not overhead), best round counts. `--cpu` times build, realize and call in CPU time of the process
(time.process_time) instead of wall time: on a loaded machine that is the steadier measure of
Python overhead, for the small cases whose kernels are negligible (kernels use every core, so
their CPU time is not their wall time: read the big cases in wall time).

Run: python bench/bench_realize.py [--against CHECKOUT] [--rounds 5] [--calls 200] [--cpu]
"""
from __future__ import annotations
import argparse, json, os, subprocess, sys, time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = ["matmul 16x16", "relu 16x16", "matmul_256", "matmul_512", "matvec_4096", "conv2d_64x56", "softmax_4096x1024", "layernorm_4096x1024",
         "sum_16M", "elementwise_16M"]

def _median(xs: list[float]) -> float: return sorted(xs)[len(xs) // 2]

def worker(cpu: bool) -> None:
  """Measure on request; JSON lines in, JSON lines out (this checkout comes from PYTHONPATH)."""
  import numpy as np
  from tilecraft import Tensor
  from tilecraft.cli.suite import suite
  from tilecraft.engine.realize import get_runner
  cases: dict[str, Any] = {c.key: (c.make_inputs, c.tilecraft_fn) for c in suite()}
  cases["matmul 16x16"] = (lambda r: [r.random((16, 16), dtype=np.float32), r.random((16, 16), dtype=np.float32)], lambda a, b: a @ b)
  cases["relu 16x16"] = (lambda r: [r.random((16, 16), dtype=np.float32) for _ in range(3)], lambda a, b, c: (a * b + c).relu())
  clock = time.process_time if cpu else time.perf_counter
  in_kernels = [0.0]
  def counted(launch: Any) -> Any:
    def counted_launch(self: Any, *args: Any, **kw: Any) -> Any:  # this thread's CPU time inside kernel launches
      c = time.thread_time()
      try: return launch(self, *args, **kw)
      finally: in_kernels[0] += time.thread_time() - c
    return counted_launch
  state: dict[str, Any] = {}
  out, sys.stdout = sys.stdout, sys.stderr
  print(json.dumps({"ready": True}), file=out, flush=True)
  for line in sys.stdin:
    name, calls = json.loads(line)
    if name not in state:
      make, fn = cases[name]
      ts = [Tensor(a).realize() for a in make(np.random.default_rng(0))]
      o = fn(*ts)
      items = o.schedule()
      o.realize()
      runners = [get_runner(si.ast, si.bufs[0].device) for si in items]
      state[name] = (fn, ts, items, runners)
    fn, ts, items, runners = state[name]
    n = max(3, calls if name.endswith("16x16") else calls // 20)
    build, realize, call, kern, py = [], [], [], [], []
    for _ in range(n):
      t0 = clock(); o = fn(*ts); t1 = clock(); o.realize(); t2 = clock()
      del o
      t3 = clock(); fn(*ts).realize(); t4 = clock()
      kern.append(sum(r(list(si.bufs), si.var_vals) or 0.0 for r, si in zip(runners, items)))
      build.append(t1 - t0); realize.append(t2 - t1); call.append(t4 - t3)
      # the runtime's launches (what a runner calls: the program, or its launch(*handles) where it has one)
      programs = {(type(r.clprg), m): getattr(type(r.clprg), m) for r in runners for m in ("__call__", "launch") if hasattr(type(r.clprg), m)}
      for (cls, m), launch in programs.items(): setattr(cls, m, counted(launch))
      in_kernels[0] = 0.0
      try:
        c0 = time.thread_time(); fn(*ts).realize(); c1 = time.thread_time()
      finally:
        for (cls, m), launch in programs.items(): setattr(cls, m, launch)
      py.append(c1 - c0 - in_kernels[0])
    pair = [c / max(k, 1e-9) for c, k in zip(call, kern)]  # each call over the kernels run right after it: load drifts cancel
    print(json.dumps({"build": _median(build), "realize": _median(realize), "call": _median(call), "kernels": _median(kern),
                      "pair": _median(pair), "py": _median(py)}), file=out, flush=True)

class Worker:
  def __init__(self, checkout: str, cpu: bool):
    env = {**os.environ, "PYTHONPATH": checkout}
    for k in ("DEBUG", "BEAM", "NOOPT"): env.pop(k, None)
    self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"] + (["--cpu"] if cpu else []), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env, cwd=checkout)
    self.read()
  def read(self) -> dict:
    line = self.p.stdout.readline()  # type: ignore[union-attr]
    if not line: sys.exit(f"a worker died (exit code {self.p.wait()})")
    return json.loads(line)
  def measure(self, name: str, calls: int) -> dict:
    self.p.stdin.write(json.dumps([name, calls]) + "\n")  # type: ignore[union-attr]
    self.p.stdin.flush()  # type: ignore[union-attr]
    return self.read()
  def close(self) -> None:
    self.p.stdin.close()  # type: ignore[union-attr]
    self.p.wait(timeout=30)

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--against", metavar="CHECKOUT", help="another tilecraft checkout to measure side by side")
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--calls", type=int, default=200, help="calls per round for the 16x16 cases (bench workloads: 1/20 of it)")
  ap.add_argument("--cpu", action="store_true", help="build/realize/call in process CPU time (kernels stay wall time)")
  ap.add_argument("-k", dest="only", action="append", help="only cases whose name contains this")
  ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.worker: return worker(args.cpu)
  checkouts = {"this": ROOT} | ({"against": os.path.abspath(args.against)} if args.against else {})
  workers = {k: Worker(v, args.cpu) for k, v in checkouts.items()}
  names = [n for n in CASES if not args.only or any(s in n for s in args.only)]
  best: dict[tuple[str, str], dict] = {}
  for r in range(args.rounds):
    for n in names:
      for k in (list(workers) if r % 2 == 0 else list(reversed(workers))):
        m = workers[k].measure(n, args.calls)
        prev = best.get((k, n))
        best[(k, n)] = m if prev is None else {f: min(prev[f], m[f]) for f in m}
  for w in workers.values(): w.close()
  for k, path in checkouts.items(): print(f"{k}: {path}")
  print(f"medians per round, best of {args.rounds} rounds; {'build/realize/call in process CPU time, ' if args.cpu else ''}"
        "kernels: the schedule's kernels alone (CompiledRunner, wall time); overhead = call - kernels; "
        "pairs: median over calls of (that call / the kernels run right after it); "
        "py: the calling thread's CPU time in a call outside its kernel launches (Python: build, schedule, launch bookkeeping; "
        "steady under load); 1+py/kern: the ratio that implies")
  print(f"{'case':20s} {'checkout':8s} {'build':>9s} {'realize':>9s} {'call':>9s} {'kernels':>9s} {'overhead':>9s} {'call/kern':>9s} {'pairs':>7s}"
        f" {'py':>9s} {'1+py/kern':>9s}")
  for n in names:
    for k in workers:
      m = best[(k, n)]
      print(f"{n:20s} {k:8s} " + " ".join(f"{m[f]*1e3:6.3f} ms" for f in ("build", "realize", "call", "kernels")) +
            f" {(m['call'] - m['kernels'])*1e3:6.3f} ms {m['call'] / max(m['kernels'], 1e-9):8.2f}x {m['pair']:6.2f}x"
            f" {m['py']*1e3:6.3f} ms {1 + m['py'] / max(m['kernels'], 1e-9):8.2f}x")
    if args.against:
      a, b = best[("this", n)], best[("against", n)]
      print(f"{'':20s} {'ratio':8s} {b['build']/a['build']:8.2f}x {b['realize']/a['realize']:8.2f}x {b['call']/a['call']:8.2f}x   (against / this)")

if __name__ == "__main__":
  main()
