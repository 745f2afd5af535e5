"""The beam search itself: `beam_search(kernel, bufs, amt) -> Kernel` (API).

Each round extends the `amt` fastest kernels not extended yet (the beam) by every action of the
grid (search/actions.py), and the search stops after `patience` rounds without a new best. The
unoptimized kernel, the hand-coded one and the hand-coded kernel's intermediate steps seed the
beam; the hand-coded kernel is the floor (a winner must also beat it head to head, and match the
unoptimized kernel's output on random data).

All rendering, compiling and running of candidates happens in worker processes (search/worker.py,
started through tilecraft.engine.isolation):
- Rendering runs in the workers too: lowering a big candidate takes up to ~0.5 s of pure Python, so
  it parallelizes like compilation, and a lowering bug that loops forever only costs a timeout.
  ASTs travel as plain pickles (LazyOp and Node rebuild their per-process cached hashes).
- Builds (render + compile) run on all workers at once. Timing runs on one worker at a time while
  the others are idle (a CPU kernel uses every core through OpenMP), each with a timeout: a worker
  that segfaults or hangs is killed, the candidate is recorded as failed, a fresh worker replaces
  it and the search goes on.
- Each candidate's runs alternate with runs of the hand-coded kernel in the same job, and its time
  is scaled by the hand-coded kernel's (its own timing / its timing in that job). On a shared
  machine a multi-threaded kernel's time swings by tens of percent over seconds; both kernels of a
  job see the same swing, so the ranking doesn't depend on when a candidate ran.
The workers live for the whole process (started on first use, stopped at exit), so a second search
pays no start-up. Results persist in sqlite (search/db.py), each row naming the kind of machine that
found it; `cached_result` looks a search's result up by key without building anything (a tuning
driver skips kernels already tuned that way).
"""
from __future__ import annotations
import hashlib, inspect, json, math, os, pickle, sys, threading, time, warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence
from tilecraft.codegen.kernel import Kernel, KernelOptError
from tilecraft.engine.isolation import Job, Pool, close_pool, get_pool
from tilecraft.engine.search.actions import get_kernel_actions, opt_wire, opts_from_key, opts_key, signature
from tilecraft.engine.search.db import SearchDB, get_db, machine_kind
from tilecraft.engine.search.keys import (SEARCH_VERSION, codegen_identity, compiler_identity, renderer_identity, replayable, result_key,  # noqa: F401
                                         search_var_vals)
from tilecraft.engine.search.worker import HANDLER
from tilecraft.helpers import DEBUG, getenv, prod
from tilecraft.ops import BufferOps, MemBuffer

# A search's default wall-clock budget (budget_s=None): new rounds stop after it, then the verification and
# the two races against the hand-coded kernel finish (5-15 s on 2 busy cores: a 1x1 conv's search took
# 65 s with a 50 s budget at load 6), so a kernel's search stays under ~60 s on 2 cores.
# budget_s=math.inf searches until patience or max_rounds end it.
DEFAULT_BUDGET_S = 40.0
VERIFY_FRONT = 64  # elements of guard zone before each buffer when verifying (see _Search.verify)

# Failure injection for tests: called with a candidate's opts (tuple of Opt) before it is timed;
# "segfault" makes the timing worker kill itself with SIGSEGV, "hang" makes it sleep past the
# timeout, "error" makes it raise. The parent consults it and ships the verdict with the job,
# because the worker is a fresh interpreter that can't see this process's module state.
_test_hook: Optional[Callable[[tuple], Optional[str]]] = None

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
  def key(self) -> str: return opts_key(self.opts)
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

