"""End to end against a peer: the same user code through tinygrad 0.9.2 (CLANG backend, one thread,
its hand-coded opts) and tilecraft (hand-coded opts), `f(*inputs).realize()` on realized inputs in a
loop that drops its results, in one run.

tinygrad runs in its own virtual environment (never a tilecraft dependency), created on first use:
  python3 -m venv VENV && VENV/bin/pip install tinygrad==0.9.2 numpy
(VENV: --venv, default $TG_VENV or /tmp/tilecraft-peer-tinygrad). Its CLANG backend runs `clang`
from PATH; where there is none, a directory with `clang` -> clang-15 (or the newest clang-N found)
is put first on the worker's PATH. The tinygrad side is a worker process of that venv's python,
driven over a pipe, so the two are timed interleaved: each round times every workload on both
(alternating which goes first), best of --reps calls per round, best over --rounds rounds. Each
side's output is checked against numpy in float64.

Run: python bench/bench_peer_tinygrad.py [--rounds 7] [--reps 3] [--quick] [-k NAME]
"""
from __future__ import annotations
import argparse, glob, json, math, os, shutil, subprocess, sys, tempfile, time, zlib
from typing import Any, Callable

TINYGRAD = "tinygrad==0.9.2"

# ---- the workloads (shared by both sides: only numpy and the Tensor API both frontends have) -----

def _conv_ref(x: Any, w: Any) -> Any:
  import numpy as np
  n, cin, h, wd = x.shape
  p = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
  win = np.lib.stride_tricks.sliding_window_view(p, (3, 3), axis=(2, 3))
  return np.einsum("nchwij,ocij->nohw", win, w)

def _softmax_ref(x: Any) -> Any:
  import numpy as np
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)

def workloads(quick: bool) -> dict[str, tuple[Callable, Callable, Callable]]:
  """name -> (inputs(rng), f(*tensors), numpy reference(*float64 arrays))."""
  import numpy as np
  def normal(*shape: int) -> Callable: return lambda r: r.standard_normal(shape, dtype=np.float32)
  m, c, hw, rows, n = (128, 8, 16, 256, 1 << 16) if quick else (512, 64, 56, 4096, 1 << 24)
  return {
    f"matmul {m}": (lambda r: [normal(m, m)(r), normal(m, m)(r)], lambda a, b: a @ b, lambda a, b: a @ b),
    f"conv 3x3 {c}->{c} {hw}^2": (lambda r: [normal(1, c, hw, hw)(r), normal(c, c, 3, 3)(r) * np.float32(0.1)],
                                   lambda x, w: x.conv2d(w, padding=1), _conv_ref),
    f"softmax {rows}x1024": (lambda r: [normal(rows, 1024)(r)], lambda x: x.softmax(-1), _softmax_ref),
    f"sum rows {rows}x1024": (lambda r: [normal(rows, 1024)(r)], lambda x: x.sum(axis=1), lambda x: x.sum(axis=1)),
    f"sum {n >> 20}M" if n >= 1 << 20 else f"sum {n >> 10}K": (lambda r: [r.random(n, dtype=np.float32)], lambda x: x.sum(), lambda x: np.asarray(x.sum())),
    f"(a*b+c).relu() {n >> 20}M" if n >= 1 << 20 else f"(a*b+c).relu() {n >> 10}K":
      (lambda r: [normal(n)(r), normal(n)(r), normal(n)(r)], lambda a, b, c: (a * b + c).relu(), lambda a, b, c: np.maximum(a * b + c, 0)),
  }

class Side:
  """One framework's view of the workloads: realized inputs, the timed call, the check."""
  def __init__(self, tensor_cls: Any, quick: bool):
    import numpy as np
    self.np, self.Tensor, self.ws, self.state = np, tensor_cls, workloads(quick), {}
  def setup(self, name: str) -> float:
    """Realize the inputs, run once (compiling), return max |out - ref| / max |ref|."""
    np = self.np
    make, fn, ref_fn = self.ws[name]
    arrays = make(np.random.default_rng(zlib.crc32(name.encode())))
    ts = [self.Tensor(a).realize() for a in arrays]
    self.state[name] = (fn, ts)
    out = fn(*ts).numpy()
    ref = np.asarray(ref_fn(*[a.astype(np.float64) for a in arrays]))
    if out.shape != ref.shape: raise AssertionError(f"{name}: output shape {out.shape} != numpy's {ref.shape}")
    scale = float(np.abs(ref).max()) or 1.0
    return float(np.abs(out.astype(np.float64) - ref).max()) / scale
  def time(self, name: str, reps: int) -> float:
    fn, ts = self.state[name]
    best = float("inf")
    for _ in range(reps):
      t0 = time.perf_counter()
      fn(*ts).realize()  # the result is dropped, as in a user's loop
      best = min(best, time.perf_counter() - t0)
    return best

def worker(quick: bool) -> None:
  """The tinygrad side: JSON requests on stdin, one JSON answer per line on stdout."""
  import importlib.metadata
  from tinygrad import Device, Tensor
  side = Side(Tensor, quick)
  out = sys.stdout
  sys.stdout = sys.stderr  # nothing but answers on the pipe
  print(json.dumps({"ready": True, "device": Device.DEFAULT, "version": importlib.metadata.version("tinygrad")}), file=out, flush=True)
  for line in sys.stdin:
    req = json.loads(line)
    try: ans = {"err": side.setup(req["setup"])} if "setup" in req else {"t": side.time(req["time"], req["reps"])}
    except Exception as e:  # noqa: BLE001 - reported to the driver, which marks the workload failed
      ans = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(ans), file=out, flush=True)

