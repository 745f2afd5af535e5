"""The search's worker side: the jobs a worker process runs for the beam search (build: render and
compile a candidate; prepare, time, race: run binaries on random data; verify: compare candidates with
the reference kernel). Workers are started and spoken to through tilecraft.engine.isolation."""
from __future__ import annotations
import hashlib, math, os, signal, time
from collections import OrderedDict
from typing import Any, Optional
import numpy as np
from tilecraft.codegen.kernel import Kernel
from tilecraft.dtype import dtypes
from tilecraft.engine.isolation import lru_put
from tilecraft.engine.verify import SENTINELS, buffer_array, compare, filled, max_abs_error, poison, random_array, raw_bytes, shift_ast, tolerance
from tilecraft.engine.search.actions import opt_unwire

HANDLER = "tilecraft.engine.search.worker:SearchWorker"

# timing repeats: at least `runs`, more for short kernels (until _MIN_TIMING_S of kernel time or
# _MAX_RUNS runs): the minimum of more samples is steadier on a machine other work shares
_MIN_TIMING_S, _MAX_RUNS = 0.05, 30
_TIMING_SEED = 0x5EA4C4

def _verify_tol(dt: Any) -> float:
  """rtol and atol (atol scaled by the reference's magnitude, see _magnitude) for a candidate against
  the reference: candidates reorder reductions of thousands of terms, so at least 1e-3, and twice the
  dtype's own."""
  return max(1e-3, 2 * tolerance(dt)[0])

def _magnitude(ref: np.ndarray, dt: Any) -> float:
  """The typical size of a float output's values, which scales the absolute tolerance: the 90th
  percentile of its finite nonzero magnitudes (0 only when every finite value is 0). Not the median:
  half of a relu's outputs are exactly 0, and a reordered sum that lands at 1e-7 instead of 0 there is
  as right as one off by 1e-7 anywhere else."""
  if not dtypes.is_float(dt): return 0.0
  mags = np.abs(ref[np.isfinite(ref)].astype(np.float64))
  mags = mags[mags > 0]
  return float(np.percentile(mags, 90)) if mags.size else 0.0

def check_output(got: np.ndarray, ref: np.ndarray, dt: Any) -> Optional[str]:
  """None if a candidate's output matches the reference kernel's closely enough, else what differs."""
  tol = _verify_tol(dt)
  return compare(got, ref, dt, tol, tol, _magnitude(ref, dt))

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
      self.tbufs = (key, [Buffer(device, n, dt).allocate().copyin(random_array(dt, n, rng)) for n, dt in specs])
    return self.tbufs[1]

  # -- jobs --
  def build(self, ast_id: str, ren_id: str, ast_key: str, device: str, opts: list, name: str, var_vals: dict,
            max_uops: int, do_compile: bool, front: int = 0) -> tuple:
    """Render and compile the kernel with `opts`; `front` > 0 builds it with every buffer access moved
    that many elements in (for verify's front guard zones)."""
    from tilecraft.device import Device
    from tilecraft.shape.symbolic import sym_eval
    base = self.bases.get((ast_id, ren_id, front))
    if base is None:
      ast, ren = self.blobs[ast_id], self.blobs[ren_id]
      if ast.key.hex() != ast_key: raise RuntimeError("the AST changed on its way to the worker (pickling bug)")
      base = Kernel(shift_ast(ast, front), ren if ren is not None else Device[device].renderer)
      lru_put(self.bases, (ast_id, ren_id, front), base, 16)
    k = base.copy()
    for o in opts: k.apply_opt(opt_unwire(o))
    t0 = time.perf_counter()
    p = k.to_program(name_override=name)
    t1 = time.perf_counter()
    n_uops = len(p.uops or [])
    if max_uops and n_uops > max_uops: return ("skip", f"{n_uops} uops is over the cap of {max_uops}")
    lib = None
    if do_compile:  # loaded here: a cached binary that doesn't load is a miss (rebuilt), not a failed candidate
      lib, prg = Device[device].compiler.compile_and_load(p.src, lambda b: Device[device].runtime(p.name, b))
      lru_put(self.progs, (device, p.name, hashlib.sha256(lib).digest()), prg, 64)
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

  def verify(self, device: str, ref: tuple, cands: list, specs: list, n_out: int, outs_read: bool, seed: int, guard: int,
             front: int = 0) -> tuple:
    """Run the reference and each candidate on the same random inputs; per candidate (ok, max error, note).
    Every buffer is [front guard | data | back guard] (programs built with their accesses `front`
    elements in, see engine/verify.py). Each program runs once per sentinel fill of the outputs (their
    data too, unless the kernel reads its outputs), so an element a candidate skips differs from the
    reference in one of the runs whatever its right value; guards must keep their contents and
    inputs must come back unchanged."""
    from tilecraft.device import Buffer
    rng = np.random.default_rng(seed)
    init = [buffer_array(dt, random_array(dt, n, rng)) for n, dt in specs]
    bufs = [Buffer(device, front + n + guard, dt).allocate() for n, dt in specs]
    def with_poison(i: int) -> np.ndarray:
      pz = poison(specs[i][1], max(front, guard))
      return np.concatenate([pz[:front], init[i], pz[:guard]])
    inputs = []
    for i in range(n_out, len(bufs)):
      bufs[i].copyin(with_poison(i))
      inputs.append(raw_bytes(bufs[i].numpy(), specs[i][1]))
    def run(prog: tuple, fill: int) -> tuple[list[np.ndarray], str]:
      for i in range(n_out):
        n, dt = specs[i]
        full = filled(dt, front + n + guard, fill)
        if outs_read: full[front:front + n] = init[i]
        bufs[i].copyin(full)
      self.run_once(device, prog, bufs)
      outs, note = [], ""
      for i in range(n_out):
        n, dt = specs[i]
        data = bufs[i].numpy()
        raw = raw_bytes(data, dt)
        if not (raw[:front] == fill).all(): note += f"wrote before the start of output {i}; "
        if not (raw[front + n:] == fill).all(): note += f"wrote past the end of output {i}; "
        outs.append(data[front:front + n])
      for j, i in enumerate(range(n_out, len(bufs))):
        if not np.array_equal(raw_bytes(bufs[i].numpy(), specs[i][1]), inputs[j]):
          note += f"changed input {i}; "
          bufs[i].copyin(with_poison(i))
      return outs, note
    ref_runs = [run(ref, fill) for fill in SENTINELS]
    if (ref_note := "".join(n for _, n in ref_runs)): return ("error", f"the reference kernel itself misbehaves: {ref_note}")
    res = []
    for c in cands:
      ok, err, note = True, 0.0, ""
      try:
        for fill, (ref_outs, _) in zip(SENTINELS, ref_runs):
          outs, run_note = run(c, fill)
          if run_note and run_note not in note: note += run_note
          for i, (o, r) in enumerate(zip(outs, ref_outs)):
            if (msg := check_output(o, r, specs[i][1])) is not None:
              ok, err = False, max(err, max_abs_error(o, r))
              if f"output {i}:" not in note: note += f"output {i}: {msg}; "
      except Exception as e:  # noqa: BLE001
        ok, err, note = False, math.inf, f"{type(e).__name__}: {e}"
      res.append((ok and not note, err, note.strip().rstrip(";")))
    return ("ok", res)