def _effective_budget(budget_s: Optional[float]) -> Optional[float]:
  """beam_search's budget_s as the search uses it: None -> DEFAULT_BUDGET_S, math.inf -> None (no budget)."""
  return DEFAULT_BUDGET_S if budget_s is None else (None if budget_s == math.inf else budget_s)

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
    self.budget_s = _effective_budget(budget_s)
    self.timeout_s, self.build_timeout_s = timeout_s, build_timeout_s
    self.runs, self.max_rounds, self.early_stop = runs, max_rounds, early_stop
    self.max_upcast, self.max_lanes, self.max_threads, self.max_uops = max_upcast, max_lanes, max_threads, max_uops
    self.verify_on, self.min_gain, self.patience = verify, min_gain, patience
    self.n_workers = workers or int(getenv("BEAM_WORKERS", 0)) or min(os.cpu_count() or 1, 8)
    self.vv = search_var_vals(kernel, var_vals)
    self.specs = _buffer_specs(kernel, bufs)
    self.n_out = len(kernel.outbufs)
    self.outs_read = any(x.op is BufferOps.LOAD and isinstance(x.arg, MemBuffer) and 0 <= x.arg.idx < self.n_out for x in kernel.ast.lazyops)
    self.name = kernel.name
    self.ast_hex = kernel.ast.key.hex()
    self.start_opts = tuple(kernel.applied_opts)
    self.ren_id, self.comp_id = renderer_identity(self.ren), compiler_identity(self.dev.compiler)
    self.result_key = result_key(kernel, amt, allow_test_size, self.vv, max_upcast, max_lanes, max_threads, max_uops, patience, max_rounds)
    self.timing_ctx = hashlib.sha256(json.dumps([SEARCH_VERSION, codegen_identity(), self.device, self.ren_id, self.comp_id, bool(allow_test_size),
                                                 sorted(self.vv.items())]).encode()).hexdigest()[:32]
    self.db = get_db() if use_cache else None
    self.report = SearchReport(name=self.name, device=self.device)
    self.cands: dict[str, Candidate] = {}
    self.by_src: dict[str, Candidate] = {}
    self.by_lib: dict[bytes, Candidate] = {}
    self.seen_sigs: set = set()
    self.best_time = math.inf
    self.ref: Optional[Candidate] = None  # the kernel each candidate is timed alongside
    self.progress = sys.stderr.isatty() if progress is None else progress
    self.bar: Any = None
    self.pool: Optional[Pool] = None
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
    sig = signature(k)
    if sig in self.seen_sigs: return None
    self.seen_sigs.add(sig)
    c = Candidate(tuple(k.applied_opts), k)
    if c.key in self.cands: return None
    self.cands[c.key] = c
    return c

  # -- building and timing --
  def build(self, cands: list[Candidate], must: bool = False) -> None:
    """Render and compile in parallel. A candidate with the same source or binary as an earlier one is
    marked `dup` (it keeps the program, but is never timed again). `must` (the seeds, the reference, a
    contender timed from the cache): built whatever the budget and whatever its size (no max_uops cap:
    the hand-coded floor of a big conv can be over it, and a floor that isn't built leaves the
    unoptimized kernel as the floor)."""
    if not cands: return
    blobs = self._blobs()
    ast_id, ren_id = list(blobs)
    max_uops = 0 if must else self.max_uops
    jobs = [Job("build", (ast_id, ren_id, self.ast_hex, self.device, [opt_wire(o) for o in c.opts], self.name, self.vv, max_uops, True),
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
      job = Job("time", (self.device, prog, self.specs, self.runs, early, directive, self.timeout_s + 30,
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
      c.status = "early" if len(times) < max(1, self.runs) else "ok"  # the worker stops short only past early_stop_s
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

  def timer_run(self, job: Job) -> Optional[tuple]:
    """Run one job on the timing worker (worker 0), setting up its buffers first if it is new."""
    assert self.pool is not None
    t0 = time.perf_counter()
    try:
      key = (self.device, tuple(self.specs))
      if not self.pool.workers or not self.pool.workers[0].alive() or self.pool.workers[0].prepared != key:
        prep = self.pool.run([Job("prepare", (self.device, self.specs), max(60.0, self.timeout_s))], 1)[0]
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
    self.pool = get_pool(HANDLER)
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
    if not replayable(row, self.budget_s): return None
    opts = opts_from_key(opts_s)
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
    self.seen_sigs.add(signature(self.kernel))
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

  def verify(self, ref: Candidate, cands: list[Candidate]) -> Optional[tuple]:
    """Check cands against the reference (the unoptimized kernel) on random data: ("ok", [(ok, max
    error, note)] per candidate), else the failed job's (status, message). Twice: the binaries as
    built, then the same kernels built with every buffer access VERIFY_FRONT elements in, so each
    buffer has a guard zone before its data too and a read or write before index 0 shows up."""
    if not self.ensure_built(ref): return ("error", "the reference didn't build")
    def job(progs: list, front: int) -> Job:
      return Job("verify", (self.device, progs[0], progs[1:], self.specs, self.n_out, self.outs_read, 1234, 64, front), max(120.0, 10 * self.timeout_s))
    res = self.timer_run(job([ref.prog] + [c.prog for c in cands], 0))
    if res is None or res[0] != "ok": return res
    assert self.pool is not None
    blobs = self._blobs()
    ast_id, ren_id = list(blobs)
    builds = self.pool.run([Job("build", (ast_id, ren_id, self.ast_hex, self.device, [opt_wire(o) for o in c.opts], self.name, self.vv, 0, True,
                                          VERIFY_FRONT), self.build_timeout_s, blobs) for c in [ref] + cands], self.n_workers)
    progs = [(self.name, b[1]["lib"], b[1]["gs"], b[1]["ls"], b[1]["vals"]) if b is not None and b[0] == "ok" else None for b in builds]
    if progs[0] is None: return ("error", f"the reference didn't build with a front guard: {builds[0]}")
    built = [i for i, p in enumerate(progs[1:]) if p is not None]
    res2 = self.timer_run(job([progs[0]] + [progs[1 + i] for i in built], VERIFY_FRONT))
    if res2 is None or res2[0] != "ok": return res2
    out = [(False, math.inf, f"didn't build with a front guard: {builds[1 + i]}") for i in range(len(cands))]
    for i, (ok2, err2, note2) in zip(built, res2[1]):
      ok, err, note = res[1][i]
      out[i] = (ok and ok2, max(err, err2), "; ".join(n for n in (note, note2 and f"with a front guard: {note2}") if n))
    return ("ok", out)

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
      res = self.verify(ref, contenders)
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
      # twice, the second with the order swapped: the winner must beat the floor by min_gain in both
      # (a burst of load during one race, or running second, can't hand back a slower kernel)
      floor_t = win_t = math.inf
      for order in ((floor, winner), (winner, floor)):
        res = self.timer_run(Job("race", (self.device, [c.prog for c in order], self.specs, max(5, self.runs)), max(30.0, 4 * self.timeout_s)))
        if res is None or res[0] != "ok":
          self.fail(winner, res[0] if res else "budget", res[1] if res else "")
          win_t = math.inf
          break
        f_t, w_t = res[1] if order[0] is floor else res[1][::-1]
        floor_t, win_t = min(floor_t, f_t), min(win_t, w_t)
        if w_t >= f_t * (1 - self.min_gain):
          win_t = math.inf
          break
      if math.isfinite(floor_t):
        if floor is hand: r.hand_time = floor_t
        if math.isfinite(win_t): chosen, chose, r.final_time = winner, "beam", win_t
        else: r.final_time = floor_t
    elif winner is not None: chosen, chose = winner, "beam"
    if not math.isfinite(r.final_time): r.final_time = chosen.time
    r.chose = chose
    if chose == "hand" and hand is not base: k = self.kernel.copy().hand_coded_optimizations()
    else:
      k = self.kernel.copy()
      for o in chosen.opts[len(self.start_opts):]: k.apply_opt(o, reason="beam search")
    r.opts = tuple(k.applied_opts)
    if floor is None: warnings.warn(f"search: neither the hand-coded nor the unoptimized {self.name} could be timed (hand-coded: {hand.status}: {hand.msg}; unoptimized: {base.status}: {base.msg})", RuntimeWarning, stacklevel=4)
    if self.db is not None:
      info = json.dumps({"name": self.name, "rounds": r.rounds, "built": r.built, "timed": r.timed})
      self.db.put_result(self.result_key, opts_key(k.applied_opts), chose, r.final_time, r.hand_time, r.complete, self.budget_s, info,
                         kind=machine_kind(self.device))
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
  budget_s: wall-clock budget for the rounds (default DEFAULT_BUDGET_S, math.inf for none); when spent, the
    best kernel so far is verified, raced against the hand-coded one and returned.
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

_KEY_SETTINGS = ("allow_test_size", "max_upcast", "max_lanes", "max_threads", "max_uops", "patience", "max_rounds")

def cached_result(kernel: Kernel, amt: int = 2, *, budget_s: Optional[float] = None, var_vals: Optional[dict] = None,
                  db: Optional[SearchDB] = None, **settings: Any) -> Optional[tuple]:
  """The stored result `beam_search(kernel, None, amt, budget_s=budget_s, var_vals=var_vals, **settings)`
  would replay, as db.get_result's row (opts, chose, time, hand_time, complete, budget), else None. A
  lookup by key in `db` (default: this process's search cache): nothing is built, timed or started, so a
  driver can skip kernels already tuned without sending them to a worker. (A stored result whose opts no
  longer apply is searched again by beam_search, which this lookup can't tell.) `settings`: beam_search's
  arguments that are part of the key (_KEY_SETTINGS), at beam_search's defaults when not given."""
  params = inspect.signature(beam_search).parameters
  if (unknown := sorted(set(settings) - set(_KEY_SETTINGS))):
    raise TypeError(f"cached_result: {unknown} are not search settings that decide the cache key ({', '.join(_KEY_SETTINGS)})")
  s = {n: settings.get(n, params[n].default) for n in _KEY_SETTINGS}
  if db is None and (db := get_db()) is None: return None
  row = db.get_result(result_key(kernel, amt, s["allow_test_size"], search_var_vals(kernel, var_vals), s["max_upcast"], s["max_lanes"],
                                 s["max_threads"], s["max_uops"], s["patience"], s["max_rounds"]))
  return row if row is not None and replayable(row, _effective_budget(budget_s)) else None

def close_workers() -> None:
  """Stop the search's worker processes (they are also stopped at exit)."""
  close_pool(HANDLER)
