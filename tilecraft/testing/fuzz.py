"""Differential opt fuzzing (docs/architecture.md, "How correctness is checked").

For a kernel AST, random valid sequences of Opts must give the same output as the unoptimized
kernel (and as a numpy reference). An Opt must either be refused with KernelOptError or give the
same result: any other exception while applying, rendering, compiling or running is a failure.
Every buffer gets guard zones before and after its data. Output buffers are filled with a sentinel
that must survive everywhere the stores don't cover, and the kernel runs once per sentinel fill so an
element it should write but skips is caught whatever its right value; input buffers get poisoned
guard zones (NaN / extreme values) so out-of-bounds reads show up as mismatches, and must not change
(see tilecraft.engine.verify).

  run_ast(ast, inputs, opts, device, var_vals, guard) -> outputs
  random_opts(kernel, rng, max_opts) -> OptSequence (tilecraft/testing/opt_sampler.py)
  fuzz_ast(entry, rng, n, device) -> FuzzReport (first failure shrunk to a minimal opt list)
  fuzz_corpus(device, n_per_kernel, seed) -> dict[name, FuzzReport]
  fuzz_recorded(path, device, n, seed) -> dict[name, FuzzReport]: the kernels real models ran (a process-replay
    DB: `tilecraft replay record --models ...`), each with the opts it was recorded with, then random ones
  (the launch property of accepted opt lists on the emulated GPU targets: testing/launch_check.py)

`tilecraft fuzz --device CPU --n 20` (tilecraft/cli/fuzz.py) fuzzes the corpus from the command line.
"""
from __future__ import annotations
import collections, functools, hashlib, pickle, re, sqlite3, time, traceback, zlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence
import numpy as np
from tilecraft.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tilecraft.device import Buffer, CompiledRunner, Device
from tilecraft.dtype import DType, ImageDType, bf16_bits_from_f32, dtypes
from tilecraft.helpers import TC, Context, prod
from tilecraft.engine.isolation import Job, Pool
from tilecraft.engine.verify import SENTINELS, compare, filled, poison, raw_bytes, shift_ast, shift_st, tolerance  # noqa: F401
from tilecraft.testing.corpus import CorpusEntry, corpus, image_corpus, rand
from tilecraft.testing.opt_sampler import OptSequence, random_opts
from tilecraft.ops import BufferOps, LazyOp, MemBuffer
from tilecraft.renderer import Program
from tilecraft.shape.shapetracker import ShapeTracker
from tilecraft.shape.symbolic import Node, sym_eval

class GuardZoneError(RuntimeError):
  """A kernel touched what it must not (written past the end of an output, before its start, into an
  element its stores don't cover, or into an input buffer), or left an element its stores cover
  unwritten (what="unwritten")."""
  def __init__(self, buf_idx: int, positions: np.ndarray, size: int, what: str = "output", front: int = 0):
    self.buf_idx, self.positions, self.size = buf_idx, positions, size
    pos = (positions[:8] - front).tolist()
    if what == "unwritten":
      msg = (f"output buffer {buf_idx}: {len(positions)} element(s) its stores cover were never written (they kept the "
             f"sentinel fill; first positions {pos})")
    else:
      where = "past the end" if positions.min() >= size else "before the start" if positions.max() < front else "inside the buffer"
      msg = (f"{what} buffer {buf_idx}: {len(positions)} element(s) that must stay untouched were written ({where}; first "
             f"positions {pos}; the kernel's extent is {size - front} elements)")
    super().__init__(msg)
  @staticmethod
  def from_message(msg: str) -> "GuardZoneError":
    e = GuardZoneError.__new__(GuardZoneError)
    RuntimeError.__init__(e, msg)
    e.buf_idx, e.positions, e.size = -1, np.zeros(0, dtype=np.int64), 0
    return e
  def __reduce__(self) -> tuple: return (GuardZoneError.from_message, (str(self),))

FRONT_GUARD = 64  # elements of guard zone before every buffer's data (see run_program)

# ---- ShapeTracker evaluation in numpy ------------------------------------------------------------

def _ev(x: Any, var_vals: dict) -> int: return int(sym_eval(x, var_vals)) if isinstance(x, Node) else int(x)

