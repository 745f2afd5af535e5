"""Beam search over Opts (DESIGN §9).

  beam_search(kernel, bufs, amt, allow_test_size=True, ...) -> Kernel   (API)
  get_kernel_actions(kernel, include_0=True) -> dict[int, Kernel]
  optimize_kernel(kernel, bufs_or_None) -> Kernel   (what the scheduler calls: BEAM / hand-coded / NOOPT)

Each round extends the `amt` fastest kernels not extended yet (the beam) by every action of a
fixed grid (`ACTIONS`), and the search stops after `patience` rounds without a new best. The unoptimized
kernel, the hand-coded one and the hand-coded kernel's intermediate steps seed the beam; the
hand-coded kernel is the floor (a winner must also beat it head to head, and match the
unoptimized kernel's output on random data).

Process model. All rendering, compiling and running of candidates happens in worker processes
started with `python -c "from tilecraft.engine.search import _worker_main; ..."` and spoken to
over pipes (length-prefixed pickles):
- A worker never imports the user's `__main__` (multiprocessing's spawn and forkserver both
  re-run it), so a script without an `if __name__ == "__main__"` guard works.
- Rendering runs in the workers too: lowering a big candidate takes up to ~0.5 s of pure
  Python, so it parallelizes like compilation, and a lowering bug that loops forever only costs
  a timeout. ASTs travel as plain pickles (LazyOp and Node rebuild their per-process cached
  hashes when unpickled).
- Builds (render + compile) run on all workers at once. Timing runs on one worker at a time
  while the others are idle (a CPU kernel uses every core through OpenMP), each with a
  timeout: a worker that segfaults or hangs is killed, the candidate is recorded as failed,
  a fresh worker replaces it and the search goes on.
- Each candidate's runs alternate with runs of the hand-coded kernel in the same job, and its
  time is scaled by the hand-coded kernel's (its own timing / its timing in that job). On a
  shared machine a multi-threaded kernel's time swings by tens of percent over seconds; both
  kernels of a job see the same swing, so the ranking doesn't depend on when a candidate ran.
The workers live for the whole process (started on first use, stopped at exit), so a second
search pays no start-up. They die with the parent (PR_SET_PDEATHSIG) or when their stdin closes.

Results persist in sqlite (`CACHEDB`, default cache_dir()/search.db; CACHELEVEL=0 disables):
one row per search (AST key, device, renderer, compiler, settings) whose opts are replayed on a
hit, and one row per timed candidate so a repeat search (say, with a wider beam) starts warm.
"""
from __future__ import annotations
import ctypes, hashlib, json, math, os, pickle, select, signal, sqlite3, subprocess, sys, threading
import time, traceback, warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence
import numpy as np
from tilecraft.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tilecraft.helpers import DEBUG, NOOPT, cache_dir, getenv, prod
from tilecraft.ops import BufferOps, MemBuffer
from tilecraft.shape.symbolic import Variable

SEARCH_VERSION = 2  # bump when the action grid, the search's choices or how it times change: old cache rows and timings stop matching

# Failure injection for tests: called with a candidate's opts (tuple of Opt) before it is timed;
# "segfault" makes the timing worker kill itself with SIGSEGV, "hang" makes it sleep past the
# timeout, "error" makes it raise. The parent consults it and ships the verdict with the job,
# because the worker is a fresh interpreter that can't see this process's module state.
_test_hook: Optional[Callable[[tuple], Optional[str]]] = None

# ---- the action grid -----------------------------------------------------------------------------

def _make_actions() -> list[Opt]:
  acts: list[Opt] = []
  acts += [Opt(OptOps.UPCAST, ax, amt) for ax in range(6) for amt in (0, 2, 3, 4, 5, 7, 8, 16)]
  acts += [Opt(OptOps.UNROLL, ax, amt) for ax in range(5) for amt in (0, 2, 3, 4, 7, 8, 16, 32)]
  acts += [Opt(OptOps.LOCAL, ax, amt) for ax in range(6) for amt in (2, 3, 4, 8, 16, 32)]
  acts += [Opt(OptOps.GROUP, ax, amt) for ax in range(3) for amt in (0, 4, 8, 16, 32)]
  acts += [Opt(OptOps.GROUPTOP, ax, amt) for ax in range(3) for amt in (8, 16, 32, 64, 128, 256)]
  acts += [Opt(OptOps.PADTO, ax, amt) for ax in range(7) for amt in (16, 32)]
  acts += [Opt(OptOps.SWAP, ax, other) for ax in range(5) for other in range(ax + 1, 6)]
  acts += [Opt(OptOps.NOLOCALS)]
  acts += [Opt(OptOps.TC, ax, tc_opt) for ax in range(3) for tc_opt in (0, 1, 2)]  # only offered where the renderer has tensor cores
  return acts

ACTIONS: list[Opt] = _make_actions()
_LOCAL_OPS = (OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.NOLOCALS)

def _signature(k: Kernel) -> tuple:
  """Everything code generation depends on: two kernels with equal signatures render the same source."""
  return (tuple(k.sts), k.local_dims, k.upcasted, k.group_for_reduces, k.dont_use_locals, k.tensor_core is not None)

def _int_prod(xs: Sequence[Any]) -> Optional[int]:
  p = prod(xs)
  return p if isinstance(p, int) else None

def kernel_caps_ok(k: Kernel, max_upcast: int = 256, max_lanes: int = 1024, max_threads: Optional[int] = None) -> bool:
  """Register and thread caps: at most `max_upcast` output lanes (accumulators), `max_lanes` lanes with
  the unrolled reduce axes, and `max_threads` threads per workgroup (default: the renderer's limit, <= 1024)."""
  up = k.full_shape[k.first_upcast:]
  yellow = _int_prod([s for s, o in zip(up, k.output_shape[k.first_upcast:]) if s == o])
  lanes = _int_prod(up)
  if yellow is not None and yellow > max_upcast: return False
  if lanes is not None and lanes > max_lanes: return False
  if k.opts.has_local:
    if max_threads is None:
      lm = k.opts.local_max
      max_threads = min(1024, prod(lm)) if lm else 1024
    threads = _int_prod(k.full_shape[k.global_dims:k.first_reduce + k.group_for_reduces])
    if threads is not None and threads > max_threads: return False
  return True

