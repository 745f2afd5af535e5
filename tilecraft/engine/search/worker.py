"""The search's worker side: the jobs a worker process runs for the beam search (build: render and
compile a candidate; prepare, time, race: run binaries on random data; verify: compare candidates with
the reference kernel). Workers are started and spoken to through tilecraft.engine.isolation."""
from __future__ import annotations
import hashlib, math, os, signal, time
from collections import OrderedDict
from typing import Any, Optional
import numpy as np
from tilecraft.codegen.kernel import Kernel
from tilecraft.engine.isolation import lru_put
from tilecraft.engine.search.actions import opt_unwire

HANDLER = "tilecraft.engine.search.worker:SearchWorker"

# timing repeats: at least `runs`, more for short kernels (until _MIN_TIMING_S of kernel time or
# _MAX_RUNS runs): the minimum of more samples is steadier on a machine other work shares
_MIN_TIMING_S, _MAX_RUNS = 0.05, 30
_TIMING_SEED = 0x5EA4C4

def _random_array(dt: Any, n: int, rng: np.random.Generator) -> np.ndarray:
  """Test data: floats in [-1, 1) (zero mean keeps long sums well conditioned), ints in [1, 8) (safe divisors)."""
  from tilecraft.dtype import dtypes
  if dtypes.is_float(dt): return rng.uniform(-1, 1, n).astype(dt.np if dt.np is not None else np.float32)
  if dtypes.is_bool(dt): return rng.integers(0, 2, n).astype(np.bool_)
  return rng.integers(1, 8, n).astype(dt.np)

def _sentinel_array(dt: Any, n: int) -> np.ndarray:
  """What an output holds before a run, so elements a kernel forgets to write show up."""
  from tilecraft.dtype import dtypes
  if dtypes.is_float(dt): return np.full(n, np.nan, dtype=dt.np if dt.np is not None else np.float32)
  if dtypes.is_bool(dt): return np.zeros(n, dtype=np.bool_)
  return np.full(n, np.iinfo(dt.np).min, dtype=dt.np)

def compare_outputs(out: np.ndarray, ref: np.ndarray, dt: Any) -> tuple[bool, float]:
  """(close enough, max abs error). Exact for ints and bools; floats get rtol plus an atol scaled by
  the reference's median magnitude (reordered float sums differ in the last bits, and near-zero
  results of cancelling sums need an absolute allowance)."""
  from tilecraft.dtype import dtypes
  if out.shape != ref.shape: return False, math.inf
  if not dtypes.is_float(dt):
    eq = np.array_equal(out, ref)
    return eq, 0.0 if eq else float(np.abs(out.astype(np.float64) - ref.astype(np.float64)).max())
  tol = 1e-3 if dt.scalar().itemsize >= 4 else 2e-2
  a, b = out.astype(np.float64), ref.astype(np.float64)
  with np.errstate(invalid="ignore"):
    finite = np.isfinite(b)
    scale = float(np.median(np.abs(b[finite]))) if finite.any() else 0.0
    diff = np.abs(a - b)
    good = (np.isnan(a) & np.isnan(b)) | (a == b) | (diff <= tol * scale + tol * np.abs(b))
    err = float(np.nanmax(np.where(good & ~finite, 0.0, diff))) if diff.size else 0.0
  return bool(good.all()), err