def st_indices(st: ShapeTracker, var_vals: Optional[dict] = None) -> tuple[np.ndarray, np.ndarray]:
  """(memory index, valid) of every element of `st`, as int64/bool arrays of st's (concrete) shape."""
  vv = var_vals or {}
  view = st.views[-1]
  shape = tuple(_ev(s, vv) for s in view.shape)
  idx, valid = _view_indices(view, shape, vv, None)
  for v in reversed(st.views[:-1]):
    vshape = tuple(_ev(s, vv) for s in v.shape)
    # unravel the flat index into the earlier view's shape (floor semantics, like expr_idxs)
    sub, acc = [], 1
    for s in reversed(vshape):
      sub.append(np.zeros_like(idx) if s == 1 else (idx // acc) % s)
      acc *= s
    idx, v2 = _view_indices(v, vshape, vv, tuple(reversed(sub)))
    valid = valid & v2
  return idx, valid

def _view_indices(view: Any, shape: tuple[int, ...], vv: dict, idxs: Optional[tuple[np.ndarray, ...]]) -> tuple[np.ndarray, np.ndarray]:
  if idxs is None:
    idxs = tuple(np.arange(s).reshape([-1 if i == d else 1 for i in range(len(shape))]) for d, s in enumerate(shape))
    out_shape = shape
  else: out_shape = np.broadcast_shapes(*[i.shape for i in idxs]) if idxs else ()
  idx = np.full(out_shape, _ev(view.offset, vv), dtype=np.int64)
  valid = np.ones(idx.shape, dtype=np.bool_)
  for d, (i, stv) in enumerate(zip(idxs, view.strides)):
    stv = _ev(stv, vv)
    if stv: idx = idx + i.astype(np.int64) * stv
    if view.mask is not None:
      b, e = _ev(view.mask[d][0], vv), _ev(view.mask[d][1], vv)
      if b != 0 or e != shape[d]: valid = valid & (i >= b) & (i < e)
  return idx, valid

# ---- buffers -------------------------------------------------------------------------------------

def buffer_views(ast: LazyOp) -> dict[int, list[MemBuffer]]:
  """Every MemBuffer (one per distinct view) of each global buffer index in the AST."""
  out: dict[int, list[MemBuffer]] = collections.defaultdict(list)
  for x in ast.lazyops:
    if x.op in (BufferOps.LOAD, BufferOps.STORE) and isinstance(x.arg, MemBuffer) and x.arg.idx >= 0 and x.arg not in out[x.arg.idx]:
      out[x.arg.idx].append(x.arg)
  return dict(sorted(out.items()))

def buffer_size(views: list[MemBuffer]) -> int:
  """Elements a buffer needs: the most any of its views touches (at the Variables' maxima)."""
  return max(mb.st.real_size() for mb in views)

def _as_input_array(arr: np.ndarray, dtype: DType) -> np.ndarray:
  arr = np.ascontiguousarray(arr).reshape(-1)
  if dtype.scalar() == dtypes.bfloat16:
    if arr.dtype == np.uint16: return arr
    return np.asarray(bf16_bits_from_f32(arr.astype(np.float32)))
  assert dtype.np is not None
  if arr.dtype != dtype.np: raise TypeError(f"input for a {dtype.name} buffer has numpy dtype {arr.dtype}")
  return arr

# ---- programs (cached: rendering and compiling dominate the fuzzer's time) -----------------------

@dataclass
class CacheStats:
  programs: int = 0        # Kernel -> Program renders
  program_hits: int = 0
  compiles: int = 0        # CompiledRunner constructions (a disk-cache hit still counts: it loads a binary)
  runner_hits: int = 0

_program_cache: "collections.OrderedDict[tuple, Program]" = collections.OrderedDict()
_runner_cache: "collections.OrderedDict[tuple, CompiledRunner]" = collections.OrderedDict()
cache_stats = CacheStats()
_CACHE_MAX = 512  # programs keep their uops: bound the memory

def _lru_put(cache: collections.OrderedDict, key: tuple, val: Any) -> None:
  cache[key] = val
  if len(cache) > _CACHE_MAX: cache.popitem(last=False)

def stable_name(k: Kernel) -> str:
  """A kernel name that is the same in every process (Kernel.name numbers same-shaped kernels in
  the order a process sees them, which would make the compiled-binary disk cache miss)."""
  return f"{re.sub(r'n[0-9]+$', '', k.name)}_{k.ast.key.hex()[:10]}"

def build_kernel(ast: LazyOp, opts: Sequence[Opt], device: str = "CPU") -> Kernel:
  k = Kernel(ast, opts=Device[device].renderer)
  for o in opts: k.apply_opt(o)
  return k

def has_images(ast: LazyOp) -> bool:
  """Whether a kernel reads or writes an image buffer. Images get no guard zones: an image is exactly
  its (height, width, 4) texels, and a texel outside it is never touched (reads give 0, writes are
  to computed coordinates inside it); the sentinel fills still catch stray and missing writes."""
  return any(isinstance(x.arg, MemBuffer) and isinstance(x.arg.dtype, ImageDType) for x in ast.lazyops if x.op in (BufferOps.LOAD, BufferOps.STORE))

def required_opts(ast: LazyOp, device: str) -> list[Opt]:
  """The opts a kernel can't run without (image outputs write whole texels): the fuzzer's unoptimized kernel."""
  if not has_images(ast): return []
  return list(Kernel(ast, opts=Device[device].renderer).required_optimizations().applied_opts)

def find_entry(name: str, small: bool = True) -> CorpusEntry:
  """A corpus entry by name, image kernels included."""
  return corpus(small)[name] if name in corpus(small) else image_corpus()[name]

def entry_from(name: str, small: bool, origin: Optional[tuple]) -> CorpusEntry:
  """The entry a worker process runs: a corpus entry by name, or where `origin` says (a recorded kernel)."""
  if origin is None: return find_entry(name, small)
  kind, *args = origin
  assert kind == "recorded", origin
  return recorded_entry(*args)[0]

def guarded(ast: LazyOp, front: int = FRONT_GUARD) -> LazyOp:
  """The AST the fuzzer compiles: ast with every global buffer access `front` elements in, so a
  front guard zone sits before each buffer's data (engine/verify.py); image kernels as they are."""
  return ast if has_images(ast) else shift_ast(ast, front)

def get_program(ast: LazyOp, opts: Sequence[Opt] = (), device: str = "CPU", kernel: Optional[Kernel] = None,
                front: int = 0) -> Program:
  """The rendered program of `ast` with `opts`, addressing its buffers `front` elements in (run it
  with run_program and the same `front`; the fuzzer's checks use FRONT_GUARD); cached by AST key,
  opts, device, front, the device's current renderer (the PYTHON device's follows EMULATE) and the
  settings it renders by (CPU_ARCH, ...), and the
  TC use. `kernel`: the same opts already applied to guarded(ast, front) (rebuilt, with its TC use,
  when it was built from another AST)."""
  # a TC opt builds the kernel the TC setting says (use 1, 2 or 3)
  tc_use = (kernel.use_tensor_cores if kernel is not None else int(TC)) if any(o.op is OptOps.TC for o in opts) else 0
  ren = Device[device].renderer if kernel is None else kernel.opts
  key = (ast.key, tuple(opts), device, front, ren, ren.settings_key(), tc_use)
  if (p := _program_cache.get(key)) is not None:
    cache_stats.program_hits += 1
    return p
  g = guarded(ast, front)
  if kernel is not None and kernel.ast.key == g.key: k = kernel
  else:
    with Context(TC=tc_use) if tc_use else Context(): k = build_kernel(g, opts, device)
  p = k.to_program(name_override=stable_name(k))
  cache_stats.programs += 1
  _lru_put(_program_cache, key, p)
  return p

def _runner_key(p: Program) -> tuple:
  return (p.device, p.name, p.src, Device[p.device].compiler.flags)  # the same source built for another CPU_ARCH is another binary

def get_runner(p: Program) -> CompiledRunner:
  key = _runner_key(p)
  if (r := _runner_cache.get(key)) is not None:
    cache_stats.runner_hits += 1
    return r
  r = CompiledRunner(p)
  cache_stats.compiles += 1
  _lru_put(_runner_cache, key, r)
  return r

PREBUILD_CHUNK = 32  # kernels per compiler run: big enough to pay a compiler start once, small enough to retry cheaply

def prebuild(items: Sequence[tuple[LazyOp, Sequence[Opt]]], device: str = "CPU", kernels: Optional[Sequence[Optional[Kernel]]] = None,
             front: int = FRONT_GUARD) -> int:
  """Compile the programs of the (ast, opts) `items` (the fuzzer is about to run them; `kernels`: the
  same opts already applied, where known) in batches, one compiler run per PREBUILD_CHUNK kernels
  (Compiler.compile_batch), and keep a runner for each, so get_runner finds them: a C compiler or PoCL
  pays its start-up once per batch instead of once per kernel. Devices whose compiler can't batch,
  opt lists that are refused, and batches that fail to compile are left alone (get_runner then
  compiles each kernel by itself, and reports its errors). Returns how many runners it made."""
  comp = Device[device].compiler
  if not comp.batch_renames: return 0
  todo: dict[tuple, Program] = {}
  for i, (ast, opts) in enumerate(items):
    try: p = get_program(ast, opts, device, kernel=kernels[i] if kernels is not None else None, front=front)
    except Exception: continue  # noqa: BLE001 -- (running it reports the error)
    if (key := _runner_key(p)) not in _runner_cache: todo.setdefault(key, p)
  made = 0
  built = comp.build_many([(p.src, p.name) for p in todo.values()], PREBUILD_CHUNK, singles=False)
  for (key, p), b in zip(todo.items(), built):
    if b is None: continue  # (a batch that failed to build: each of its kernels is compiled alone when it runs)
    try: r = CompiledRunner(p, precompiled=b[0], symbol=b[1])
    except Exception: continue  # noqa: BLE001 -- (as above)
    _lru_put(_runner_cache, key, r)
    made += 1
  cache_stats.compiles += made
  return made

# ---- running -------------------------------------------------------------------------------------

def run_program(ast: LazyOp, p: Program, inputs: dict[int, np.ndarray], device: str = "CPU",
                var_vals: Optional[dict] = None, guard: int = 64, front: int = 0) -> list[np.ndarray]:
  """Run a rendered program of `ast` (built for the same `front`: get_program(..., front=front), or
  any program of `ast` itself for front=0) on fresh buffers laid out [front guard of `front`
  elements | data | back guard of `guard` elements]; return each output in its
  STORE's shape. It runs once per sentinel fill of the outputs (engine/verify.py): an output element
  the stores cover that holds different values after the two runs was never written. Raises
  GuardZoneError on writes outside what the stores cover (guards included), on a changed input, or
  on an unwritten element."""
  var_vals = dict(var_vals or {})
  if has_images(ast): front, guard = 0, 0
  views = buffer_views(guarded(ast, front))
  n_out = len(ast.src)
  missing = [i for i in p.globals if i >= n_out and i not in inputs]
  if missing: raise ValueError(f"no input array for buffer(s) {missing}")
  bufs: dict[int, Buffer] = {}
  sizes: dict[int, int] = {}
  expected_inputs: dict[int, np.ndarray] = {}
  for i in p.globals:
    dt, need = views[i][0].dtype, buffer_size(views[i])  # need includes the front guard
    if isinstance(dt, ImageDType): need = prod(dt.shape)
    if i < n_out:
      sizes[i] = need
      bufs[i] = Buffer(device, need + guard, dt).allocate()
    else:
      arr = _as_input_array(inputs[i], dt)
      if arr.size < need - front: raise ValueError(f"input {i} has {arr.size} elements, its views touch {need - front}")
      pz = poison(dt, max(front, guard)).astype(arr.dtype)
      full = np.concatenate([pz[:front], arr, pz[:guard]])
      sizes[i] = front + arr.size
      bufs[i] = Buffer(device, full.size, dt).allocate().copyin(full)
      expected_inputs[i] = full
  runner = get_runner(p)
  written: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
  for i, st_op in enumerate(ast.src):
    idx, valid = st_indices(shift_st(st_op.arg.st, front), var_vals)
    mask = np.zeros(bufs[i].size, dtype=np.bool_)
    mask[idx[valid]] = True
    written[i] = (idx, valid, mask)
  runs: list[dict[int, np.ndarray]] = []
  for fill in SENTINELS:
    for i in range(n_out): bufs[i].copyin(filled(bufs[i].dtype, bufs[i].size, fill))
    runner([bufs[i] for i in p.globals], var_vals)
    # inputs must be unchanged (compare bytes: NaN poison compares equal to itself there)
    for i, want in expected_inputs.items():
      dt = bufs[i].dtype
      raw_want = want.view(np.uint8).reshape(-1, dt.itemsize)
      if (bad := np.nonzero((raw_bytes(bufs[i].numpy(), dt) != raw_want).any(axis=1))[0]).size:
        raise GuardZoneError(i, bad, sizes[i], what="input", front=front)
    raw_outs = {}
    for i in range(n_out):
      raw = raw_bytes(bufs[i].numpy(), bufs[i].dtype)
      untouched = (raw == fill).all(axis=1)
      if (bad := np.nonzero(~written[i][2] & ~untouched)[0]).size: raise GuardZoneError(i, bad, sizes[i], front=front)
      raw_outs[i] = raw
    runs.append(raw_outs)
  outs = []
  for i in range(n_out):
    idx, valid, mask = written[i]
    if (bad := np.nonzero(mask & (runs[0][i] != runs[1][i]).any(axis=1))[0]).size:
      raise GuardZoneError(i, bad, sizes[i], what="unwritten", front=front)
    data = bufs[i].numpy()
    out = np.zeros(idx.shape, dtype=data.dtype)
    out[valid] = data[idx[valid]]
    outs.append(out)
  return outs

def run_ast(ast: LazyOp, inputs: dict[int, np.ndarray], opts: Sequence[Opt] = (), device: str = "CPU",
            var_vals: Optional[dict] = None, guard: int = 64, front: int = FRONT_GUARD) -> list[np.ndarray]:
  """Build, optimize (opts), render, compile (cached) and run `ast` on `device` with guard zones on
  both sides of every buffer; return the outputs, each in its STORE's shape at var_vals. Raises
  GuardZoneError on writes outside the outputs or elements left unwritten."""
  return run_program(ast, get_program(ast, opts, device, front=front), inputs, device, var_vals, guard, front)

# ---- isolation: run kernels in a worker process, so a kernel that corrupts memory is a failure ----

class KernelCrash(RuntimeError):
  """The worker process running a kernel died (a segfault or heap corruption in the kernel)."""

def _iso_run(name: str, small: bool, origin: Optional[tuple], opts: list, device: str, vv_index: int, guard: int, inputs: dict) -> tuple[str, Any]:
  """Worker side: run corpus entry `name` (rebuilt here, or from `origin`: ASTs don't travel between processes)."""
  try:
    e = entry_from(name, small, origin)
    p = get_program(e.ast, opts, device, front=FRONT_GUARD)
    outs = run_program(e.ast, p, inputs, device, e.var_vals[vv_index], guard, FRONT_GUARD)
    return "ok", (outs, _src_hash(p.src), (cache_stats.programs, cache_stats.compiles))
  except GuardZoneError as ex: return "guard", str(ex)
  except KernelOptError as ex: return "refused", str(ex)
  except Exception as ex:  # noqa: BLE001
    return "error", f"{type(ex).__name__}: {ex}\n{traceback.format_exc(limit=8)}"

def _opts_from_wire(opts: list) -> list[Opt]: return [Opt(OptOps[o], a, m) for o, a, m in opts]
def _opts_to_wire(opts: Sequence[Opt]) -> list: return [(o.op.name, o.axis, o.amt) for o in opts]

class FuzzWorker:
  """The fuzzer's job in a worker process (see tilecraft.engine.isolation): run one corpus entry, or
  build a corpus entry's kernels ahead in batches (prebuild)."""
  def run(self, name: str, small: bool, origin: Optional[tuple], opts: list, device: str, vv_index: int, guard: int, inputs: dict) -> tuple[str, Any]:
    return _iso_run(name, small, origin, _opts_from_wire(opts), device, vv_index, guard, inputs)
  def prebuild(self, name: str, small: bool, origin: Optional[tuple], opt_lists: list, device: str) -> tuple[str, Any]:
    ast = entry_from(name, small, origin).ast
    return "ok", prebuild([(ast, _opts_from_wire(o)) for o in opt_lists], device)

class IsolatedRunner:
  """Runs corpus kernels in one long-lived worker process (tilecraft.engine.isolation; its program
  cache persists between calls). If the worker dies or hangs, the call raises KernelCrash and the
  next call starts a fresh worker."""
  def __init__(self, small: bool = True, timeout: float = 300.0):
    self.small, self.timeout = small, timeout
    self.pool = Pool("tilecraft.testing.fuzz:FuzzWorker")
    self.last_src = ""
    self.worker_stats = (0, 0)  # (programs rendered, runners compiled) by the current worker so far
  def run(self, entry: CorpusEntry, opts: Sequence[Opt], inputs: dict[int, np.ndarray], device: str, vv_index: int,
          guard: int = 64) -> list[np.ndarray]:
    args = (entry.name, self.small, entry.origin, _opts_to_wire(opts), device, vv_index, guard, inputs)
    kind, res = self.pool.run([Job("run", args, self.timeout)], 1)[0] or ("crash", "not run")
    if kind in ("crash", "hang"):
      why = (f"hung: {res} (rendering, compiling or running it is that slow)" if kind == "hang"
             else f"died ({res}): the kernel likely wrote out of bounds")
      raise KernelCrash(f"the worker running {entry.name} with {list(opts)} {why}")
    if kind == "ok":
      self.last_src, self.worker_stats = res[1], res[2]
      return res[0]
    if kind == "guard": raise GuardZoneError.from_message(res)
    if kind == "refused": raise KernelOptError(res)
    raise RuntimeError(res)
  def prebuild(self, entry: CorpusEntry, opt_lists: Sequence[Sequence[Opt]], device: str) -> int:
    """fuzz.prebuild in the worker (how many runners it made; 0 when the worker died doing it: the
    kernels are then built one by one as they run)."""
    args = (entry.name, self.small, entry.origin, [_opts_to_wire(o) for o in opt_lists], device)
    kind, res = self.pool.run([Job("prebuild", args, self.timeout)], 1)[0] or ("crash", "not run")
    return res if kind == "ok" else 0
  def close(self) -> None: self.pool.close()
  def __enter__(self) -> "IsolatedRunner": return self
  def __exit__(self, *a: Any) -> None: self.close()

# ---- comparing -----------------------------------------------------------------------------------

def compare_outputs(got: list[np.ndarray], want: list[np.ndarray], ast: LazyOp, rtol: Optional[float] = None,
                    atol: Optional[float] = None, atol_scaled: bool = False) -> Optional[str]:
  """None where every output matches, else the first mismatch. `atol_scaled`: atol is a fraction of each wanted
  output's largest finite |value| (CorpusEntry.atol_scaled)."""
  if len(got) != len(want): return f"{len(got)} outputs, want {len(want)}"
  for i, (g, w) in enumerate(zip(got, want)):
    scale = 1.0
    if atol_scaled and (fin := np.abs(w64 := np.asarray(w, np.float64))[np.isfinite(w64)]).size: scale = max(float(fin.max()), 1e-30)
    if (msg := compare(g, w, ast.src[i].arg.dtype, rtol, atol, scale)) is not None: return f"output {i}: {msg}"
  return None

# ---- fuzzing -------------------------------------------------------------------------------------

@dataclass
class FuzzFailure:
  name: str
  opts: list[Opt]
  kind: str              # mismatch | reference | exception | guard | invariant
  message: str
  var_vals: dict = field(default_factory=dict)
  minimal_opts: Optional[list[Opt]] = None
  def __str__(self) -> str:
    vv = f" var_vals={ {getattr(k, 'expr', k): v for k, v in self.var_vals.items()} }" if self.var_vals else ""
    mini = f"\n  minimal opts: {self.minimal_opts}" if self.minimal_opts is not None else ""
    return f"[{self.kind}] {self.name} opts={self.opts}{vv}{mini}\n  {self.message}"

@dataclass
class FuzzReport:
  pairs: int = 0          # distinct (kernel, non-empty opt sequence) pairs checked
  runs: int = 0           # kernel executions (pairs x var_vals, plus the baselines)
  refusals: int = 0       # candidate opts refused with KernelOptError
  programs: int = 0       # distinct program sources
  failures: list[FuzzFailure] = field(default_factory=list)
  seconds: float = 0.0
  @property
  def ok(self) -> bool: return not self.failures
  @property
  def first_failure(self) -> Optional[FuzzFailure]: return self.failures[0] if self.failures else None
  def merge(self, other: "FuzzReport") -> "FuzzReport":
    return FuzzReport(self.pairs + other.pairs, self.runs + other.runs, self.refusals + other.refusals, self.programs + other.programs,
                      self.failures + other.failures, self.seconds + other.seconds)
  def summary(self) -> str:
    s = f"{self.pairs} pairs, {self.programs} programs, {self.runs} runs, {self.refusals} refusals, {len(self.failures)} failures, {self.seconds:.1f}s"
    return s + (f"\nfirst failure: {self.first_failure}" if self.failures else "")

def _seeded(*parts: Any) -> np.random.Generator:
  return np.random.default_rng(zlib.crc32("|".join(map(str, parts)).encode()))

def entry_inputs(entry: CorpusEntry, seed: int = 0) -> dict[int, np.ndarray]:
  """The entry's inputs from a generator seeded by (seed, entry name): the same in every process."""
  return entry.make_inputs(_seeded(seed, entry.name, "inputs"))

def _src_hash(src: str) -> str: return hashlib.sha256(src.encode()).hexdigest()[:16]

class _Checker:
  """Runs one corpus entry with opt lists (in process, or in an IsolatedRunner) and compares."""
  def __init__(self, entry: CorpusEntry, inputs: dict[int, np.ndarray], device: str, guard: int, isolated: Optional[IsolatedRunner]):
    self.entry, self.inputs, self.device, self.guard, self.isolated = entry, inputs, device, guard, isolated
    self.baseline: dict[int, list[np.ndarray]] = {}
    self.srcs: set[str] = set()
    self.base = required_opts(entry.ast, device)  # the unoptimized kernel's opts
  def _fail(self, opts: list[Opt], kind: str, msg: str, vi: int = 0) -> FuzzFailure:
    return FuzzFailure(self.entry.name, opts, kind, msg, dict(self.entry.var_vals[vi]) if self.entry.var_vals[vi] else {})
  def run(self, opts: list[Opt], vi: int, kernel: Optional[Kernel] = None) -> list[np.ndarray]:
    e = self.entry
    if self.isolated is not None:
      outs = self.isolated.run(e, opts, self.inputs, self.device, vi, self.guard)
      self.srcs.add(self.isolated.last_src)
      return outs
    p = get_program(e.ast, opts, self.device, kernel=kernel, front=FRONT_GUARD)
    self.srcs.add(_src_hash(p.src))
    return run_program(e.ast, p, self.inputs, self.device, e.var_vals[vi], self.guard, FRONT_GUARD)
  def check(self, opts: Sequence[Opt], kernel: Optional[Kernel] = None) -> Optional[FuzzFailure]:
    """The first failure of opts (over every var_vals), or None; a refused opt list is None."""
    opts, e = list(opts), self.entry
    if self.isolated is None and kernel is None:
      try: kernel = build_kernel(guarded(e.ast), opts, self.device)
      except KernelOptError: return None
      except Exception as ex:  # noqa: BLE001
        return self._fail(opts, "exception", f"apply_opt raised {type(ex).__name__}: {ex}\n{traceback.format_exc(limit=8)}")
    for vi, vv in enumerate(e.var_vals):
      try: got = self.run(opts, vi, kernel)
      except KernelOptError: return None
      except GuardZoneError as ex: return self._fail(opts, "guard", str(ex), vi)
      except KernelCrash as ex: return self._fail(opts, "crash", str(ex), vi)
      except Exception as ex:  # noqa: BLE001
        return self._fail(opts, "exception", f"{type(ex).__name__}: {str(ex)[:4000]}\n{traceback.format_exc(limit=8)}", vi)
      if opts != self.base:
        if vi not in self.baseline:
          try: self.baseline[vi] = self.run(self.base, vi)
          except Exception as ex:  # noqa: BLE001
            return self._fail([], "exception", f"the unoptimized kernel failed: {type(ex).__name__}: {str(ex)[:2000]}", vi)
        if (msg := compare_outputs(got, self.baseline[vi], e.ast, e.rtol, e.atol, e.atol_scaled)) is not None:
          return self._fail(opts, "mismatch", f"vs unoptimized: {msg}", vi)
      elif vi not in self.baseline: self.baseline[vi] = got
      if e.reference is None: continue
      with np.errstate(all="ignore"): want = e.reference(self.inputs, vv)
      if (msg := compare_outputs(got, want, e.ast, e.rtol, e.atol, e.atol_scaled)) is not None:
        return self._fail(opts, "reference", f"vs numpy: {msg}", vi)
    return None

def check_opts(entry: CorpusEntry, opts: Sequence[Opt], inputs: dict[int, np.ndarray], device: str = "CPU", guard: int = 64,
               isolated: Optional[IsolatedRunner] = None) -> Optional[FuzzFailure]:
  """Run entry with opts for every var_vals; compare with the unoptimized kernel and with numpy.
  The first failure, or None (also None when an opt is refused)."""
  return _Checker(entry, inputs, device, guard, isolated).check(opts)

def shrink(entry: CorpusEntry, opts: Sequence[Opt], device: str = "CPU", inputs: Optional[dict[int, np.ndarray]] = None,
           seed: int = 0, isolated: Optional[IsolatedRunner] = None) -> list[Opt]:
  """Remove opts one at a time while the failure persists: a minimal failing list (1-minimal:
  removing any single opt makes it pass or makes the sequence invalid). A failure that doesn't
  reproduce is returned unchanged."""
  if inputs is None: inputs = entry_inputs(entry, seed)
  checker = _Checker(entry, inputs, device, 64, isolated)
  def fails(o: list[Opt]) -> bool: return checker.check(o) is not None
  cur = list(opts)
  if not fails(cur): return cur
  changed = True
  while changed:
    changed = False
    for i in range(len(cur)):
      cand = cur[:i] + cur[i + 1:]
      if fails(cand):
        cur, changed = cand, True
        break
  return cur

def sample_opt_sequences(entry: CorpusEntry, rng: np.random.Generator, n: int, device: str = "CPU", max_opts: int = 4,
                         kernel: Optional[Kernel] = None, max_lanes: Optional[int] = 256) -> tuple[list[OptSequence], int, list[FuzzFailure]]:
  """Up to n distinct non-empty valid opt sequences for entry (apply_opt only, nothing is compiled);
  also the number of refused candidates and the failures found while applying opts."""
  k0 = kernel if kernel is not None else Kernel(guarded(entry.ast), opts=Device[device].renderer)
  seqs: list[OptSequence] = []
  fails: list[FuzzFailure] = []
  seen: set[tuple[Opt, ...]] = set()
  refusals, stale = 0, 0
  while len(seqs) < n and stale < 5 * n + 20:
    seq = random_opts(k0, rng, max_opts, max_lanes)
    refusals += seq.refusals
    key = tuple(seq) + ((seq.error[0],) if seq.error is not None else ())
    if not key or key in seen:
      stale += 1
      continue
    seen.add(key)
    if seq.error is not None:
      fails.append(FuzzFailure(entry.name, list(key), "exception" if " raised " in seq.error[1] else "invariant", seq.error[1]))
      continue
    seqs.append(seq)
  return seqs, refusals, fails

def fuzz_ast(entry: CorpusEntry, rng: np.random.Generator, n: int, device: str = "CPU", max_opts: int = 4,
             inputs: Optional[dict[int, np.ndarray]] = None, shrink_first: bool = True, max_failures: int = 20,
             isolated: Optional[IsolatedRunner] = None, guard: int = 64, max_lanes: Optional[int] = 256,
             first: Sequence[Opt] = ()) -> FuzzReport:
  """Check the unoptimized kernel against numpy, then the opt list `first` if any (a recorded kernel's own
  opts, fuzz_recorded), then up to `n` distinct random valid opt sequences against it (and numpy). Stops
  after max_failures failures; the first one is shrunk to a minimal failing opt list. `isolated` runs the
  kernels in a worker process (crashes become failures)."""
  st = time.perf_counter()
  rep = FuzzReport()
  if inputs is None: inputs = entry.make_inputs(rng)
  checker = _Checker(entry, inputs, device, guard, isolated)
  try: k0 = Kernel(guarded(entry.ast), opts=Device[device].renderer)
  except Exception as e:  # noqa: BLE001
    rep.failures.append(FuzzFailure(entry.name, [], "exception", f"Kernel() raised {type(e).__name__}: {e}"))
    rep.seconds = time.perf_counter() - st
    return rep
  seqs, refusals, apply_fails = sample_opt_sequences(entry, rng, n, device, max_opts, k0, max_lanes)
  firsts = [list(first)] if first else []
  lists = [list(checker.base)] + firsts + [list(seq) for seq in seqs]  # (sampling compiles nothing: build them all ahead, in batches)
  if isolated is not None: isolated.prebuild(entry, lists, device)
  else: prebuild([(entry.ast, o) for o in lists], device, [k0.copy() if not checker.base else None] + [None] * len(firsts) + [seq.kernel for seq in seqs])  # type: ignore[attr-defined]
  if (f := checker.check(checker.base, k0.copy() if isolated is None and not checker.base else None)) is not None: rep.failures.append(f)
  rep.runs += len(entry.var_vals)
  for opts in firsts:
    rep.pairs, rep.runs = rep.pairs + 1, rep.runs + len(entry.var_vals)
    if (f := checker.check(opts)) is not None:
      f.message = f"(the given opts) {f.message}"
      rep.failures.append(f)
  rep.refusals = refusals
  rep.failures += apply_fails
  for seq in seqs:
    if len(rep.failures) >= max_failures: break
    rep.pairs += 1
    rep.runs += len(entry.var_vals)
    if (f := checker.check(list(seq), seq.kernel if isolated is None else None)) is not None: rep.failures.append(f)  # type: ignore[attr-defined]
  rep.programs = len(checker.srcs)
  if shrink_first and rep.failures and rep.failures[0].opts and rep.failures[0].kind not in ("invariant",):
    ff = rep.failures[0]
    try: ff.minimal_opts = shrink(entry, ff.opts, device, inputs, isolated=isolated)
    except Exception as e:  # noqa: BLE001
      ff.message += f"\n  (shrinking failed: {type(e).__name__}: {e})"
  rep.seconds = time.perf_counter() - st
  return rep

def fuzz_entry(entry: CorpusEntry, n: int, device: str = "CPU", seed: int = 0, **kw: Any) -> FuzzReport:
  """fuzz_ast with generators seeded by (seed, entry name): reproducible in any process or order."""
  return fuzz_ast(entry, _seeded(seed, entry.name, "opts"), n, device, inputs=entry_inputs(entry, seed), **kw)

def fuzz_corpus(device: str = "CPU", n_per_kernel: int = 20, seed: int = 0, small: bool = True,
                names: Optional[Iterable[str]] = None, verbose: bool = False, isolate: bool = True) -> dict[str, FuzzReport]:
  """Fuzz every corpus entry (or `names`) with n_per_kernel opt sequences each. With `isolate`,
  kernels run in a worker process, so one that corrupts memory is reported instead of crashing."""
  entries = corpus(small)
  if getattr(Device[device].renderer, "supports_images", False): entries = {**entries, **image_corpus()}
  if names is not None: entries = {k: entries[k] for k in names}
  out = {}
  iso = IsolatedRunner(small) if isolate else None
  try:
    for name, e in entries.items():
      out[name] = fuzz_entry(e, n_per_kernel, device, seed, isolated=iso)
      if verbose: print(f"{name:40s} {out[name].summary().splitlines()[0]}", flush=True)
  finally:
    if iso is not None: iso.close()
  return out

# ---- recorded kernels: what real models run -------------------------------------------------------
# The corpus's kernels are small and written by hand; the kernels real models run (a Winograd conv's
# transforms, 1x1 convs with residual epilogues, weights in panels, fused pools, concatenations written
# in place) take the heuristics' less travelled paths (PACK, BLOCK, vectors along a strided output
# axis) at their real sizes. `tilecraft replay record --models ...` records them (AST, device, the opts
# the heuristics chose) in a process-replay DB; fuzz_recorded checks each distinct one: its recorded
# opts, then random ones, against its own unoptimized kernel. No numpy reference exists for an
# arbitrary AST, so the check is differential (and the guard zones). Inputs are random by dtype
# (floats in [-2, 2]): a long reduce over such data cancels, and two summation orders then differ by
# rounding far beyond a small result's rtol, so floats compare with atol = RECORDED_ATOL x the output's
# largest |value| (an element computed wrong is off by about the output's own scale).
RECORDED_ATOL = 2e-4

def recorded_kernels(path: str, device: str) -> list[tuple[str, str]]:
  """(name, key) of each distinct recorded kernel AST of `device` with concrete shapes (a symbolic one
  needs variable values the record doesn't have), in recording order; a name that repeats for another
  AST gets its key's first 8 characters appended."""
  c = sqlite3.connect(path, timeout=60)
  try: rows = c.execute("SELECT key, name, ast FROM kernels WHERE device = ? ORDER BY recorded, key", (device,)).fetchall()
  finally: c.close()
  out, seen, names = [], set(), collections.Counter()
  for key, name, ast_b in rows:
    ast = pickle.loads(ast_b)
    if ast.key in seen or has_images(ast) or any(not isinstance(d, int) for x in ast.lazyops if isinstance(x.arg, MemBuffer)
                                                   for d in x.arg.st.shape): continue
    seen.add(ast.key)
    names[name] += 1
    out.append((name if names[name] == 1 else f"{name}@{key[:8]}", key))
  return out

@functools.lru_cache(maxsize=64)
def recorded_entry(path: str, key: str, name: Optional[str] = None) -> tuple[CorpusEntry, tuple[Opt, ...]]:
  """The kernel recorded under `key` in the process-replay DB at `path`, as a corpus entry without a numpy
  reference (see above), and the opts it was recorded with."""
  c = sqlite3.connect(path, timeout=60)
  try: row = c.execute("SELECT name, ast, opts_obj FROM kernels WHERE key = ?", (key,)).fetchone()
  finally: c.close()
  if row is None: raise KeyError(f"no kernel {key} recorded in {path}")
  ast, opts = pickle.loads(row[1]), tuple(pickle.loads(row[2]))
  views = {i: v for i, v in buffer_views(ast).items() if i >= len(ast.src)}
  def make(rng: np.random.Generator) -> dict[int, np.ndarray]:
    return {i: rand(rng, v[0].dtype, buffer_size(v)) for i, v in views.items()}
  return CorpusEntry(name or row[0], ast, make, None, atol=RECORDED_ATOL, atol_scaled=True, tags=("recorded",),
                     origin=("recorded", path, key, name)), opts

def fuzz_recorded(path: str, device: str = "CPU", n: int = 20, seed: int = 0, names: Optional[Iterable[str]] = None,
                  isolate: bool = True, progress: Optional[Any] = None) -> dict[str, FuzzReport]:
  """Each distinct kernel of `device` recorded in the process-replay DB at `path` (or those whose name
  contains one of `names`): its recorded opts, then `n` random opt sequences, each against its
  unoptimized kernel (fuzz_ast's `first`: a failure of the recorded opts is reported as "(the given opts)",
  shrunk to a minimal failing subset). Opts the current settings refuse (recorded under another CPU_ARCH,
  say) are skipped like any refused list.
  `progress(name)` is called before each kernel."""
  wanted = list(names) if names is not None else None
  out: dict[str, FuzzReport] = {}
  iso = IsolatedRunner() if isolate else None
  try:
    for name, key in recorded_kernels(path, device):
      if wanted is not None and not any(w in name for w in wanted): continue
      if progress is not None: progress(name)
      e, opts = recorded_entry(path, key, name)
      out[name] = fuzz_entry(e, n, device, seed, isolated=iso, first=opts)
  finally:
    if iso is not None: iso.close()
  return out