def get_kernel_actions(kernel: Kernel, include_0: bool = True, max_upcast: int = 256, max_lanes: int = 1024,
                       max_threads: Optional[int] = None) -> dict[int, Kernel]:
  """Every kernel one action away: {i + 1: kernel with ACTIONS[i] applied}, plus {0: kernel} when
  include_0. Each is `copy()` + `apply_opt`; refusals, kernels over the caps (see kernel_caps_ok)
  and actions that change nothing or repeat another action's result are left out."""
  out: dict[int, Kernel] = {0: kernel} if include_0 else {}
  seen = {_signature(kernel)}
  ren = kernel.opts
  for i, act in enumerate(ACTIONS):
    if act.op is OptOps.TC and (not getattr(ren, "tensor_cores", None) or kernel.applied_opts): continue
    if act.op in _LOCAL_OPS and not ren.has_local: continue
    if act.axis is not None and act.op is not OptOps.SWAP and act.real_axis(kernel) >= kernel.shape_len: continue
    k = kernel.copy()
    try: k.apply_opt(act, reason="beam search")
    except KernelOptError: continue
    except Exception as e:  # noqa: BLE001 - a bug in an opt: say so, and search on without it
      warnings.warn(f"search: {act} on {kernel.name} {kernel.applied_opts} raised {type(e).__name__}: {e} (a bug: opts may only "
                    "raise KernelOptError)", RuntimeWarning, stacklevel=2)
      continue
    if not kernel_caps_ok(k, max_upcast, max_lanes, max_threads): continue
    if (sig := _signature(k)) in seen: continue
    seen.add(sig)
    out[i + 1] = k
  return out

def _opt_wire(o: Opt) -> tuple: return (o.op.name, o.axis, o.amt)
def _opt_unwire(t: Sequence) -> Opt: return Opt(OptOps[t[0]], t[1], t[2])
def _opts_key(opts: Sequence[Opt]) -> str: return json.dumps([_opt_wire(o) for o in opts])
def _opts_from_key(s: str) -> list[Opt]: return [_opt_unwire(t) for t in json.loads(s)]

def _frame(obj_bytes: bytes) -> bytes: return len(obj_bytes).to_bytes(8, "little") + obj_bytes

def _write_all(fd: int, data: bytes) -> None:
  view = memoryview(data)
  while view:
    n = os.write(fd, view)
    view = view[n:]

def _read_exact(fd: int, n: int) -> bytes:
  chunks, got = [], 0
  while got < n:
    c = os.read(fd, n - got)
    if not c: raise EOFError("pipe closed")
    chunks.append(c); got += len(c)  # noqa: E702
  return b"".join(chunks)

# ---- the worker process --------------------------------------------------------------------------

# timing repeats: at least `runs`, more for short kernels (until _MIN_TIMING_S of kernel time or
# _MAX_RUNS runs): the minimum of more samples is steadier on a machine other work shares
_MIN_TIMING_S, _MAX_RUNS = 0.05, 30
_WORKER_CMD = "from tilecraft.engine.search import _worker_main; _worker_main()"
_TIMING_SEED = 0x5EA4C4

def _set_pdeathsig() -> None:
  """Die with the parent (Linux), so a worker stuck in a hung kernel never outlives the search."""
  try: ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  except Exception: pass  # noqa: BLE001 - not Linux: EOF on stdin still ends an idle worker

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

class _WorkerState:
  def __init__(self) -> None:
    self.blobs: OrderedDict[str, Any] = OrderedDict()
    self.bases: OrderedDict[tuple, Kernel] = OrderedDict()
    self.progs: OrderedDict[tuple, Any] = OrderedDict()
    self.tbufs: Optional[tuple[Any, list]] = None

  @staticmethod
  def _lru_put(d: OrderedDict, key: Any, val: Any, cap: int) -> None:
    d[key] = val
    d.move_to_end(key)
    while len(d) > cap: d.popitem(last=False)

  def program(self, device: str, prog: tuple) -> Any:
    from tilecraft.device import Device
    name, lib = prog[0], prog[1]
    key = (device, name, hashlib.sha256(lib).digest())
    if (p := self.progs.get(key)) is None:
      p = Device[device].runtime(name, lib)
      self._lru_put(self.progs, key, p, 64)
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
      self._lru_put(self.bases, (ast_id, ren_id), base, 16)
    k = base.copy()
    for o in opts: k.apply_opt(_opt_unwire(o))
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
    if directive == "error": raise RuntimeError("injected failure (search._test_hook)")
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

def _worker_main() -> None:
  """Serve jobs from the parent until stdin closes. Replies go to a private copy of fd 1; fd 1 itself
  is pointed at stderr so prints from Python, compilers or kernels can't corrupt the pipe."""
  out_fd = os.dup(1)
  os.dup2(2, 1)
  sys.stdout = sys.stderr
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it then closes our stdin
  _set_pdeathsig()
  in_fd = sys.stdin.fileno()
  from tilecraft.helpers import Context
  state = _WorkerState()
  _write_all(out_fd, _frame(pickle.dumps(("ready", os.getpid()))))
  while True:
    try: msg = pickle.loads(_read_exact(in_fd, int.from_bytes(_read_exact(in_fd, 8), "little")))
    except EOFError: return
    kind, settings, blobs, args = msg
    try:
      for bid, blob in blobs.items(): _WorkerState._lru_put(state.blobs, bid, pickle.loads(blob), 32)
      with Context(**settings): res = getattr(state, kind)(*args)
    except Exception as e:  # noqa: BLE001
      from tilecraft.device import CompileError
      res = ("compile_error" if isinstance(e, CompileError) else "error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}")
    _write_all(out_fd, _frame(pickle.dumps(res)))

# ---- the parent's side: a pool of workers --------------------------------------------------------

_STARTUP_S = 120.0  # a fresh worker's imports (and opening the device) don't count against a job's timeout

def _worker_env() -> dict[str, str]:
  env = dict(os.environ)
  paths = [p for p in sys.path if p] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
  env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
  return env

def _signal_name(rc: int) -> str:
  try: return signal.Signals(-rc).name
  except ValueError: return f"signal {-rc}"

