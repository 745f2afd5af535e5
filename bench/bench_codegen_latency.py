"""Code generation latency, tilecraft vs tinygrad 0.9.2, side by side in one run: for the same
user code, the time from each kernel's AST to its C source with the hand-coded opts
(Kernel(ast) + hand_coded_optimizations + to_program), summed over the schedule's kernels.
Scheduling, compiling and running are not timed. Two input kinds: realized inputs
(Tensor.empty, already in memory) and Tensor.rand inputs (their kernels are in the schedule).

tinygrad is never a tilecraft dependency: it runs in its own virtualenv, in a subprocess:
  python3 -m venv /tmp/tg && /tmp/tg/bin/pip install tinygrad==0.9.2 numpy
  python bench/bench_codegen_latency.py [--peer-python /tmp/tg/bin/python] [--rounds 5]

Rounds interleave the two (tilecraft, tinygrad, tilecraft, ...); each workload's time is the best
over the rounds, in CPU time of the (single) Python thread, so time spent descheduled on a shared
machine doesn't count. Read the ratios, not the absolute times.
"""
from __future__ import annotations
import argparse, json, math, os, subprocess, sys, time

# (name, builder) -- the builder takes the framework's Tensor class and the input kind
def _inputs(T, kind: str, *shape):
  return T.rand(*shape) if kind == "rand" else T.empty(*shape).realize()

WORKLOADS = {
  "matmul 256": lambda T, kind: _inputs(T, kind, 256, 256) @ _inputs(T, kind, 256, 256),
  "conv 3x3 64->64 56^2": lambda T, kind: _inputs(T, kind, 1, 64, 56, 56).conv2d(_inputs(T, kind, 64, 64, 3, 3), padding=1),
  "(a*b+c).relu() 4096^2": lambda T, kind: (_inputs(T, kind, 4096, 4096) * _inputs(T, kind, 4096, 4096) + _inputs(T, kind, 4096, 4096)).relu(),
  "softmax rows 4096x1024": lambda T, kind: _inputs(T, kind, 4096, 1024).softmax(1),
  "sum rows 4096x1024": lambda T, kind: _inputs(T, kind, 4096, 1024).sum(1),
}
KINDS = ("realized", "rand")

def _time_schedules(scheds: dict, make_kernel, reps: int) -> dict:
  """Best-of-reps seconds per workload: AST -> source for every kernel of its schedule."""
  out = {}
  for key, asts in scheds.items():
    best = math.inf
    for _ in range(reps):
      t0 = time.thread_time()
      for ast in asts: make_kernel(ast)
      best = min(best, time.thread_time() - t0)
    out[key] = best
  return out

# ---- tinygrad side (runs under the peer's python; imports nothing from tilecraft) -----------------

def peer_main(reps: int) -> None:
  os.environ.setdefault("CLANG", "1")
  from tinygrad import Tensor, Device
  from tinygrad.codegen.kernel import Kernel
  from tinygrad.ops import MetaOps
  ren = Device[Device.DEFAULT].renderer
  scheds = {}
  for kind in KINDS:
    for name, make in WORKLOADS.items():
      scheds[f"{name}|{kind}"] = [si.ast for si in make(Tensor, kind).schedule() if si.ast.op is MetaOps.KERNEL]
  def one(ast):
    k = Kernel(ast, opts=ren).required_optimizations()
    k.hand_coded_optimizations()
    k.to_program()
  _time_schedules(scheds, one, 1)  # warm-up
  for line in sys.stdin:  # one line per round: time and report
    if line.strip() != "round": break
    print(json.dumps({"device": Device.DEFAULT, "times": _time_schedules(scheds, one, reps),
                      "kernels": {k: len(v) for k, v in scheds.items()}}), flush=True)

# ---- tilecraft side -------------------------------------------------------------------------------

def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--peer-python", default="/tmp/tg/bin/python", help="python of the venv with tinygrad 0.9.2")
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--reps", type=int, default=3, help="timings per workload per round")
  ap.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.peer: return peer_main(args.reps)
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from tilecraft import Tensor
  from tilecraft.codegen.kernel import Kernel
  from tilecraft.device import Device
  from tilecraft.ops import MetaOps
  ren = Device["CPU"].renderer
  scheds = {}
  for kind in KINDS:
    for name, make in WORKLOADS.items():
      scheds[f"{name}|{kind}"] = [si.ast for si in make(Tensor, kind).schedule() if si.ast.op is MetaOps.KERNEL]
  def one(ast):
    k = Kernel(ast, ren)
    k.hand_coded_optimizations()
    k.to_program()
  _time_schedules(scheds, one, 1)  # warm-up
  if not os.path.exists(args.peer_python): sys.exit(f"no peer python at {args.peer_python}: python3 -m venv /tmp/tg && /tmp/tg/bin/pip install tinygrad==0.9.2 numpy")
  peer = subprocess.Popen([args.peer_python, os.path.abspath(__file__), "--peer", "--reps", str(args.reps)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ""})
  ours: dict = {k: math.inf for k in scheds}
  theirs: dict = {k: math.inf for k in scheds}
  peer_kernels: dict = {}
  assert peer.stdin is not None and peer.stdout is not None
  for _ in range(args.rounds):
    for k, t in _time_schedules(scheds, one, args.reps).items(): ours[k] = min(ours[k], t)
    peer.stdin.write("round\n"); peer.stdin.flush()
    rec = json.loads(peer.stdout.readline())
    peer_kernels = rec["kernels"]
    for k, t in rec["times"].items(): theirs[k] = min(theirs[k], t)
  peer.stdin.write("done\n"); peer.stdin.close(); peer.wait()
  print(f"codegen latency, AST -> C source with hand-coded opts, summed over each schedule's kernels; best of {args.rounds} interleaved rounds x {args.reps}, CPU time")
  print(f"tilecraft CPU (C) vs tinygrad 0.9.2 {rec['device']} (C); ratio = tilecraft / tinygrad (lower is better)")
  for kind, target in (("realized", 0.2), ("rand", 1.0)):
    print(f"\ninputs: {kind}")
    print(f"  {'workload':26s} {'kernels':>8s} {'tilecraft':>11s} {'tinygrad':>11s} {'ratio':>7s}")
    ratios = []
    for name in WORKLOADS:
      key = f"{name}|{kind}"
      r = ours[key] / theirs[key]
      ratios.append(r)
      print(f"  {name:26s} {len(scheds[key]):>3d}/{peer_kernels.get(key, '?'):<4} {ours[key]*1e3:9.2f}ms {theirs[key]*1e3:9.2f}ms {r:6.2f}x")
    g = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print(f"  geomean ratio {g:.2f}x (target <= {target}x: {'ok' if g <= target else 'MISSED'})")

if __name__ == "__main__":
  main()