# ---- the driver ----------------------------------------------------------------------------------

def ensure_venv(venv: str) -> str:
  """The venv's python, with tinygrad 0.9.2 installed (created on first use)."""
  from common import ensure_peer_venv
  return ensure_peer_venv(venv, [TINYGRAD, "numpy"], "import tinygrad, numpy, importlib.metadata as m; assert m.version('tinygrad') == '0.9.2'")

def clang_path_dir() -> str | None:
  """None when `clang` is on PATH, else a temp dir holding a `clang` link to the newest clang-N."""
  if shutil.which("clang"): return None
  found = sorted((p for d in os.environ.get("PATH", "").split(os.pathsep) for p in glob.glob(os.path.join(d, "clang-[0-9]*"))
                  if os.path.basename(p)[6:].isdigit()), key=lambda p: int(os.path.basename(p)[6:]))
  if not found: sys.exit("tinygrad's CLANG backend needs clang: install clang (e.g. apt-get install clang-15)")
  d = tempfile.mkdtemp(prefix="tilecraft-peer-clang-")
  os.symlink(found[-1], os.path.join(d, "clang"))
  return d

def Peer(py: str, quick: bool, path_dir: str | None) -> "PeerWorker":
  """The tinygrad worker, over a pipe (its CLANG backend, with `path_dir`'s clang first on PATH)."""
  from common import PeerWorker  # (here: the worker side runs in the peer's venv, without tilecraft)
  env = {"CLANG": "1"}
  if path_dir: env["PATH"] = path_dir + os.pathsep + os.environ.get("PATH", "")
  return PeerWorker(py, __file__, "tinygrad", ("--quick",) if quick else (), env)

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--rounds", type=int, default=7)
  ap.add_argument("--reps", type=int, default=3, help="calls per side per round (best counts)")
  ap.add_argument("--quick", action="store_true", help="small sizes (seconds)")
  ap.add_argument("-k", dest="only", action="append", help="only workloads whose name contains this")
  ap.add_argument("--venv", default=os.environ.get("TG_VENV", "/tmp/tilecraft-peer-tinygrad"))
  ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.worker: return worker(args.quick)
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from tilecraft import Tensor
  from tilecraft.cli.calibrate import cpu_model, load_average
  names = [n for n in workloads(args.quick) if not args.only or any(s in n for s in args.only)]
  if not names: sys.exit(f"no workload matches {args.only}")
  path_dir = clang_path_dir()
  try: run(args, names, Peer(ensure_venv(args.venv), args.quick, path_dir), Tensor, cpu_model, load_average)
  finally:
    if path_dir: shutil.rmtree(path_dir, ignore_errors=True)

def run(args: argparse.Namespace, names: list[str], peer: Peer, Tensor: Any, cpu_model: Callable, load_average: Callable) -> None:
  tc, errs, ok = Side(Tensor, args.quick), {}, {}
  for n in names:
    ans = peer.ask(setup=n)
    errs[n] = (ans.get("err"), tc.setup(n))
    ok[n] = "error" not in ans and max(errs[n]) <= 1e-3
    if "error" in ans: print(f"tinygrad failed on {n}: {ans['error']}", file=sys.stderr)
  best = {n: [float("inf"), float("inf")] for n in names if ok[n]}  # [tilecraft, tinygrad]
  load0 = load_average()
  for r in range(args.rounds):
    for n in best:
      for side in ((0, 1) if r % 2 == 0 else (1, 0)):
        t = tc.time(n, args.reps) if side == 0 else peer.ask(time=n, reps=args.reps).get("t", float("inf"))
        best[n][side] = min(best[n][side], t)
  peer.close()
  print(f"tilecraft vs tinygrad {peer.hello['version']} ({peer.hello['device']}, one thread) on {cpu_model()}, {os.cpu_count()} cores; "
        f"load {load0:.1f} at the start")
  print(f"end to end: f(*inputs).realize() on realized inputs, result dropped; hand-coded opts on both; interleaved, "
        f"best of {args.reps} calls x {args.rounds} rounds per side")
  print(f"{'workload':28s} {'tilecraft':>11s} {'tinygrad':>11s} {'speedup':>8s}  check (max rel err tc / tg)")
  ratios = []
  for n in names:
    e_tg, e_tc = errs[n]
    if n not in best:
      print(f"{n:28s} {'-':>11s} {'-':>11s} {'-':>8s}  FAIL ({e_tc:.1e} / {e_tg})")
      continue
    t_tc, t_tg = best[n]
    ratios.append(t_tg / t_tc)
    print(f"{n:28s} {t_tc*1e3:8.2f} ms {t_tg*1e3:8.2f} ms {t_tg/t_tc:7.2f}x  ok ({e_tc:.1e} / {e_tg:.1e})")
  if ratios:
    print(f"geomean speedup of tilecraft over {len(ratios)} workloads: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x "
          f"(min {min(ratios):.2f}x)")
  if not all(ok.values()): sys.exit(1)

if __name__ == "__main__":
  main()
