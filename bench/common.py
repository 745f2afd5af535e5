"""Shared pieces of the benchmarks: AST builders for the kernels they time, and a timer."""
from __future__ import annotations
import json, os, subprocess, sys, tempfile, time
from typing import Any, Callable, Optional
import numpy as np
from tilecraft.dtype import dtypes
from tilecraft.ops import BinaryOps, BufferOps, LazyOp, MemBuffer, MetaOps, ReduceOps
from tilecraft.shape.shapetracker import ShapeTracker
from tilecraft.shape.view import View

def load(i: int, st: ShapeTracker) -> LazyOp: return LazyOp(BufferOps.LOAD, (), MemBuffer(i, dtypes.float32, st))
def kernel(value: LazyOp, out_shape: tuple) -> LazyOp:
  return LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (value,), MemBuffer(0, dtypes.float32, ShapeTracker.from_shape(out_shape))),))

def matmul_ast(M: int, N: int, K: int) -> LazyOp:
  a = ShapeTracker.from_shape((M, K)).reshape((M, 1, K)).expand((M, N, K))
  b = ShapeTracker.from_shape((K, N)).permute((1, 0)).reshape((1, N, K)).expand((M, N, K))
  return kernel(LazyOp(ReduceOps.SUM, (LazyOp(BinaryOps.MUL, (load(1, a), load(2, b))),), (2,)), (M, N, 1))

def conv3x3_ast(cin: int, cout: int, H: int, W: int) -> LazyOp:
  """out[co, y, x] = sum over ci, ky, kx of img[ci, y+ky-1, x+kx-1] * w[co, ci, ky, kx] (zero padded)."""
  padded = ShapeTracker.from_shape((cin, H, W)).pad(((0, 0), (1, 1), (1, 1)))
  window = View.create((cout, H, W, cin, 3, 3), (0, W + 2, 1, (H + 2) * (W + 2), W + 2, 1))
  img = ShapeTracker(padded.views + (window,)).simplify()
  w = ShapeTracker.from_shape((cout, cin, 3, 3)).reshape((cout, 1, 1, cin, 3, 3)).expand((cout, H, W, cin, 3, 3))
  return kernel(LazyOp(ReduceOps.SUM, (LazyOp(BinaryOps.MUL, (load(1, img), load(2, w))),), (3, 4, 5)), (cout, H, W, 1, 1, 1))

def elementwise_ast(n: int) -> LazyOp:
  st = ShapeTracker.from_shape((n,))
  x = LazyOp(BinaryOps.ADD, (LazyOp(BinaryOps.MUL, (load(1, st), load(2, st))), load(3, st)))
  return kernel(LazyOp(BinaryOps.MAX, (x, LazyOp(BufferOps.CONST, (), __import__("tilecraft.ops", fromlist=["ConstBuffer"]).ConstBuffer(0.0, dtypes.float32, st)))), (n,))

def best_of(fn: Callable[[], float], n: int = 5) -> float:
  """Minimum over n runs of fn() (which returns seconds, or None to be timed here)."""
  best = float("inf")
  for _ in range(n):
    t0 = time.perf_counter()
    r = fn()
    best = min(best, r if isinstance(r, float) else time.perf_counter() - t0)
  return best

def numpy_conv3x3(img: np.ndarray, w: np.ndarray) -> np.ndarray:
  cin, H, W = img.shape
  p = np.pad(img, ((0, 0), (1, 1), (1, 1)))
  cols = np.stack([p[:, ky:ky + H, kx:kx + W] for ky in range(3) for kx in range(3)], axis=1)  # cin, 9, H, W
  return np.einsum("ckhw,ock->ohw", cols.reshape(cin, 9, H, W), w.reshape(w.shape[0], cin, 9))

class PeerWorker:
  """A peer's benchmark worker (`script --worker`, run by the peer's own python) over a pipe: one JSON
  request per line in, one JSON answer per line out; its first line is a hello. The environment
  drops tilecraft's settings and PYTHONPATH (the peer imports only what its venv has); `env` adds to it."""
  def __init__(self, py: str, script: str, name: str, args: tuple[str, ...] = (), env: Optional[dict[str, str]] = None):
    full = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DEBUG", "BEAM", "NOOPT", "DEVICE")}
    full.update(env or {})
    self.name = name
    self.p = subprocess.Popen([py, os.path.abspath(script), "--worker", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=full, cwd=tempfile.gettempdir())
    self.hello = self._read()
  def _read(self) -> dict:
    line = self.p.stdout.readline()  # type: ignore[union-attr]
    if not line: sys.exit(f"the {self.name} worker died (exit code {self.p.wait()}); its stderr is above")
    return json.loads(line)
  def ask(self, **req: Any) -> dict:
    self.p.stdin.write(json.dumps(req) + "\n")  # type: ignore[union-attr]
    self.p.stdin.flush()  # type: ignore[union-attr]
    return self._read()
  def close(self) -> None:
    self.p.stdin.close()  # type: ignore[union-attr]
    self.p.wait(timeout=30)

def ensure_peer_venv(venv: str, reqs: list[str], check: str) -> str:
  """The python of the peer's venv, where `python -c check` succeeds; the venv is created with `reqs`
  installed on first use (peers are never tilecraft's dependencies: each lives in its own venv)."""
  py = os.path.join(venv, "bin", "python")
  if os.path.exists(py) and subprocess.run([py, "-c", check], capture_output=True).returncode == 0: return py
  print(f"creating {venv} with {' '.join(reqs)} (for this benchmark only) ...", file=sys.stderr)
  subprocess.run([sys.executable, "-m", "venv", venv], check=True)
  r = subprocess.run([py, "-m", "pip", "install", "-q", *reqs], capture_output=True, text=True)
  if r.returncode != 0: sys.exit(f"could not install {' '.join(reqs)} into {venv}:\n{r.stderr.strip()}")
  return py
