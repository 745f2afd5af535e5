"""The CPU targets of issue 14, on both ISAs: every row measured side by side with its numpy
reference in one process, once with CPU_ARCH=native and once with CPU_ARCH=haswell (AVX2).

For the haswell column numpy is held to AVX2 too (OPENBLAS_CORETYPE=Haswell, and numpy's own
AVX-512 loops disabled with NPY_DISABLE_CPU_FEATURES), so both sides use the same vector width
on an AVX-512 host. tilecraft times are the sum of the schedule's kernel times (CompiledRunner),
hand-coded opts, no search; each row alternates tilecraft and reference runs and keeps the best
of --reps of each. Ratios:
  flops rows   numpy time / tilecraft time                        (>= target)
  bw rows      (bytes tilecraft moves / its time) / numpy copy bandwidth, the copy moving the
               same number of bytes                               (>= target)
  softmax      tilecraft time / time of a numpy copy of the input into the output (<= target)

With --beam S the table gains the row "BEAM=2 matmul 1024": the matmul kernel chosen by a width-2
beam search of at most S seconds per ISA (in a fresh search cache, so it really searches; the
hand-coded kernel is its floor), timed the same way.

Run: python bench/bench_cpu_targets.py [--archs native,haswell] [--reps 7] [--quick] [--cpu-time] [--only a+b,softmax] [--beam 60]
The machine may be shared: timings are noisy, so compare ratios within a column.
"""
from __future__ import annotations
import argparse, json, os, subprocess, sys, time

# OpenBLAS's idle workers spin for 2^OPENBLAS_THREAD_TIMEOUT cycles after each call (default 2^28,
# ~0.1 s), holding a core while the next tilecraft kernel runs: on 2 cores that made tilecraft's
# wall time no better than one thread's (matmul 1024: 23 ms, vs 14 ms when the cores are free).
# tilecraft's OpenMP threads spin ~1.5 ms, then sleep (runtime/cpu.py). So the spin is cut to 2^26
# cycles (~30 ms at 2 GHz: still spinning from the reference's warm-up call into its timed call)
# and each tilecraft run of a flops row starts SETTLE_S after the reference's, when its workers sleep.
OPENBLAS_THREAD_TIMEOUT, SETTLE_S = "26", 0.05
AVX512_FEATURES = "AVX512F AVX512CD AVX512_KNL AVX512_KNM AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR AVX512FP16"

def _rows(quick: bool, beam: float = 0.0) -> list:
  import numpy as np
  from tilecraft import Tensor
  rng = np.random.default_rng(0)
  f = lambda *s: rng.random(s, dtype=np.float32)  # noqa: E731
  n = 1 << (20 if quick else 24)
  S = 1024 if quick else 4096
  a, b, c, sq, A, x = f(n), f(n), f(n), f(S, S), f(S, S), f(S)
  img, w = f(64, 56, 56), f(64, 64, 3, 3)
  sm = f(2048 if quick else 16384, 1024)
  def im2col(img, w):
    cin, H, W = img.shape
    p = np.pad(img, ((0, 0), (1, 1), (1, 1)))
    cols = np.stack([p[:, ky:ky + H, kx:kx + W] for ky in range(3) for kx in range(3)], axis=1).reshape(cin * 9, H * W)
    return (w.reshape(w.shape[0], cin * 9) @ cols).reshape(1, w.shape[0], H, W)
  def softmax(m):
    e = np.exp(m - m.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)
  rows = []
  for s in ((128, 256) if quick else (256, 512, 1024)):
    p, q = f(s, s), f(s, s)
    rows.append((f"matmul {s}", lambda p=p, q=q: Tensor(p) @ Tensor(q), lambda p=p, q=q: p @ q, "flops", 0, 0.6))
  if beam > 0:
    s = 256 if quick else 1024
    p, q = f(s, s), f(s, s)
    rows.append((f"BEAM=2 matmul {s}", lambda: Tensor(p) @ Tensor(q), lambda: p @ q, "flops", 0, 0.9))
  rows += [
    (f"matvec {S}", lambda: Tensor(A) @ Tensor(x), lambda: A @ x, "flops", 0, 0.9),
    ("conv 3x3 64->64 56^2", lambda: Tensor(img[None]).conv2d(Tensor(w), padding=1), lambda: im2col(img, w), "flops", 0, 1.2),
    (f"sum {n >> 20}M", lambda: Tensor(a).sum(), lambda: a.sum(), "bw", 4 * n, 0.85),
    (f"row sums {S}^2 (axis 1)", lambda: Tensor(sq).sum(1), lambda: sq.sum(1), "bw", 4 * S * S, 0.85),
    (f"col sums {S}^2 (axis 0)", lambda: Tensor(sq).sum(0), lambda: sq.sum(0), "bw", 4 * S * S, 0.85),
    (f"a+b {n >> 20}M", lambda: Tensor(a) + Tensor(b), lambda: a + b, "bw", 12 * n, 0.9),
    (f"(a*b+c).relu() {n >> 20}M", lambda: (Tensor(a) * Tensor(b) + Tensor(c)).relu(), lambda: np.maximum(a * b + c, 0), "bw", 16 * n, 0.9),
    (f"softmax {sm.shape[0]}x1024", lambda: Tensor(sm).softmax(1), lambda: softmax(sm), "softmax", sm.nbytes, 2.0),
  ]
  return rows