class _Worker:
  def __init__(self) -> None:
    self.proc: Optional[subprocess.Popen] = None
    self.rbuf = bytearray()
    self.ready = False
    self.known: set[str] = set()
    self.prepared: Any = None  # the (device, buffers) a timing worker has set up

  def alive(self) -> bool: return self.proc is not None and self.proc.poll() is None
  def start(self) -> None:
    self.stop()
    self.proc = subprocess.Popen([sys.executable, "-c", _WORKER_CMD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 env=_worker_env(), bufsize=0, close_fds=True)
    self.rbuf, self.ready, self.known, self.prepared = bytearray(), False, set(), None
  def fileno(self) -> int:
    assert self.proc is not None and self.proc.stdout is not None
    return self.proc.stdout.fileno()
  def send(self, msg: tuple, blobs: dict[str, bytes]) -> None:
    kind, settings, args = msg
    need = {k: v for k, v in blobs.items() if k not in self.known}
    assert self.proc is not None and self.proc.stdin is not None
    _write_all(self.proc.stdin.fileno(), _frame(pickle.dumps((kind, settings, need, args))))
    self.known |= set(need)
  def read_frames(self) -> list[Any]:
    """Whatever complete replies are available now; EOFError when the worker is gone."""
    chunk = os.read(self.fileno(), 1 << 20)
    if not chunk: raise EOFError
    self.rbuf += chunk
    frames = []
    while len(self.rbuf) >= 8 and len(self.rbuf) >= 8 + (n := int.from_bytes(self.rbuf[:8], "little")):
      frames.append(pickle.loads(bytes(self.rbuf[8:8 + n])))
      del self.rbuf[:8 + n]
    return frames
  def death_note(self) -> str:
    if self.proc is None: return "no worker"
    try: rc = self.proc.wait(timeout=5)
    except subprocess.TimeoutExpired: return "worker stopped answering"
    return f"worker killed by {_signal_name(rc)}" if rc < 0 else f"worker exited with code {rc}"
  def stop(self) -> None:
    if self.proc is None: return
    p, self.proc = self.proc, None
    try:
      if p.poll() is None: p.kill()
      p.wait(timeout=10)
    except Exception: pass  # noqa: BLE001
    for f in (p.stdin, p.stdout):
      try: f and f.close()
      except OSError: pass

@dataclass
class _Job:
  kind: str
  args: tuple
  timeout: float
  blobs: dict[str, bytes] = field(default_factory=dict)

class _Pool:
  """Long-lived workers. `run(jobs, n)` runs jobs on up to n workers at once; each result is
  (status, payload) with status "ok"/"skip"/"error"/"compile_error" from the worker, or "crash"
  (the worker died: segfault, abort) / "hang" (no answer within the job's timeout: it is killed)."""
  def __init__(self) -> None:
    self.workers: list[_Worker] = []
    self.lock = threading.RLock()

  def _settings(self) -> dict[str, Any]:
    from tilecraft import helpers
    out = {k: v[-1] for k, v in getattr(helpers, "_overrides", {}).items() if v and isinstance(v[-1], (int, float, str, bool))}
    out["DEBUG"] = out.get("DEBUG", int(DEBUG)) if DEBUG >= 6 else 0  # workers stay quiet unless asked
    return out

  def run(self, jobs: Sequence[_Job], n: int, on_result: Optional[Callable[[int, tuple], None]] = None,
          stop: Optional[Callable[[], bool]] = None) -> list[Optional[tuple]]:
    with self.lock:
      n = max(1, min(n, len(jobs))) if jobs else 1
      while len(self.workers) < n: self.workers.append(_Worker())
      results: list[Optional[tuple]] = [None] * len(jobs)
      pending = list(range(len(jobs)))[::-1]
      busy: dict[_Worker, list] = {}  # worker -> [job index, deadline]
      settings = self._settings()
      def finish(w: _Worker, res: tuple) -> None:
        i = busy.pop(w)[0]
        results[i] = res
        if on_result is not None: on_result(i, res)
      try:
        while pending or busy:
          for w in self.workers[:n]:
            if not pending or (stop is not None and stop()): break
            if w in busy: continue
            i = pending.pop()
            job = jobs[i]
            for attempt in range(2):  # a worker that died while idle is replaced, not blamed
              if not w.alive(): w.start()
              try:
                w.send((job.kind, settings, job.args), job.blobs)
                break
              except OSError:
                w.stop()
            else:
              results[i] = res = ("crash", "could not start a worker")
              if on_result is not None: on_result(i, res)
              continue
            busy[w] = [i, time.monotonic() + job.timeout + (0 if w.ready else _STARTUP_S)]
          if not busy:
            if stop is not None and stop(): break
            continue
          now = time.monotonic()
          wait = max(0.0, min(d for _, d in busy.values()) - now)
          ready, _, _ = select.select([w.fileno() for w in busy], [], [], min(wait, 1.0))
          for w in [w for w in busy if w.fileno() in ready]:
            try: frames = w.read_frames()
            except (EOFError, OSError):
              finish(w, ("crash", w.death_note()))
              w.stop()
              continue
            for fr in frames:
              if fr[0] == "ready":
                w.ready = True
                busy[w][1] = time.monotonic() + jobs[busy[w][0]].timeout
              else:
                finish(w, fr)
                break
          now = time.monotonic()
          for w in [w for w, (_, d) in busy.items() if d < now]:
            finish(w, ("hang", f"no answer within {jobs[busy[w][0]].timeout:.3g}s: worker killed"))
            w.stop()
          if stop is not None and stop() and not busy: break
      finally:
        for w in list(busy): w.stop()  # interrupted mid-job: their late replies must never be read as another job's
      return results

  def close(self) -> None:
    with self.lock:
      for w in self.workers:
        if w.proc is not None and w.proc.stdin is not None:
          try: w.proc.stdin.close()
          except OSError: pass
      deadline = time.monotonic() + 2
      for w in self.workers:
        if w.proc is not None:
          try: w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
          except subprocess.TimeoutExpired: pass
        w.stop()
      self.workers = []

_pool: Optional[_Pool] = None
_pool_pid = -1

def _get_pool() -> _Pool:
  global _pool, _pool_pid
  if _pool is None or _pool_pid != os.getpid():  # a forked child must not share its parent's pipes
    _pool, _pool_pid = _Pool(), os.getpid()
  return _pool

def close_workers() -> None:
  """Stop the search's worker processes (they are also stopped at exit)."""
  global _pool
  if _pool is not None and _pool_pid == os.getpid(): _pool.close()
  _pool = None

import atexit  # noqa: E402
atexit.register(close_workers)

# ---- the sqlite cache ----------------------------------------------------------------------------

_SCHEMA = 1

def cache_db_path() -> str:
  """`CACHEDB` (env or Context) if set, else cache_dir()/search.db."""
  return getenv("CACHEDB", "") or os.path.join(cache_dir(), "search.db")

class SearchDB:
  """Search results and per-candidate timings in one sqlite file. A file that is not a database, or
  fails sqlite's quick_check, is moved aside to `<path>.corrupt` with a warning and rebuilt."""
  def __init__(self, path: str):
    self.path = path
    self.conn: Optional[sqlite3.Connection] = None
    self.broken = False

  def _connect(self) -> sqlite3.Connection:
    d = os.path.dirname(os.path.abspath(self.path))
    os.makedirs(d, exist_ok=True)
    conn = sqlite3.connect(self.path, timeout=30)
    try:
      row = conn.execute("PRAGMA quick_check").fetchone()
      if row is None or row[0] != "ok": raise sqlite3.DatabaseError(f"quick_check says {row[0] if row else 'nothing'}")
      ver = conn.execute("PRAGMA user_version").fetchone()[0]
      if ver not in (0, _SCHEMA):
        conn.executescript("DROP TABLE IF EXISTS results; DROP TABLE IF EXISTS timings;")
      with conn:
        conn.execute("CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, opts TEXT NOT NULL, chose TEXT NOT NULL, time REAL, "
                     "hand_time REAL, complete INTEGER NOT NULL, budget REAL, info TEXT, created REAL)")
        conn.execute("CREATE TABLE IF NOT EXISTS timings (ast TEXT NOT NULL, ctx TEXT NOT NULL, opts TEXT NOT NULL, status TEXT NOT NULL, "
                     "time REAL, PRIMARY KEY (ast, ctx, opts))")
        conn.execute(f"PRAGMA user_version = {_SCHEMA}")
    except BaseException:
      conn.close()
      raise
    return conn

  def _open(self) -> Optional[sqlite3.Connection]:
    if self.broken: return None
    if self.conn is None:
      try: self.conn = self._connect()
      except sqlite3.DatabaseError as e:
        if not _is_corruption(e): return self._give_up(e)
        self._rebuild(e)
        try: self.conn = self._connect()
        except sqlite3.Error as e2: return self._give_up(e2)
      except OSError as e: return self._give_up(e)
    return self.conn

  def _rebuild(self, err: Exception) -> None:
    bad = self.path + ".corrupt"
    try: os.replace(self.path, bad)
    except OSError: bad = "(could not move it aside)"
    for ext in ("-journal", "-wal", "-shm"):
      try: os.unlink(self.path + ext)
      except OSError: pass
    warnings.warn(f"search cache {self.path} is corrupted ({err}); moved it to {bad} and started a new one", RuntimeWarning, stacklevel=4)

  def _give_up(self, err: Exception) -> Optional[sqlite3.Connection]:
    warnings.warn(f"search cache {self.path} can't be used ({err}); searching without it", RuntimeWarning, stacklevel=4)
    self.broken = True
    return None

  def _do(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
    for attempt in range(2):
      if (conn := self._open()) is None: return None
      try: return fn(conn)
      except sqlite3.DatabaseError as e:
        if not _is_corruption(e): return self._give_up(e)
        err: Exception = e
      try: conn.close()
      except sqlite3.Error: pass
      self.conn = None
      if attempt == 0: self._rebuild(err)
    return None

  def get_result(self, key: str) -> Optional[tuple]:
    return self._do(lambda c: c.execute("SELECT opts, chose, time, hand_time, complete, budget FROM results WHERE key=?", (key,)).fetchone())
  def put_result(self, key: str, opts: str, chose: str, t: float, hand_t: float, complete: bool, budget: Optional[float], info: str) -> None:
    def put(c: sqlite3.Connection) -> None:
      with c: c.execute("INSERT OR REPLACE INTO results VALUES (?,?,?,?,?,?,?,?,?)",
                        (key, opts, chose, _finite(t), _finite(hand_t), int(complete), budget, info, time.time()))
    self._do(put)
  def get_timings(self, ast: str, ctx: str) -> dict[str, tuple[str, Optional[float]]]:
    rows = self._do(lambda c: c.execute("SELECT opts, status, time FROM timings WHERE ast=? AND ctx=?", (ast, ctx)).fetchall())
    return {o: (s, t) for o, s, t in (rows or [])}
  def put_timings(self, ast: str, ctx: str, rows: list[tuple[str, str, Optional[float]]]) -> None:
    if not rows: return
    def put(c: sqlite3.Connection) -> None:
      with c: c.executemany("INSERT OR REPLACE INTO timings VALUES (?,?,?,?,?)", [(ast, ctx, o, s, t) for o, s, t in rows])
    self._do(put)
  def close(self) -> None:
    if self.conn is not None:
      try: self.conn.close()
      except sqlite3.Error: pass
      self.conn = None

def _is_corruption(e: Exception) -> bool:
  """Errors that mean the file is damaged (rebuild it), as opposed to locked, read-only or full (leave it)."""
  msg = str(e).lower()
  return any(w in msg for w in ("not a database", "malformed", "quick_check", "encrypted", "disk image", "corrupt"))

def _finite(x: Optional[float]) -> Optional[float]: return x if x is not None and math.isfinite(x) else None

_dbs: dict[tuple[str, int], SearchDB] = {}

def close_cache_dbs() -> None:
  """Close this process's connections to search caches (they reopen on the next use)."""
  for db in _dbs.values(): db.close()
  _dbs.clear()

def _get_db() -> Optional[SearchDB]:
  if int(getenv("CACHELEVEL", 2)) <= 0: return None
  key = (os.path.abspath(cache_db_path()), os.getpid())
  if key not in _dbs: _dbs[key] = SearchDB(key[0])
  db = _dbs[key]
  return None if db.broken else db

# ---- the search ----------------------------------------------------------------------------------

@dataclass
class Candidate:
  """One kernel the search built and (maybe) timed."""
  opts: tuple
  kernel: Optional[Kernel]
  status: str = "new"   # new | ok | early (stopped early: far slower) | dup | skip | crash | hang | error | compile_error | budget
  time: float = math.inf
  msg: str = ""
  src: str = ""
  prog: Optional[tuple] = None  # (name, lib, global_size, local_size, var values)
  factor: float = 1.0          # time multiplier when timed on a smaller grid (allow_test_size)
  uops: int = 0
  ops: int = 0
  expanded: bool = False
  @property
  def key(self) -> str: return _opts_key(self.opts)
  @property
  def timed(self) -> bool: return self.status in ("ok", "early", "cached") and math.isfinite(self.time)

@dataclass
class SearchReport:
  """What a search did; the latest one is `search.last_report`."""
  name: str = ""
  device: str = ""
  cache_hit: bool = False
  rounds: int = 0
  built: int = 0
  timed: int = 0
  cached_timings: int = 0
  duplicates: int = 0
  failures: list[tuple[tuple, str, str]] = field(default_factory=list)  # (opts, status, message)
  hand_time: float = math.inf
  base_time: float = math.inf
  beam_time: float = math.inf
  final_time: float = math.inf
  chose: str = ""   # "beam" | "hand" | "base"
  opts: tuple = ()
  verified: Optional[bool] = None
  complete: bool = True
  wall_s: float = 0.0
  build_s: float = 0.0   # wall time spent rendering + compiling (parallel)
  time_s: float = 0.0    # wall time spent timing, verifying and racing (one worker)

last_report: Optional[SearchReport] = None

def _identity(obj: Any, attrs: Sequence[str]) -> str:
  parts = [f"{type(obj).__module__}.{type(obj).__qualname__}"]
  parts += [f"{a}={getattr(obj, a, None)!r}" for a in attrs]
  parts += [f"{k}={v!r}" for k, v in sorted(getattr(obj, "__dict__", {}).items()) if not k.startswith("_") and isinstance(v, (int, float, str, bool, tuple, type(None)))]
  return hashlib.sha256("|".join(parts).encode()).hexdigest()[:24]

def _renderer_identity(ren: Any) -> str:
  return _identity(ren, ("device", "supports_float4", "has_local", "has_shared", "global_max", "local_max", "shared_max", "tensor_cores",
                         "has_transcendentals", "vector_width"))

_codegen_id: Optional[str] = None

def _codegen_identity() -> str:
  """A hash of the code generator's source: generated code (so timings and the best opts) may change
  with it, so cached searches and timings are only reused by the same code generator."""
  global _codegen_id
  if _codegen_id is None:
    import tilecraft
    root = os.path.dirname(os.path.abspath(tilecraft.__file__))
    h = hashlib.sha256()
    for sub in ("codegen", "renderer", "shape", "runtime", ""):
      d = os.path.join(root, sub)
      for fn in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if fn.endswith(".py") and (sub or fn in ("ops.py", "dtype.py", "device.py")):
          with open(os.path.join(d, fn), "rb") as f: h.update(fn.encode() + b"\0" + f.read())
    _codegen_id = h.hexdigest()[:24]
  return _codegen_id

def _compiler_identity(comp: Any) -> str:
  return hashlib.sha256(f"{type(comp).__qualname__}|{getattr(comp, 'cachekey', '')}|{' '.join(getattr(comp, 'flags', ()))}".encode()).hexdigest()[:24]

def _var_vals(kernel: Kernel, var_vals: Optional[dict]) -> dict[str, int]:
  """Values for the kernel's Variables by name: given, else bound, else the maximum (buffers are sized for it)."""
  given = {getattr(k, "expr", k): int(v) for k, v in (var_vals or {}).items()}
  out = {}
  for v in sorted(kernel.ast.vars(), key=lambda v: v.expr):
    out[v.expr] = given.get(v.expr, v.val if v.is_bound else v.vmax)
  for b in kernel.bufs:
    if not isinstance(b, MemBuffer) and isinstance(getattr(b, "val", None), Variable):
      v = b.val
      out.setdefault(v.expr, given.get(v.expr, v.val if v.is_bound else v.vmax))
  return out

def _buffer_specs(kernel: Kernel, bufs: Optional[Sequence[Any]]) -> list[tuple[int, Any]]:
  """(elements, dtype) of each kernel argument, in the program's order (global buffer index)."""
  per_idx: dict[int, tuple[int, Any]] = {}
  for x in kernel.ast.lazyops:
    if x.op in (BufferOps.LOAD, BufferOps.STORE) and isinstance(x.arg, MemBuffer) and x.arg.idx >= 0:
      size = x.arg.st.real_size()
      if not isinstance(size, int): raise ValueError(f"buffer {x.arg.idx} has no concrete size ({size})")
      if x.arg.idx not in per_idx or size > per_idx[x.arg.idx][0]: per_idx[x.arg.idx] = (size, x.arg.dtype)
  idxs = sorted(per_idx)
  if bufs is None: return [per_idx[i] for i in idxs]
  # the kernel's arguments in order, or a list indexed by buffer index (which may hold more)
  if len(bufs) == len(idxs): picked = list(bufs)
  elif idxs and len(bufs) > idxs[-1]: picked = [bufs[i] for i in idxs]
  else: raise ValueError(f"kernel {kernel.name} takes {len(idxs)} buffers (indices {idxs}), beam_search got {len(bufs)}")
  for i, b in zip(idxs, picked):
    if b.size < per_idx[i][0]: raise ValueError(f"buffer {i} has {b.size} elements, the kernel touches {per_idx[i][0]}")
  return [(b.size, b.dtype) for b in picked]

_TEST_GLOBAL_MAX = 65536  # workgroups launched when timing a test-sized kernel

def _test_size(gs: Optional[list[int]]) -> tuple[Optional[list[int]], float]:
  """A smaller grid (fewer workgroups, the same code) and the factor that scales its time back up."""
  if gs is None or prod(gs) <= _TEST_GLOBAL_MAX: return gs, 1.0
  small = list(gs)
  while prod(small) > _TEST_GLOBAL_MAX:
    i = max(range(len(small)), key=lambda j: small[j])
    small[i] = max(1, small[i] // 2)
  return small, prod(gs) / prod(small)

def _fmt_t(t: float) -> str:
  if not math.isfinite(t): return "   inf"
  return f"{t*1e3:.3f}ms" if t < 1 else f"{t:.3f}s"

class _Search:
  def __init__(self, kernel: Kernel, bufs: Optional[Sequence[Any]], amt: int, allow_test_size: bool, var_vals: Optional[dict],
               budget_s: Optional[float], timeout_s: float, build_timeout_s: float, runs: int, max_rounds: int, workers: Optional[int],
               progress: Optional[bool], early_stop: float, max_upcast: int, max_lanes: int, max_threads: Optional[int], max_uops: int,
               verify: bool, min_gain: float, use_cache: bool, patience: int = 2):
    from tilecraft.device import Device
    self.t0 = time.perf_counter()
    self.kernel, self.amt, self.allow_test_size = kernel, amt, allow_test_size
    self.ren = kernel.opts
    self.device = self.ren.device
    self.dev = Device[self.device]
    self.budget_s, self.timeout_s, self.build_timeout_s = budget_s, timeout_s, build_timeout_s
    self.runs, self.max_rounds, self.early_stop = runs, max_rounds, early_stop
    self.max_upcast, self.max_lanes, self.max_threads, self.max_uops = max_upcast, max_lanes, max_threads, max_uops
    self.verify_on, self.min_gain, self.patience = verify, min_gain, patience
    self.n_workers = workers or int(getenv("BEAM_WORKERS", 0)) or min(os.cpu_count() or 1, 8)
    self.vv = _var_vals(kernel, var_vals)
    self.specs = _buffer_specs(kernel, bufs)
    self.n_out = len(kernel.outbufs)
    self.outs_read = any(x.op is BufferOps.LOAD and isinstance(x.arg, MemBuffer) and 0 <= x.arg.idx < self.n_out for x in kernel.ast.lazyops)
    self.name = kernel.name
    self.ast_hex = kernel.ast.key.hex()
    self.start_opts = tuple(kernel.applied_opts)
    self.ren_id, self.comp_id = _renderer_identity(self.ren), _compiler_identity(self.dev.compiler)
    settings = [SEARCH_VERSION, _codegen_identity(), self.ast_hex, self.device, self.ren_id, self.comp_id, amt, bool(allow_test_size),
                _opts_key(self.start_opts), max_upcast, max_lanes, max_threads, max_uops, patience, max_rounds, sorted(self.vv.items())]
    self.result_key = hashlib.sha256(json.dumps(settings).encode()).hexdigest()
    self.timing_ctx = hashlib.sha256(json.dumps([SEARCH_VERSION, _codegen_identity(), self.device, self.ren_id, self.comp_id, bool(allow_test_size),
                                                 sorted(self.vv.items())]).encode()).hexdigest()[:32]
    self.db = _get_db() if use_cache else None
    self.report = SearchReport(name=self.name, device=self.device)
    self.cands: dict[str, Candidate] = {}
    self.by_src: dict[str, Candidate] = {}
    self.by_lib: dict[bytes, Candidate] = {}
    self.seen_sigs: set = set()
    self.best_time = math.inf
    self.ref: Optional[Candidate] = None  # the kernel each candidate is timed alongside
    self.progress = sys.stderr.isatty() if progress is None else progress
    self.bar: Any = None
    self.pool: Optional[_Pool] = None
    self.blobs: dict[str, bytes] = {}
    self.timings_cache: dict[str, tuple[str, Optional[float]]] = {}
    self.new_timings: list[tuple[str, str, Optional[float]]] = []

  # -- helpers --
  def over_budget(self) -> bool: return self.budget_s is not None and time.perf_counter() - self.t0 > self.budget_s

  def _blobs(self) -> dict[str, bytes]:
    if not self.blobs:
      ast_blob = pickle.dumps(self.kernel.ast)
      try: ren_blob = pickle.dumps(self.ren)
      except Exception: ren_blob = pickle.dumps(None)  # noqa: BLE001 - the worker uses Device[device].renderer
      self.blobs = {"ast:" + hashlib.sha256(ast_blob).hexdigest()[:20]: ast_blob, "ren:" + hashlib.sha256(ren_blob).hexdigest()[:20]: ren_blob}
    return self.blobs

  def _bar_start(self) -> None:
    if not self.progress or self.bar is not None: return
    try: from tqdm import tqdm
    except ImportError:
      global _tqdm_note_shown
      if not _tqdm_note_shown:
        print("search: no progress bar (tqdm is not installed: pip install 'tilecraft[progress]')", file=sys.stderr)
        _tqdm_note_shown = True
      self.progress = False
      return
    self.bar = tqdm(total=0, desc=f"BEAM={self.amt} {self.name}", unit="cand", leave=False, file=sys.stderr, dynamic_ncols=True)

  def _bar(self, add_total: int = 0, done: int = 0) -> None:
    if self.bar is None: return
    if add_total: self.bar.total += add_total
    if done: self.bar.update(done)
    self.bar.set_postfix_str(f"round {self.report.rounds} best {_fmt_t(self.best_time)}", refresh=not done)

  def fail(self, c: Candidate, status: str, msg: str) -> None:
    c.status, c.msg, c.time = status, msg, math.inf
    self.report.failures.append((c.opts, status, msg.splitlines()[0] if msg else ""))
    if DEBUG >= 3: print(f"search: {status} {list(c.opts)}: {msg.splitlines()[0] if msg else ''}")

  def add(self, k: Kernel) -> Optional[Candidate]:
    """A new candidate for kernel k, or None when an equal kernel was already seen in this search."""
    sig = _signature(k)
    if sig in self.seen_sigs: return None
    self.seen_sigs.add(sig)
    c = Candidate(tuple(k.applied_opts), k)
    if c.key in self.cands: return None
    self.cands[c.key] = c
    return c

  # -- building and timing --
  def build(self, cands: list[Candidate], must: bool = False) -> None:
    """Render and compile in parallel. A candidate with the same source or binary as an earlier one is
    marked `dup` (it keeps the program, but is never timed again)."""
    if not cands: return
    blobs = self._blobs()
    ast_id, ren_id = list(blobs)
    jobs = [_Job("build", (ast_id, ren_id, self.ast_hex, self.device, [_opt_wire(o) for o in c.opts], self.name, self.vv, self.max_uops, True),
                 self.build_timeout_s, blobs) for c in cands]
    assert self.pool is not None
    t0 = time.perf_counter()
    results = self.pool.run(jobs, self.n_workers, lambda i, res: self._bar(done=1), None if must else self.over_budget)
    self.report.build_s += time.perf_counter() - t0
    for c, res in zip(cands, results):
      if res is None:
        c.status = "budget"
        continue
      status, payload = res
      if status == "skip":
        c.status, c.msg = "skip", payload
        continue
      if status != "ok":
        self.fail(c, status, payload)
        if status in ("compile_error", "error", "crash"): self.new_timings.append((c.key, status, None))
        continue
      self.report.built += 1
      c.src, c.uops, c.ops = payload["src"], payload["uops"], payload["ops"]
      c.prog = (self.name, payload["lib"], payload["gs"], payload["ls"], payload["vals"])
      lib_hash = hashlib.sha256(payload["lib"]).digest()
      first = self.by_src.get(c.src) or self.by_lib.get(lib_hash)
      if first is not None and first is not c:
        c.status, c.msg = "dup", f"same code as {list(first.opts)}"
        self.report.duplicates += 1
        continue
      self.by_src[c.src], self.by_lib[lib_hash] = c, c
      c.status = "built"

  def time(self, cands: list[Candidate], must: bool = False) -> None:
    """Time built candidates one at a time on one worker while the others idle; a failure costs a
    fresh worker, not the search."""
    assert self.pool is not None
    for c in cands:
      if c.status != "built" or c.prog is None: continue
      if not must and self.over_budget():
        c.status = "budget"
        continue
      directive = _test_hook(c.opts) if _test_hook is not None else None
      prog, c.factor = self._timing_prog(c)
      early = self.best_time * self.early_stop / c.factor if math.isfinite(self.best_time) and self.early_stop else None
      ref = self.ref if self.ref is not None and self.ref is not c else None
      job = _Job("time", (self.device, prog, self.specs, self.runs, early, directive, self.timeout_s + 30,
                          None if ref is None else self._timing_prog(ref)[0]), self.timeout_s * (2 if ref else 1))
      status, payload = self.timer_run(job) or ("budget", "")
      if status != "ok":
        self.fail(c, status, payload)
        if status in ("crash", "error"): self.new_timings.append((c.key, status, None))
        continue
      times, ref_times = payload
      c.time = min(times) * c.factor
      # relative to the reference run alongside: a burst of load on the machine slows both alike
      if ref is not None and ref_times: c.time *= ref.time / (min(ref_times) * ref.factor)
      c.status = "early" if len(payload) < self.runs else "ok"
      self.report.timed += 1
      self.new_timings.append((c.key, c.status, c.time))
      self.best_time = min(self.best_time, c.time)
      self._bar()

  def _timing_prog(self, c: Candidate) -> tuple[tuple, float]:
    """c's program as timed (on a smaller grid when allow_test_size) and the factor that scales its
    time back up to the full grid."""
    assert c.prog is not None
    gs, factor = _test_size(c.prog[2]) if self.allow_test_size else (c.prog[2], 1.0)
    return c.prog[:2] + (gs,) + c.prog[3:], factor

  def timer_run(self, job: _Job) -> Optional[tuple]:
    """Run one job on the timing worker (worker 0), setting up its buffers first if it is new."""
    assert self.pool is not None
    t0 = time.perf_counter()
    try:
      key = (self.device, tuple(self.specs))
      if not self.pool.workers or not self.pool.workers[0].alive() or self.pool.workers[0].prepared != key:
        prep = self.pool.run([_Job("prepare", (self.device, self.specs), max(60.0, self.timeout_s))], 1)[0]
        if prep is None or prep[0] != "ok": return prep
        self.pool.workers[0].prepared = key
      return self.pool.run([job], 1)[0]
    finally: self.report.time_s += time.perf_counter() - t0

  def evaluate(self, cands: list[Candidate]) -> None:
    """Timing-cache hits first; build and time the rest."""
    todo = []
    for c in cands:
      if (hit := self.timings_cache.get(c.key)) is not None:
        status, t = hit
        self.report.cached_timings += 1
        if t is not None and status in ("ok", "early"):
          c.status, c.time = "cached", float(t)
          self.best_time = min(self.best_time, c.time)
        else: c.status, c.msg = status, "failed in an earlier search (timing cache)"
        self._bar(done=1)
      else: todo.append(c)
    # in batches: builds stay parallel and timing stays alone on the machine, but a spent budget
    # still leaves timed candidates behind instead of a pile of untimed binaries
    step = max(8, 3 * self.n_workers)
    for i in range(0, len(todo), step):
      self.build(todo[i:i + step])
      self.time(todo[i:i + step])

  def ensure_built(self, c: Candidate) -> bool:
    """Candidates whose timing came from the cache are built when they are needed (verify, race)."""
    if c.prog is None:
      t, st = c.time, c.status
      self.build([c], must=True)
      if c.prog is not None: c.time, c.status = t, (st if c.status in ("built", "dup") else c.status)
    return c.prog is not None

  # -- the whole search --
  def run(self) -> Kernel:
    global last_report
    last_report = self.report
    if self.db is not None and (k := self.from_cache()) is not None: return k
    self.pool = _get_pool()
    self._bar_start()
    try: return self.search()
    finally:
      if self.bar is not None: self.bar.close()
      if self.db is not None: self.db.put_timings(self.ast_hex, self.timing_ctx, self.new_timings)
      self.report.wall_s = time.perf_counter() - self.t0
      self.summary()

  def from_cache(self) -> Optional[Kernel]:
    assert self.db is not None
    row = self.db.get_result(self.result_key)
    if row is None: return None
    opts_s, chose, t, hand_t, complete, budget = row
    if not complete and (self.budget_s is None or (budget is not None and self.budget_s > budget)): return None
    opts = _opts_from_key(opts_s)
    try:
      if chose == "hand":
        k = self.kernel.copy().hand_coded_optimizations()
      else:
        if tuple(opts[:len(self.start_opts)]) != self.start_opts: raise KernelOptError("stored opts don't extend this kernel's opts")
        k = self.kernel.copy()
        for o in opts[len(self.start_opts):]: k.apply_opt(o, reason="beam search (cached)")
    except KernelOptError as e:
      warnings.warn(f"search: cached opts {opts} no longer apply to {self.name} ({e}); searching again", RuntimeWarning, stacklevel=3)
      return None
    r = self.report
    r.cache_hit, r.chose, r.opts, r.final_time, r.hand_time, r.complete = True, chose, tuple(k.applied_opts), t or math.inf, hand_t or math.inf, bool(complete)
    r.wall_s = time.perf_counter() - self.t0
    self.summary()
    return k

  def search(self) -> Kernel:
    r = self.report
    if self.db is not None: self.timings_cache = self.db.get_timings(self.ast_hex, self.timing_ctx)
    base = Candidate(self.start_opts, self.kernel)
    self.cands[base.key] = base
    self.seen_sigs.add(_signature(self.kernel))
    try: hand = self.add(self.kernel.copy().hand_coded_optimizations()) or base
    except Exception as e:  # noqa: BLE001 - a heuristic bug must not take the search down; the unoptimized kernel is the floor then
      warnings.warn(f"search: hand_coded_optimizations() failed on {self.name} ({type(e).__name__}: {e})", RuntimeWarning, stacklevel=4)
      hand = base
    ref_k = Kernel(self.kernel.ast, self.ren).required_optimizations()
    ref = Candidate(tuple(ref_k.applied_opts), ref_k)
    seeds = [hand] + ([base] if base is not hand else [])
    self._bar(add_total=len(seeds))
    # the seeds and the reference are built together; the floor is always timed, whatever the budget
    self.build(seeds + ([ref] if self.verify_on and ref.key != base.key else []), must=True)
    if self.verify_on and ref.key == base.key: ref = base
    self.time([hand], must=True)
    # every later timing runs interleaved with the hand-coded kernel and is scaled by it (see time())
    self.ref = hand if hand.timed and hand.prog is not None else None
    self.time([base] if base is not hand else [], must=True)
    r.hand_time, r.base_time = hand.time, base.time
    # the heuristic's intermediate kernels are seeds too: a better kernel is often one step off its
    # path (say, a smaller register tile before the unroll) rather than one step past its end
    prefixes = []
    for i in range(len(self.start_opts) + 1, len(hand.opts)):
      k = self.kernel.copy()
      try:
        for o in hand.opts[len(self.start_opts):i]: k.apply_opt(o, reason="beam search (seed: hand-coded prefix)")
      except KernelOptError: continue
      if (c := self.add(k)) is not None: prefixes.append(c)
    self._bar(add_total=len(prefixes))
    self.evaluate(prefixes)
    # each round expands the `amt` fastest kernels not expanded yet; the search ends when the best
    # time hasn't improved (by min_gain) for `patience` rounds, nothing is left, or the budget is spent
    rounds = stale = 0
    while rounds < self.max_rounds and stale < self.patience and not self.over_budget():
      beam = sorted([c for c in self.cands.values() if c.timed and not c.expanded and c.kernel is not None], key=lambda c: c.time)[:self.amt]
      if not beam: break
      rounds += 1
      r.rounds = rounds
      if DEBUG >= 3: print(f"search: round {rounds}: expanding " + ", ".join(f"{_fmt_t(c.time)} {list(c.opts)}" for c in beam))
      best_before = self.best_time
      new: list[Candidate] = []
      for b in beam:
        b.expanded = True
        assert b.kernel is not None
        for k in get_kernel_actions(b.kernel, include_0=False, max_upcast=self.max_upcast, max_lanes=self.max_lanes,
                                    max_threads=self.max_threads).values():
          if (c := self.add(k)) is not None: new.append(c)
      self._bar(add_total=len(new))
      self.evaluate(new)
      stale = 0 if self.best_time < best_before * (1 - self.min_gain) else stale + 1
    r.complete = not self.over_budget()
    return self.finish(hand, base, ref)

  def finish(self, hand: Candidate, base: Candidate, ref: Candidate) -> Kernel:
    """Verify the fastest candidates against the unoptimized kernel, race the first correct one against
    the floor (hand-coded), and keep it only if it wins by min_gain."""
    r = self.report
    assert self.pool is not None
    timed = sorted([c for c in self.cands.values() if c.timed and c is not hand], key=lambda c: c.time)
    r.beam_time = timed[0].time if timed else math.inf
    floor = hand if hand.timed else (base if base.timed else None)
    contenders = [c for c in timed if c is not floor and (floor is None or c.time < floor.time * (1 - self.min_gain))][:3]
    contenders = [c for c in contenders if self.ensure_built(c)]
    winner: Optional[Candidate] = None
    if contenders and self.verify_on:
      res = self.timer_run(_Job("verify", (self.device, ref.prog, [c.prog for c in contenders], self.specs, self.n_out, self.outs_read, 1234, 64),
                                max(120.0, 10 * self.timeout_s))) if self.ensure_built(ref) else ("error", "the reference didn't build")
      if res is not None and res[0] == "ok":
        for c, (ok, err, note) in zip(contenders, res[1]):
          if ok:
            winner = c
            break
          warnings.warn(f"search: {self.name} with {list(c.opts)} on {self.device} gives wrong results (max error {err:.3g}"
                        f"{'; ' + note if note else ''}): a code generation bug; dropped", RuntimeWarning, stacklevel=4)
          self.fail(c, "wrong", f"max error {err:.3g} {note}")
        r.verified = winner is not None
      else:
        warnings.warn(f"search: could not verify the candidates for {self.name}: {res}", RuntimeWarning, stacklevel=4)
        r.verified = False
    elif contenders: winner = contenders[0]
    chosen, chose = (hand, "hand" if hand is not base else "base") if floor is hand or floor is None else (base, "base")
    if winner is not None and floor is not None and self.ensure_built(floor):
      # head to head, interleaved, more runs: a lucky measurement during the search can't beat the floor
      res = self.timer_run(_Job("race", (self.device, [floor.prog, winner.prog], self.specs, max(5, self.runs)), max(30.0, 4 * self.timeout_s)))
      if res is not None and res[0] == "ok":
        floor_t, win_t = res[1]
        if floor is hand: r.hand_time = floor_t
        if win_t < floor_t * (1 - self.min_gain): chosen, chose, r.final_time = winner, "beam", win_t
        else: r.final_time = floor_t
      else: self.fail(winner, res[0] if res else "budget", res[1] if res else "")
    elif winner is not None: chosen, chose = winner, "beam"
    if not math.isfinite(r.final_time): r.final_time = chosen.time
    r.chose = chose
    if chose == "hand" and hand is not base: k = self.kernel.copy().hand_coded_optimizations()
    else:
      k = self.kernel.copy()
      for o in chosen.opts[len(self.start_opts):]: k.apply_opt(o, reason="beam search")
    r.opts = tuple(k.applied_opts)
    if floor is None: warnings.warn(f"search: neither the hand-coded nor the unoptimized {self.name} could be timed", RuntimeWarning, stacklevel=4)
    if self.db is not None:
      info = json.dumps({"name": self.name, "rounds": r.rounds, "built": r.built, "timed": r.timed})
      self.db.put_result(self.result_key, _opts_key(k.applied_opts), chose, r.final_time, r.hand_time, r.complete, self.budget_s, info)
    return k

  def summary(self) -> None:
    r = self.report
    if DEBUG < 2: return
    if r.cache_hit:
      print(f"search {r.name:<28} {r.device:6} cache hit ({r.chose}) {_fmt_t(r.final_time)} in {r.wall_s*1e3:.1f}ms: {list(r.opts)}")
      return
    gain = r.hand_time / r.final_time if math.isfinite(r.hand_time) and math.isfinite(r.final_time) and r.final_time > 0 else float("nan")
    print(f"search {r.name:<28} {r.device:6} hand {_fmt_t(r.hand_time)} -> {_fmt_t(r.final_time)} ({gain:.2f}x, {r.chose}) "
          f"{r.rounds} rounds, {r.built} built, {r.timed} timed, {r.cached_timings} cached, {len(r.failures)} failed, "
          f"{r.wall_s:.1f}s (build {r.build_s:.1f}s, time {r.time_s:.1f}s){'' if r.complete else ' (budget)'}: {list(r.opts)}")

_tqdm_note_shown = False
_search_lock = threading.RLock()

def beam_search(kernel: Kernel, bufs: Optional[Sequence[Any]] = None, amt: int = 2, allow_test_size: bool = True, *,
                var_vals: Optional[dict] = None, budget_s: Optional[float] = None, timeout_s: float = 10.0,
                build_timeout_s: float = 120.0, runs: int = 3, max_rounds: int = 12, workers: Optional[int] = None,
                progress: Optional[bool] = None, early_stop: float = 3.0, max_upcast: int = 256, max_lanes: int = 1024,
                max_threads: Optional[int] = None, max_uops: int = 3000, verify: bool = True, min_gain: float = 0.01,
                patience: int = 2, disable_cache: bool = False) -> Kernel:
  """The fastest kernel the beam search finds for `kernel`'s AST, never slower than its hand-coded
  opts (API). Returns a new Kernel; `kernel` is untouched.

  bufs: the kernel's Buffers (outputs first) or None; only their sizes and dtypes are used, since
    timing runs in a worker process on random data. amt: the beam width.
  allow_test_size: time kernels with more than 65536 workgroups on a smaller grid and scale.
  var_vals: values for symbolic Variables (default: bound value, else the maximum).
  budget_s: wall-clock budget; when spent, the best kernel so far is returned.
  timeout_s: per timing job (runs of one candidate); slower or hung candidates are dropped.
  max_rounds, patience: at most max_rounds rounds; stop after `patience` rounds without a new best.
  runs: timing repeats (the minimum counts); early_stop: stop after one run when a candidate is
    that many times slower than the best so far. verify: check the winner against the unoptimized
    kernel's output. min_gain: the fraction by which a candidate must beat the hand-coded kernel
    head to head. disable_cache: neither read nor write the sqlite cache (CACHELEVEL=0 does too).
  The summary of the search is in `tilecraft.engine.search.last_report`."""
  if not isinstance(amt, int) or amt < 1: raise ValueError(f"beam width must be an int >= 1, got {amt!r}")
  with _search_lock:
    s = _Search(kernel, bufs, amt, allow_test_size, var_vals, budget_s, timeout_s, build_timeout_s, runs, max_rounds, workers,
                progress, early_stop, max_upcast, max_lanes, max_threads, max_uops, verify, min_gain, not disable_cache, patience)
    return s.run()

def optimize_kernel(kernel: Kernel, bufs: Optional[Sequence[Any]] = None) -> Kernel:
  """The opts the scheduler applies to each kernel: `BEAM=n` searches with beam width n (budget from
  `BEAM_BUDGET` seconds, if set), `NOOPT=1` applies only the required opts, otherwise the hand-coded
  opts. A search that can't run (no worker, a broken device) falls back to hand-coded with a warning."""
  if NOOPT: return kernel.copy().required_optimizations()
  if (width := int(getenv("BEAM", 0))) >= 1:
    try: return beam_search(kernel, bufs, width, budget_s=float(getenv("BEAM_BUDGET", 0.0)) or None)
    except Exception as e:  # noqa: BLE001
      warnings.warn(f"BEAM={width}: search of {kernel.name} failed ({type(e).__name__}: {e}); using hand-coded opts", RuntimeWarning, stacklevel=2)
  return kernel.copy().hand_coded_optimizations()