class SearchWorker:
  """The jobs a search worker process runs (see tilecraft.engine.isolation); `blobs` holds the ASTs and
  renderers the parent sent."""
  def __init__(self) -> None:
    self.blobs: OrderedDict[str, Any] = OrderedDict()
    self.bases: OrderedDict[tuple, Kernel] = OrderedDict()
    self.progs: OrderedDict[tuple, Any] = OrderedDict()
    self.tbufs: Optional[tuple[Any, list]] = None

  def program(self, device: str, prog: tuple) -> Any:
    from tilecraft.device import Device
    name, lib = prog[0], prog[1]
    key = (device, name, hashlib.sha256(lib).digest())
    if (p := self.progs.get(key)) is None:
      p = Device[device].runtime(name, lib)
      lru_put(self.progs, key, p, 64)
    return p

  def timing_bufs(self, device: str, specs: list) -> list:
    from tilecraft.device import Buffer
    key = (device, tuple((n, dt) for n, dt in specs))
    if self.tbufs is None or self.tbufs[0] != key:
      self.tbufs = None
      rng = np.random.default_rng(_TIMING_SEED)
      self.tbufs = (key, [Buffer(device, n, dt).allocate().copyin(_random_array(dt, n, rng)) for n, dt in specs])
    return self.tbufs[1]

  # -- jobs --
  def build(self, ast_id: str, ren_id: str, ast_key: str, device: str, opts: list, name: str, var_vals: dict,
            max_uops: int, do_compile: bool) -> tuple:
    from tilecraft.device import Device
    from tilecraft.shape.symbolic import sym_eval
    base = self.bases.get((ast_id, ren_id))
    if base is None:
      ast, ren = self.blobs[ast_id], self.blobs[ren_id]
      if ast.key.hex() != ast_key: raise RuntimeError("the AST changed on its way to the worker (pickling bug)")
      base = Kernel(ast, ren if ren is not None else Device[device].renderer)
      lru_put(self.bases, (ast_id, ren_id), base, 16)
    k = base.copy()
    for o in opts: k.apply_opt(opt_unwire(o))
    t0 = time.perf_counter()
    p = k.to_program(name_override=name)
    t1 = time.perf_counter()
    n_uops = len(p.uops or [])
    if max_uops and n_uops > max_uops: return ("skip", f"{n_uops} uops is over the cap of {max_uops}")
    lib = Device[device].compiler.compile_cached(p.src) if do_compile else None
    vv = {v: var_vals[v.expr] for v in p.vars}
    gs, ls = p.launch_dims(vv)
    ops = p.op_estimate if isinstance(p.op_estimate, int) else sym_eval(p.op_estimate, vv)
    return ("ok", {"src": p.src, "lib": lib, "gs": gs, "ls": ls, "vals": [vv[v] for v in p.vars], "uops": n_uops, "ops": ops,
                   "render_s": t1 - t0, "compile_s": time.perf_counter() - t1})

  def prepare(self, device: str, specs: list) -> tuple:
    self.timing_bufs(device, specs)
    return ("ok", None)

  def run_once(self, device: str, prog: tuple, bufs: list) -> float:
    name, lib, gs, ls, vals = prog
    t = self.program(device, prog)(*[b._buf for b in bufs], global_size=gs, local_size=ls, vals=tuple(vals), wait=True)
    return float(t)

  def time(self, device: str, prog: tuple, specs: list, runs: int, early_stop_s: Optional[float], directive: Optional[str],
           hang_s: float, ref: Optional[tuple] = None) -> tuple:
    """Run times of prog; with a reference program, each run of prog follows one of ref and the reply
    carries ref's times too, so the caller can judge prog relative to ref measured in the same moment."""
    if directive == "segfault":
      os.kill(os.getpid(), signal.SIGSEGV)
      time.sleep(60)
    if directive == "hang": time.sleep(hang_s)
    if directive == "error": raise RuntimeError("injected failure (search.beam._test_hook)")
    bufs = self.timing_bufs(device, specs)
    times: list[float] = []
    ref_times: list[float] = []
    while True:
      if ref is not None: ref_times.append(self.run_once(device, ref, bufs))
      times.append(self.run_once(device, prog, bufs))
      if early_stop_s is not None and times[-1] > early_stop_s: break
      if len(times) >= max(1, runs) and (sum(times) >= _MIN_TIMING_S or len(times) >= _MAX_RUNS): break
    return ("ok", (times, ref_times))

  def race(self, device: str, progs: list, specs: list, runs: int) -> tuple:
    """Interleaved runs of several programs (so drift in machine load hits all alike); min of each."""
    bufs = self.timing_bufs(device, specs)
    best, total, n = [math.inf] * len(progs), 0.0, 0
    while n < max(1, runs) or (total < 2 * _MIN_TIMING_S * len(progs) and n < 2 * _MAX_RUNS):
      for i, p in enumerate(progs):
        t = self.run_once(device, p, bufs)
        best[i], total = min(best[i], t), total + t
      n += 1
    return ("ok", best)

  def verify(self, device: str, ref: tuple, cands: list, specs: list, n_out: int, outs_read: bool, seed: int, guard: int) -> tuple:
    """Run the reference and each candidate on the same random inputs; per candidate (ok, max error, note).
    Outputs start as sentinels (NaN) unless the kernel reads them and have a guard zone after them;
    inputs must come back unchanged."""
    from tilecraft.device import Buffer
    rng = np.random.default_rng(seed)
    init = [_random_array(dt, n, rng) for n, dt in specs]
    out_init = [np.concatenate([init[i] if outs_read else _sentinel_array(dt, n), _random_array(dt, guard, rng)])
                for i, (n, dt) in enumerate(specs[:n_out])]
    bufs = [Buffer(device, n + (guard if i < n_out else 0), dt).allocate() for i, (n, dt) in enumerate(specs)]
    for i in range(n_out, len(bufs)): bufs[i].copyin(init[i])
    for i in range(n_out): bufs[i].copyin(out_init[i])
    # what the untouched bytes read back as (dtype-agnostic: bfloat16 reads back as float32)
    guards = [bufs[i].numpy()[specs[i][0]:] for i in range(n_out)]
    inputs = [bufs[i].numpy() for i in range(n_out, len(bufs))]
    def run(prog: tuple) -> tuple[list[np.ndarray], str]:
      for i in range(n_out): bufs[i].copyin(out_init[i])
      self.run_once(device, prog, bufs)
      outs, note = [], ""
      for i in range(n_out):
        full = bufs[i].numpy()
        if not np.array_equal(full[specs[i][0]:], guards[i], equal_nan=True): note += f"wrote past the end of output {i}; "
        outs.append(full[:specs[i][0]])
      for j, i in enumerate(range(n_out, len(bufs))):
        if not np.array_equal(bufs[i].numpy(), inputs[j], equal_nan=True):
          note += f"changed input {i}; "
          bufs[i].copyin(init[i])
      return outs, note
    ref_outs, ref_note = run(ref)
    if ref_note: return ("error", f"the reference kernel itself misbehaves: {ref_note}")
    res = []
    for c in cands:
      try: outs, note = run(c)
      except Exception as e:  # noqa: BLE001
        res.append((False, math.inf, f"{type(e).__name__}: {e}")); continue  # noqa: E702
      ok, err = True, 0.0
      for i, (o, r) in enumerate(zip(outs, ref_outs)):
        o_ok, o_err = compare_outputs(o, r, specs[i][1])
        ok, err = ok and o_ok, max(err, o_err)
      res.append((ok and not note, err, note.strip()))
    return ("ok", res)