def worker(quick: bool, reps: int, only: str = "", beam: float = 0.0) -> None:
  import tempfile
  import numpy as np
  from tilecraft import Context
  from tilecraft.device import Device
  from tilecraft.engine.realize import get_runner
  # --cpu-time: one thread each side, timed in CPU time (robust to being descheduled on a busy machine)
  clock = time.thread_time if os.environ.get("BENCH_CPU_TIME") else time.perf_counter
  def best(fn, n):
    fn()
    t = float("inf")
    for _ in range(n):
      t0 = clock(); fn(); t = min(t, clock() - t0)
    return t
  search_dir = tempfile.TemporaryDirectory(prefix="bench_cpu_targets-") if beam > 0 else None
  for name, make, ref, kind, nbytes, target in _rows(quick, beam):
    if only and not any(w in name for w in only.split(",")) and not name.startswith("BEAM"): continue
    searched = name.startswith("BEAM")
    out = make()
    sched = out.schedule()
    runners = []
    for si in sched:
      for buf in si.bufs:
        if not buf.is_allocated(): buf.allocate()
      settings = {"BEAM": 2, "BEAM_BUDGET": float(beam), "CACHEDB": os.path.join(search_dir.name, "search.db")} if searched and search_dir else {}
      with Context(**settings): r = get_runner(si.ast, "CPU", list(si.bufs))
      if searched:  # the search's worker processes go, and the machine settles, before the timed runs
        from tilecraft.engine.search import close_workers
        close_workers()
        time.sleep(2.0)
      r(list(si.bufs), si.var_vals)  # computes the inputs of the next kernel too
      runners.append((r, si))
    want = np.asarray(ref())
    got = out.numpy().reshape(want.shape)
    ok = bool(np.allclose(got, want, rtol=2e-3, atol=2e-3 * max(1.0, float(np.abs(want).max()))))
    def tc() -> None:
      for r, si in runners: r(list(si.bufs), si.var_vals)
    if kind == "flops": ref_fn = ref
    else:
      src = np.ones(nbytes // 4, dtype=np.float32)
      dst = np.empty_like(src)
      ref_fn = lambda: np.copyto(dst, src)  # noqa: E731
    t_tc, t_ref = float("inf"), float("inf")
    for _ in range(reps):  # interleaved; tilecraft starts once the reference's idle BLAS workers stopped spinning
      if kind == "flops" and not os.environ.get("BENCH_CPU_TIME"): time.sleep(SETTLE_S)
      t_tc, t_ref = min(t_tc, best(tc, 1)), min(t_ref, best(ref_fn, 1))
    if kind == "flops": ratio = t_ref / t_tc
    elif kind == "bw":
      moved = sum(r.p.mem_estimate for r, _ in runners)
      ratio = (moved / t_tc) / (2 * nbytes / t_ref)
    else: ratio = t_tc / t_ref
    print(json.dumps({"name": name, "tc_ms": t_tc * 1e3, "ref_ms": t_ref * 1e3, "ratio": ratio, "kind": kind, "target": target, "ok": ok,
                      "target_isa": str(Device["CPU"].compiler.target), "opts": [[f"{o.op.name}{o.axis}:{o.amt}" for o in r.p.applied_opts] for r, _ in runners]}),
          flush=True)

def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--archs", default="native,haswell")
  ap.add_argument("--reps", type=int, default=7)
  ap.add_argument("--quick", action="store_true")
  ap.add_argument("--cpu-time", action="store_true", help="one thread for tilecraft and numpy, timed in CPU time (for a busy machine)")
  ap.add_argument("--only", default="", help="only the rows whose names contain one of these comma-separated words")
  ap.add_argument("--beam", type=float, default=0.0, help="add the BEAM=2 matmul row, searching at most this many seconds per ISA")
  ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.worker: return worker(args.quick, args.reps, args.only, args.beam)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  cols: dict = {}
  for arch in args.archs.split(","):
    env = {**os.environ, "CPU_ARCH": arch, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if not args.cpu_time: env.setdefault("OPENBLAS_THREAD_TIMEOUT", OPENBLAS_THREAD_TIMEOUT)
    if arch != "native": env.update(OPENBLAS_CORETYPE="Haswell", NPY_DISABLE_CPU_FEATURES=AVX512_FEATURES)
    if args.cpu_time: env.update(BENCH_CPU_TIME="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--reps", str(args.reps), "--only", args.only, "--beam", str(args.beam)] + \
      (["--quick"] if args.quick else [])
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0: sys.exit(f"worker for CPU_ARCH={arch} failed:\n{out.stderr[-3000:]}")
    cols[arch] = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
  archs = list(cols)
  print("issue 14 CPU targets; tilecraft hand-coded opts vs numpy, side by side per column (best of interleaved runs" +
        (", one thread each, CPU time)" if args.cpu_time else ", wall time, all cores)"))
  for a in archs: print(f"  {a}: {cols[a][0]['target_isa'] if cols[a] else '?'}")
  print(f"\n{'row':28s} {'target':>8s}  " + "  ".join(f"{a + ' tc/ref ms':>22s} {'ratio':>6s}" for a in archs))
  for i, row in enumerate(cols[archs[0]]):
    cmp = "<=" if row["kind"] == "softmax" else ">="
    cells = []
    for a in archs:
      r = cols[a][i]
      hit = r["ratio"] <= r["target"] if r["kind"] == "softmax" else r["ratio"] >= r["target"]
      cells.append(f"{r['tc_ms']:10.2f} /{r['ref_ms']:9.2f} {r['ratio']:5.2f}x{' ' if hit else '!'}{'' if r['ok'] else ' WRONG'}")
    print(f"{row['name']:28s} {cmp}{row['target']:5.2f}x  " + "  ".join(cells))
  print("\n'!' marks a missed target. bw rows: bandwidth vs a numpy copy of the same bytes; softmax: time / numpy copy of in+out.")
  for a in archs:
    print(f"opts ({a}): " + "; ".join(f"{r['name']}: {' | '.join(' '.join(o) for o in r['opts'])}" for r in cols[a]))

if __name__ == "__main__":
  main()
