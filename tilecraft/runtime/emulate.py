"""The PYTHON device's interpreter: executes linearized UOps with GPU semantics, all threads at once.

Every thread of the launch grid is one *lane* of numpy arrays: lane l belongs to workgroup
l // group_size and has local linear id l % group_size (local dim 0 fastest, then 1, 2), so the
threads of a workgroup, and the 32-thread warps inside it, are contiguous. A value is an array
of shape (L,) per lane or () when every lane holds the same value (constants, loop counters);
vector values add a last axis of their width: (L, W) or (W,). Each UOp runs once for all lanes
(lock-step). Loops with lane-independent bounds run in Python; control that differs per lane
(IF blocks, loop bounds that vary, gated loads and stores) runs under a lane mask: inactive
lanes compute garbage that is never stored or checked.

Semantics follow the C renderers (see renderer/cstyle.py and the lowering): ints wrap (numpy
two's complement in the value's own dtype, narrow ints included), IDIV/MOD truncate like C (the
lowering builds numpy's floor division out of them), float16 rounds after every operation,
bfloat16 values are held as bfloat16-exact float32 (no bfloat16 arithmetic: the lowering
computes in float32) and cast with round-to-nearest-even, MAX propagates NaN.

Checks a real GPU would not make: an out-of-bounds load or store raises OutOfBoundsError naming
the buffer and the index; reading local memory nobody wrote, or that another thread wrote since
the last barrier, a barrier under divergent control, two threads storing different values to
one address in one store, and launches over the target's limits raise EmulatorError.

Handlers: `HANDLERS[UOps.X](ins, prog) -> step` builds the step that executes one instruction;
a step takes the launch state and returns None (next instruction) or the index to jump to.
WMMA (tensor cores, issue 12) registers its handler here with `@handler(UOps.WMMA)`; a warp is
`Launch.warp(32)` consecutive lanes of one workgroup.
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Any, Callable, Optional
import numpy as np
from tilecraft.codegen.uops import UOps
from tilecraft.dtype import DType, ImageDType, PtrDType, bf16_bits_from_f32, dtypes, f32_from_bf16_bits
from tilecraft.ops import BinaryOps, TernaryOps, UnaryOps

class EmulatorError(RuntimeError):
  """The program did something a GPU would run as undefined behaviour (or refuse to launch)."""

class OutOfBoundsError(EmulatorError):
  """A load or store outside its buffer."""

@dataclass(frozen=True)
class Ins:
  """One instruction: a UOp of the listing, its sources as instruction indices."""
  op: UOps
  dtype: DType
  src: tuple[int, ...]
  arg: Any

# ---- dtypes ------------------------------------------------------------------------------------------

_NP: dict[DType, Any] = {dtypes.bool: np.bool_, dtypes.int8: np.int8, dtypes.uint8: np.uint8, dtypes.int16: np.int16,
                         dtypes.uint16: np.uint16, dtypes.int32: np.int32, dtypes.uint32: np.uint32, dtypes.int64: np.int64,
                         dtypes.uint64: np.uint64, dtypes.float16: np.float16, dtypes.bfloat16: np.float32,
                         dtypes.float32: np.float32, dtypes.float64: np.float64}

def np_value_dtype(dt: DType) -> Any:
  """The numpy dtype values of `dt` are held in (bfloat16: float32 holding bfloat16-exact values)."""
  if (t := _NP.get(dt.scalar())) is None: raise EmulatorError(f"the PYTHON device has no values of type {dt!r}")
  return t

def np_memory_dtype(dt: DType) -> Any:
  """The numpy dtype of one element in memory (bfloat16: its uint16 bits)."""
  return np.uint16 if dt.scalar() == dtypes.bfloat16 else np_value_dtype(dt)

def round_bf16(x: np.ndarray) -> np.ndarray:
  """float values -> nearest-even bfloat16, as float32 (via float32, like the C renderers' f32_to_bf16((float)x))."""
  return f32_from_bf16_bits(bf16_bits_from_f32(np.asarray(x).astype(np.float32)))

# ---- memory ------------------------------------------------------------------------------------------

class Memory:
  """A buffer the program addresses: a kernel argument (flat, shared by every lane) or local
  memory (one `size`-element block per workgroup, with who-wrote-what tracking)."""
  def __init__(self, name: str, dtype: DType, data: np.ndarray, size: int, local: bool):
    self.name, self.dtype, self.data, self.size, self.local = name, dtype, data, size, local
    self.bf16 = dtype.scalar() == dtypes.bfloat16
    self.writer: Optional[np.ndarray] = None  # local: local id of the last writer per element, -1 = never written
    self.dirty: Optional[np.ndarray] = None   # local: written since the last barrier

  def describe(self) -> str: return f"{self.name} ({self.size} {self.dtype.name} elements{' per workgroup' if self.local else ''})"

def _lane_shape(st: "Launch", width: int) -> tuple[int, ...]: return (st.L, width) if width > 1 else (st.L,)

def _check_bounds(st: "Launch", mem: Memory, addr: np.ndarray, active: Optional[np.ndarray], width: int, what: str) -> None:
  """addr: element addresses, uniform or per lane (vectors: last axis `width`); only active lanes count."""
  if addr.size == 0: return
  if active is None:
    if addr.min() >= 0 and addr.max() < mem.size: return
    full = np.broadcast_to(addr, _lane_shape(st, width))
  else:
    full = np.broadcast_to(addr, _lane_shape(st, width))
    sel = full[active]
    if sel.size == 0 or (sel.min() >= 0 and sel.max() < mem.size): return
  bad = (full < 0) | (full >= mem.size)
  if width > 1: bad = bad.any(axis=1)
  if active is not None: bad &= active
  lanes = np.nonzero(bad)[0]
  idxs = np.unique(full[lanes].reshape(-1))
  idxs = idxs[(idxs < 0) | (idxs >= mem.size)]
  who = ", ".join(f"group {l // st.group_size} thread {l % st.group_size}" for l in lanes[:3])
  raise OutOfBoundsError(f"{st.prog.name}: out-of-bounds {what} of {mem.describe()}: index {', '.join(map(str, idxs[:6].tolist()))}"
                         f"{' ...' if idxs.size > 6 else ''} (by {lanes.size} thread(s): {who}{' ...' if lanes.size > 3 else ''})")

# ---- the launch ----------------------------------------------------------------------------------------

class Launch:
  """The state of one kernel launch: lane ids, values, the lane mask, loop state."""
  def __init__(self, prog: "Executable", global_size: list[int], local_size: list[int]):
    self.prog = prog
    self.gs, self.ls = global_size, local_size
    self.n_groups, self.group_size = int(np.prod(global_size)), int(np.prod(local_size))
    self.L = self.n_groups * self.group_size
    lane = np.arange(self.L, dtype=np.int64)
    self.group, self.lid_flat = lane // self.group_size, (lane % self.group_size).astype(np.int32)
    def unravel(flat: np.ndarray, dims: list[int]) -> list[np.ndarray]:
      out = []
      for d in dims:
        out.append(flat % d)
        flat = flat // d
      return out
    self.gid, self.lid = unravel(self.group, global_size), unravel(lane % self.group_size, local_size)
    self.vals: list[Any] = [None] * len(prog.ins)
    self.mask: Optional[np.ndarray] = None
    self.masks: list[Optional[np.ndarray]] = []
    self.loops: dict[int, Any] = {}
    self.executed = 0  # instructions run (each for all L lanes): lane-ops = executed * L

  def warp(self, size: int = 32) -> tuple[int, int]:
    """(warps per workgroup, lanes per warp): lane l is thread l % size of warp l // size."""
    if self.group_size % size: raise EmulatorError(f"workgroup of {self.group_size} threads is not whole warps of {size}")
    return self.group_size // size, size

  def push_mask(self, m: Optional[np.ndarray]) -> None:
    self.masks.append(self.mask)
    if m is not None:
      m = np.broadcast_to(np.asarray(m, dtype=np.bool_), (self.L,))
      self.mask = m if self.mask is None else self.mask & m
  def pop_mask(self) -> None: self.mask = self.masks.pop()

Step = Callable[[Launch], Optional[int]]
HANDLERS: dict[UOps, Callable[[Ins, int, "Executable"], Step]] = {}

def handler(*ops: UOps) -> Callable:
  """Register the step builder for `ops`: fn(ins, index, executable) -> step(launch)."""
  def deco(fn: Callable) -> Callable:
    for op in ops: HANDLERS[op] = fn
    return fn
  return deco

class Executable:
  """A parsed program: its instructions, the matching ENDRANGE/ENDIF of each block, and one step each."""
  def __init__(self, name: str, ins: list[Ins]):
    self.name, self.ins = name, ins
    self.end: dict[int, int] = {}
    stack: list[int] = []
    for i, x in enumerate(ins):
      if x.op in (UOps.RANGE, UOps.IF): stack.append(i)
      elif x.op in (UOps.ENDRANGE, UOps.ENDIF):
        if not stack: raise EmulatorError(f"{name}: {x.op.name} at {i} closes no block")
        self.end[stack.pop()] = i
    if stack: raise EmulatorError(f"{name}: block opened at {stack[-1]} is never closed")
    missing = sorted({x.op.name for x in ins if x.op not in HANDLERS})
    if missing: raise EmulatorError(f"the PYTHON device can't execute {', '.join(missing)}" +
                                    (" (tensor cores: no WMMA handler is registered)" if "WMMA" in missing else ""))
    self.steps = [HANDLERS[x.op](x, i, self) for i, x in enumerate(ins)]
    self.globals = sorted((x.arg, i) for i, x in enumerate(ins) if x.op is UOps.DEFINE_GLOBAL)
    self.vars = sorted(((x.arg.expr if hasattr(x.arg, "expr") else str(x.arg)), i, x.arg) for i, x in enumerate(ins) if x.op is UOps.DEFINE_VAR)
    self.locals = [(i, x) for i, x in enumerate(ins) if x.op is UOps.DEFINE_LOCAL]

  def run(self, st: Launch) -> None:
    steps, pc, n, count = self.steps, 0, len(self.steps), 0
    with np.errstate(all="ignore"):
      while pc < n:
        r = steps[pc](st)
        pc = pc + 1 if r is None else r
        count += 1
    st.executed = count

# ---- storage and ids -------------------------------------------------------------------------------------

@handler(UOps.DEFINE_GLOBAL, UOps.DEFINE_VAR, UOps.DEFINE_LOCAL)
def _h_define(ins: Ins, i: int, prog: Executable) -> Step:
  return lambda st: None  # bound by the launch before the first step

@handler(UOps.CONST)
def _h_const(ins: Ins, i: int, prog: Executable) -> Step:
  v = np.array(ins.arg, dtype=np_value_dtype(ins.dtype))[()]
  if ins.dtype.scalar() == dtypes.bfloat16: v = round_bf16(v)[()]
  def step(st: Launch) -> None: st.vals[i] = v
  return step

@handler(UOps.SPECIAL)
def _h_special(ins: Ins, i: int, prog: Executable) -> Step:
  name, _, dim, kind = ins.arg
  t = np_value_dtype(ins.dtype)
  def step(st: Launch) -> None:
    if dim >= len(st.gs): raise EmulatorError(f"{prog.name}: {name} reads launch dim {dim}, the launch has {len(st.gs)}")
    if kind == "local": v = st.lid[dim]
    elif kind == "group": v = st.gid[dim]
    else: v = st.gid[dim] * st.ls[dim] + st.lid[dim]  # a global id (NOLOCALS)
    st.vals[i] = v.astype(t, copy=False)
  return step

# ---- control flow ----------------------------------------------------------------------------------------

def _uniform_int(x: Any) -> Optional[int]:
  a = np.asarray(x)
  return int(a) if a.ndim == 0 else None

@handler(UOps.RANGE)
def _h_range(ins: Ins, i: int, prog: Executable) -> Step:
  lo_i, hi_i = ins.src[0], ins.src[1]
  after = prog.end[i] + 1
  ndt = np_value_dtype(ins.dtype)
  def step(st: Launch) -> Optional[int]:
    lo, hi = st.vals[lo_i], st.vals[hi_i]
    ulo, uhi = _uniform_int(lo), _uniform_int(hi)
    if ulo is not None and uhi is not None:
      if ulo >= uhi: return after
      st.loops[i] = (uhi, None)
      st.vals[i] = ndt(ulo)
      return None
    # bounds that differ per lane: run from the smallest start to the largest end under a mask
    act = st.mask if st.mask is not None else np.ones(st.L, np.bool_)
    lo_b, hi_b = np.broadcast_to(lo, (st.L,)), np.broadcast_to(hi, (st.L,))
    if not act.any() or (lo_b[act] >= hi_b[act]).all(): return after
    start, end = int(lo_b[act].min()), int(hi_b[act].max())
    st.loops[i] = (end, (lo_b, hi_b))
    st.vals[i] = ndt(start)
    st.push_mask((lo_b <= start) & (start < hi_b))
    return None
  return step

@handler(UOps.ENDRANGE)
def _h_endrange(ins: Ins, i: int, prog: Executable) -> Step:
  r = ins.src[0]
  ndt = np_value_dtype(prog.ins[r].dtype)
  def step(st: Launch) -> Optional[int]:
    end, per_lane = st.loops[r]
    nxt = int(st.vals[r]) + 1
    if per_lane is not None: st.pop_mask()
    if nxt >= end: return None
    st.vals[r] = ndt(nxt)
    if per_lane is not None: st.push_mask((per_lane[0] <= nxt) & (nxt < per_lane[1]))
    return r + 1
  return step

@handler(UOps.IF)
def _h_if(ins: Ins, i: int, prog: Executable) -> Step:
  c, after = ins.src[0], prog.end[i] + 1
  def step(st: Launch) -> Optional[int]:
    st.push_mask(st.vals[c])
    if st.mask is not None and not st.mask.any():
      st.pop_mask()
      return after
    return None
  return step

@handler(UOps.ENDIF)
def _h_endif(ins: Ins, i: int, prog: Executable) -> Step:
  def step(st: Launch) -> None: st.pop_mask()
  return step

@handler(UOps.BARRIER)
def _h_barrier(ins: Ins, i: int, prog: Executable) -> Step:
  def step(st: Launch) -> None:
    if st.mask is not None and not st.mask.all():
      raise EmulatorError(f"{prog.name}: barrier reached by only some threads (under divergent control): the workgroup would hang")
    for li, _ in prog.locals:
      mem: Memory = st.vals[li]
      mem.dirty[:] = False  # type: ignore[index]
  return step

# ---- accumulators ------------------------------------------------------------------------------------------

@handler(UOps.DEFINE_ACC)
def _h_acc(ins: Ins, i: int, prog: Executable) -> Step:
  init = ins.src[0]
  def step(st: Launch) -> None: st.vals[i] = st.vals[init]
  return step

def _merge(st: Launch, new: Any, old: Any, width: int) -> Any:
  """new where the lane is active, else old."""
  if st.mask is None: return new
  return np.where(st.mask[:, None] if width > 1 else st.mask, new, old)

@handler(UOps.PHI)
def _h_phi(ins: Ins, i: int, prog: Executable) -> Step:
  acc, new, width = ins.src[0], ins.src[1], ins.dtype.count
  def step(st: Launch) -> None: st.vals[i] = st.vals[acc] = _merge(st, st.vals[new], st.vals[acc], width)
  return step

@handler(UOps.ACCREAD)
def _h_accread(ins: Ins, i: int, prog: Executable) -> Step:
  acc = ins.src[0]
  def step(st: Launch) -> None: st.vals[i] = st.vals[acc]
  return step

# ---- memory ------------------------------------------------------------------------------------------------

def _gate_of(ins: Ins, prog: Executable, pos: int) -> Optional[int]:
  """The gate operand at `pos`, if that source is a bool (a barrier operand is not a gate)."""
  if len(ins.src) > pos and prog.ins[ins.src[pos]].dtype.scalar() == dtypes.bool and prog.ins[ins.src[pos]].op is not UOps.BARRIER:
    return ins.src[pos]
  return None

def _addresses(idx: Any, width: int) -> np.ndarray:
  """Element addresses: idx's shape (uniform () or per lane (L,)), plus a last axis for vectors."""
  a = np.asarray(idx).astype(np.int64)
  return a[..., None] + np.arange(width) if width > 1 else a

def _texels(mem: Memory, coords: Any) -> tuple[np.ndarray, np.ndarray]:
  """An image (kept as its flat row-major (height, width, 4) elements) at int2 texel coordinates:
  the 4 element addresses of each texel, and whether it is inside the image (outside reads 0,
  as OpenCL's clamp-to-border sampler does; those addresses are 0)."""
  assert isinstance(mem.dtype, ImageDType)
  h, w, _ = mem.dtype.shape
  c = np.asarray(coords).astype(np.int64)
  x, y = c[..., 0], c[..., 1]
  inside = (x >= 0) & (x < w) & (y >= 0) & (y < h)
  return np.where(inside, (y * w + x) * 4, 0)[..., None] + np.arange(4), inside

def _flat(st: Launch, mem: Memory, addr: np.ndarray, width: int) -> np.ndarray:
  """Local memory: the address inside this lane's workgroup block (always per lane)."""
  if not mem.local: return addr
  off = st.group * mem.size
  return (off[:, None] if width > 1 else off) + addr

def _gate(st: Launch, gi: Optional[int]) -> tuple[Optional[np.ndarray], Optional[np.ndarray]]:
  """(the gate per lane or None, the active lanes: mask and gate, or None for all)."""
  if gi is None: return None, st.mask
  g = np.broadcast_to(np.asarray(st.vals[gi], np.bool_), (st.L,))
  return g, (g if st.mask is None else st.mask & g)

@handler(UOps.LOAD)
def _h_load(ins: Ins, i: int, prog: Executable) -> Step:
  bi, ii = ins.src[0], ins.src[1]
  gi = _gate_of(ins, prog, 2)
  alt = ins.src[3] if gi is not None else None
  width = ins.dtype.count
  def step(st: Launch) -> None:
    mem: Memory = st.vals[bi]
    g, active = _gate(st, gi)
    image = isinstance(mem.dtype, ImageDType)
    if image: addr, inside = _texels(mem, st.vals[ii])
    else:
      addr = _addresses(st.vals[ii], width)
      _check_bounds(st, mem, addr, active, width, "load")
    if active is not None:
      if not active.any():
        st.vals[i] = st.vals[alt] if alt is not None else np.zeros((), np_value_dtype(ins.dtype))
        return
      addr = np.where(active[:, None] if width > 1 else active, np.broadcast_to(addr, _lane_shape(st, width)), 0)  # inactive lanes read element 0
    flat = _flat(st, mem, addr, width)
    if mem.local: _check_local_read(st, mem, flat, active, width, prog)
    v = mem.data[flat]
    if image: v = np.where(inside[..., None], v, 0).astype(np_value_dtype(ins.dtype))
    if mem.bf16 and not mem.local: v = f32_from_bf16_bits(v)
    if g is not None: v = np.where(g[:, None] if width > 1 else g, v, st.vals[alt])
    st.vals[i] = v
  return step

def _check_local_read(st: Launch, mem: Memory, flat: np.ndarray, active: Optional[np.ndarray], width: int, prog: Executable) -> None:
  lid = st.lid_flat[:, None] if width > 1 else st.lid_flat
  w, dirty = mem.writer[flat], mem.dirty[flat]  # type: ignore[index]
  never, other = w < 0, dirty & (w != lid)
  if active is not None: never, other = never[active], other[active]
  if never.any():
    raise EmulatorError(f"{prog.name}: read of local memory {mem.name} that no thread of the workgroup wrote")
  if other.any():
    raise EmulatorError(f"{prog.name}: read of local memory {mem.name} written by another thread since the last barrier (missing barrier)")

@handler(UOps.STORE)
def _h_store(ins: Ins, i: int, prog: Executable) -> Step:
  bi, ii, vi = ins.src[0], ins.src[1], ins.src[2]
  gi = _gate_of(ins, prog, 3)
  width = prog.ins[vi].dtype.count
  def step(st: Launch) -> None:
    mem: Memory = st.vals[bi]
    _, active = _gate(st, gi)
    if active is not None and not active.any(): return
    lane_shape = _lane_shape(st, width)
    if isinstance(mem.dtype, ImageDType):
      addr, inside = _texels(mem, st.vals[ii])
      outside = ~np.broadcast_to(inside, (st.L,))
      if (outside if active is None else outside & active).any(): raise EmulatorError(f"{prog.name}: write to a texel outside {mem.describe()} (undefined in OpenCL)")
    else:
      addr = _addresses(st.vals[ii], width)
      _check_bounds(st, mem, addr, active, width, "store")
    addr_b, val_b = np.broadcast_to(addr, lane_shape), np.broadcast_to(np.asarray(st.vals[vi]), lane_shape)
    flat = _flat(st, mem, addr_b, width)
    lids = np.broadcast_to(st.lid_flat[:, None], lane_shape) if width > 1 else st.lid_flat
    if active is not None: flat, val_b, lids = flat[active], val_b[active], lids[active]
    flat, val_b, lids = flat.reshape(-1), val_b.reshape(-1), np.asarray(lids).reshape(-1)
    if flat.size > 1: _check_race(mem, flat, val_b, prog)
    if mem.bf16 and not mem.local: val_b = bf16_bits_from_f32(val_b)
    mem.data[flat] = val_b
    if mem.local:
      mem.writer[flat] = lids  # type: ignore[index]
      mem.dirty[flat] = True  # type: ignore[index]
  return step

def _check_race(mem: Memory, flat: np.ndarray, vals: np.ndarray, prog: Executable) -> None:
  order = np.argsort(flat, kind="stable")
  f = flat[order]
  dup = f[1:] == f[:-1]
  if not dup.any(): return
  v = vals[order]
  a, b = v[1:][dup], v[:-1][dup]
  differ = (a != b) & ~((a != a) & (b != b)) if v.dtype.kind == "f" else a != b
  if differ.any():
    e = int(f[1:][dup][differ][0])
    raise EmulatorError(f"{prog.name}: threads store different values to {mem.name}[{e % mem.size if mem.local else e}] in one store (a race)")

# ---- values ------------------------------------------------------------------------------------------------

def _to_vec(x: Any, want: int, have: int) -> Any:
  return np.asarray(x)[..., None] if want > 1 and have == 1 else x

def _idiv(a: Any, b: Any, dt: DType) -> Any:
  if dtypes.is_float(dt): return a / b
  zero = b == 0
  sb = np.where(zero, np.ones_like(b), b)
  q = a // sb
  if not dtypes.is_unsigned(dt) and dt.scalar() != dtypes.bool:
    q = q + (((a % sb) != 0) & ((a < 0) != (sb < 0))).astype(q.dtype)  # C truncates toward zero, numpy floors
  return np.where(zero, np.zeros_like(q), q)

def _imod(a: Any, b: Any, dt: DType) -> Any:
  if dtypes.is_float(dt): return np.fmod(a, b)
  zero = b == 0
  sb = np.where(zero, np.ones_like(b), b)
  r = np.fmod(a, sb) if not dtypes.is_unsigned(dt) else a % sb  # C's remainder takes the dividend's sign
  return np.where(zero, np.zeros_like(r), r)

def _sub(a: Any, b: Any, dt: DType) -> Any: return np.not_equal(a, b) if dt.scalar() == dtypes.bool else np.subtract(a, b)
def _neg(a: Any, dt: DType) -> Any: return np.logical_not(a) if dt.scalar() == dtypes.bool else np.negative(a)
def _shift(fn: Any) -> Any: return lambda a, b, dt: fn(a, np.asarray(b).astype(np.asarray(a).dtype))

ALU: dict[Any, Callable[..., Any]] = {
  UnaryOps.EXP2: lambda a, dt: np.exp2(a), UnaryOps.LOG2: lambda a, dt: np.log2(a), UnaryOps.SIN: lambda a, dt: np.sin(a),
  UnaryOps.SQRT: lambda a, dt: np.sqrt(a), UnaryOps.NEG: _neg, UnaryOps.RECIP: lambda a, dt: np.reciprocal(a),
  BinaryOps.ADD: lambda a, b, dt: np.add(a, b), BinaryOps.SUB: _sub, BinaryOps.MUL: lambda a, b, dt: np.multiply(a, b),
  BinaryOps.IDIV: _idiv, BinaryOps.MOD: _imod, BinaryOps.MAX: lambda a, b, dt: np.maximum(a, b),
  BinaryOps.CMPLT: lambda a, b, dt: np.less(a, b), BinaryOps.CMPNE: lambda a, b, dt: np.not_equal(a, b),
  BinaryOps.XOR: lambda a, b, dt: np.bitwise_xor(a, b), BinaryOps.OR: lambda a, b, dt: np.bitwise_or(a, b),
  BinaryOps.AND: lambda a, b, dt: np.bitwise_and(a, b), BinaryOps.SHL: _shift(np.left_shift), BinaryOps.SHR: _shift(np.right_shift),
  TernaryOps.WHERE: lambda c, a, b, dt: np.where(c, a, b), TernaryOps.MULACC: lambda a, b, c, dt: np.add(np.multiply(a, b), c),
}

@handler(UOps.ALU)
def _h_alu(ins: Ins, i: int, prog: Executable) -> Step:
  if ins.arg not in ALU: raise EmulatorError(f"the PYTHON device has no ALU op {ins.arg}")
  fn, dt, srcs = ALU[ins.arg], ins.dtype, ins.src
  out = np.dtype(np_value_dtype(dt))
  w = dt.count if ins.arg not in (BinaryOps.CMPLT, BinaryOps.CMPNE) else max(prog.ins[s].dtype.count for s in srcs)
  widen = [w > 1 and prog.ins[s].dtype.count == 1 for s in srcs]  # a scalar operand of a vector op: every lane of the vector
  bf16 = dt.scalar() == dtypes.bfloat16
  # the type the op computes in: the result's, except comparisons (their operands')
  op_dt = prog.ins[srcs[-1]].dtype if ins.arg in (BinaryOps.CMPLT, BinaryOps.CMPNE) else dt
  def fix(r: Any) -> Any:
    if r.dtype != out: r = r.astype(out)
    return round_bf16(r) if bf16 else r
  if not any(widen) and not bf16 and len(srcs) == 2:  # the common case, without the generic argument handling
    a, b = srcs
    def step2(st: Launch) -> None:
      v = st.vals
      r = fn(v[a], v[b], op_dt)
      v[i] = r if r.dtype == out else r.astype(out)
    return step2
  def step(st: Launch) -> None:
    args = [np.asarray(st.vals[s])[..., None] if wd else st.vals[s] for s, wd in zip(srcs, widen)]
    st.vals[i] = fix(np.asarray(fn(*args, op_dt)))
  return step

@handler(UOps.CAST)
def _h_cast(ins: Ins, i: int, prog: Executable) -> Step:
  s, dt = ins.src[0], ins.dtype
  out = np_value_dtype(dt)
  def step(st: Launch) -> None:
    x = np.asarray(st.vals[s])
    if dt.scalar() == dtypes.bool: st.vals[i] = x != 0
    elif dt.scalar() == dtypes.bfloat16: st.vals[i] = round_bf16(x)
    else: st.vals[i] = x.astype(out)
  return step

@handler(UOps.BITCAST)
def _h_bitcast(ins: Ins, i: int, prog: Executable) -> Step:
  s, dt, sdt = ins.src[0], ins.dtype, prog.ins[ins.src[0]].dtype
  if dt.scalar().itemsize != sdt.scalar().itemsize: raise EmulatorError(f"bitcast between {sdt!r} and {dt!r} of different sizes")
  def step(st: Launch) -> None:
    x = np.array(st.vals[s])  # a contiguous copy (0-d stays 0-d)
    if sdt.scalar() == dtypes.bfloat16: x = bf16_bits_from_f32(x)
    y = x.view(np_memory_dtype(dt))
    st.vals[i] = f32_from_bf16_bits(y) if dt.scalar() == dtypes.bfloat16 else y
  return step

@handler(UOps.VECTORIZE)
def _h_vectorize(ins: Ins, i: int, prog: Executable) -> Step:
  srcs, out = ins.src, np_value_dtype(ins.dtype)
  def step(st: Launch) -> None: st.vals[i] = np.stack(np.broadcast_arrays(*[st.vals[s] for s in srcs]), axis=-1).astype(out, copy=False)
  return step

@handler(UOps.GEP)
def _h_gep(ins: Ins, i: int, prog: Executable) -> Step:
  s, k = ins.src[0], ins.arg
  def step(st: Launch) -> None: st.vals[i] = np.asarray(st.vals[s])[..., k]
  return step

@handler(UOps.SINK)
def _h_sink(ins: Ins, i: int, prog: Executable) -> Step: return lambda st: None

# ---- launching ---------------------------------------------------------------------------------------------

def launch(prog: Executable, mems: list[np.ndarray], vals: tuple[int, ...], global_size: Optional[list[int]],
           local_size: Optional[list[int]], limits: Any = None) -> Launch:
  """Run `prog` on kernel-argument memories (flat numpy arrays in DEFINE_GLOBAL index order) and
  the symbolic values (sorted by name), over global_size workgroups of local_size threads."""
  if len(mems) != len(prog.globals): raise EmulatorError(f"{prog.name} takes {len(prog.globals)} buffers, got {len(mems)}")
  if len(vals) != len(prog.vars): raise EmulatorError(f"{prog.name} takes {len(prog.vars)} symbolic values, got {len(vals)}")
  gs, ls = check_launch(prog, global_size, local_size, limits)
  st = Launch(prog, gs, ls)
  for (idx, i), mem in zip(prog.globals, mems):
    dt = prog.ins[i].dtype
    base = dt.base if isinstance(dt, PtrDType) else dt
    st.vals[i] = Memory(f"data{idx}", base, mem, mem.size, local=False)
  for (name, i, var), v in zip(prog.vars, vals):
    lo, hi = getattr(var, "vmin", None), getattr(var, "vmax", None)
    if lo is not None and not lo <= v <= hi: raise EmulatorError(f"{prog.name}: Variable {name}={v} is outside its range [{lo}, {hi}]")
    st.vals[i] = np.array(v, dtype=np_value_dtype(prog.ins[i].dtype))[()]
  for i, x in prog.locals:
    dt = x.dtype.base if isinstance(x.dtype, PtrDType) else x.dtype
    name, size = x.arg[0], int(x.arg[1])
    m = Memory(name, dt, _poison(dt, st.n_groups * size), size, local=True)
    m.writer, m.dirty = np.full(st.n_groups * size, -1, np.int32), np.zeros(st.n_groups * size, np.bool_)
    st.vals[i] = m
  if st.L: prog.run(st)
  return st

def check_launch(prog: Executable, global_size: Optional[list[int]], local_size: Optional[list[int]], limits: Any = None) -> tuple[list[int], list[int]]:
  """What a launch checks before it runs anything: the (global, local) sizes as launched, or
  EmulatorError when they or the program's local memory are over the target's `limits`."""
  gs = [int(x) for x in (global_size or [1])]
  ls = [int(x) for x in (local_size or [1] * len(gs))]  # no local size (NOLOCALS): one thread per workgroup
  n = max(len(gs), len(ls), 1)
  gs, ls = gs + [1] * (n - len(gs)), ls + [1] * (n - len(ls))
  if any(x < 0 for x in gs + ls): raise EmulatorError(f"{prog.name}: negative launch size {gs} x {ls}")
  if limits is not None: _check_limits(prog, gs, ls, limits)
  return gs, ls

def _poison(dt: DType, n: int) -> np.ndarray:
  """Fresh local memory: NaN / the most negative int (never read: reads of unwritten elements raise)."""
  t = np_value_dtype(dt)
  if dtypes.is_float(dt): return np.full(n, np.nan, t)
  if dt.scalar() == dtypes.bool: return np.ones(n, t)
  return np.full(n, dtypes.min(dt), t)

def _check_limits(prog: Executable, gs: list[int], ls: list[int], lim: Any) -> None:
  where = f"{prog.name} launched with {gs} workgroups of {ls} threads"
  if lim.local_max is not None:
    for d, (l, m) in enumerate(zip(ls, lim.local_max)):
      if l > m: raise EmulatorError(f"{where}: local dim {d} is {l}, the target allows {m}")
  if lim.global_max is not None:
    for d, (g, m) in enumerate(zip(gs, lim.global_max)):
      if g > m: raise EmulatorError(f"{where}: global dim {d} is {g}, the target allows {m}")
  if int(np.prod(ls)) > lim.max_threads: raise EmulatorError(f"{where}: {int(np.prod(ls))} threads per workgroup, the target allows {lim.max_threads}")
  shared = sum(int(x.arg[1]) * (x.dtype.base if isinstance(x.dtype, PtrDType) else x.dtype).itemsize for _, x in prog.locals)
  if shared > lim.shared_max: raise EmulatorError(f"{where}: {shared} bytes of local memory, the target has {lim.shared_max}")

# ---- tensor cores ---------------------------------------------------------------------------------------

@handler(UOps.WMMA)
def _h_wmma(ins: Ins, i: int, prog: Executable) -> Step:
  """One warp-wide matrix instruction per warp (`threads` consecutive lanes): the fragments of all its
  lanes are placed into A, B and C tiles by the vendor's layout (arg), D = A @ B + C is computed once,
  and each lane gets its C registers back. All lanes of the warp must run it (no divergence)."""
  from tilecraft.renderer.tensor_cores import tensor_core_of, wmma_warps
  try: tc = tensor_core_of(ins.arg)
  except (TypeError, ValueError) as e: raise EmulatorError(f"{prog.name}: WMMA at {i} has no valid tensor core in its arg {ins.arg!r} ({e})") from None
  if len(ins.src) != 3: raise EmulatorError(f"{prog.name}: WMMA at {i} takes A, B and C fragments, got {len(ins.src)} sources")
  widths = [prog.ins[j].dtype.count for j in ins.src]
  out_t = np_value_dtype(ins.dtype)
  def step(st: Launch) -> None:
    if st.mask is not None and not bool(np.all(st.mask)): raise EmulatorError(f"{prog.name}: WMMA ({tc}) under divergent control flow")
    _, ws = st.warp(tc.threads)
    frags = [np.broadcast_to(st.vals[j], (st.L, w)).reshape(st.L // ws, ws, w) for j, w in zip(ins.src, widths)]
    try: d = wmma_warps(tc, *frags)
    except ValueError as e: raise EmulatorError(f"{prog.name}: {e}") from None
    st.vals[i] = d.reshape(st.L, widths[2]).astype(out_t)
  return step
