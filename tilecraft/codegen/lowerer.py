"""Lowering: an optimized kernel AST -> a UOp graph (a SINK of STOREs).

Axes become index variables of the one symbolic system: global axes are loops on a CPU (the
outermost runs in parallel) and group/thread ids on GPUs; reduce axes are loops; upcast and
unrolled axes are expanded into lanes. One upcast axis (the vector axis, contiguous in the
output) stays a vector: values along it are single vector UOps (float4, float8, ...), so loads,
stores and arithmetic along it are vector instructions. Index expressions are built and
simplified symbolically, then converted to UOps.
"""
from __future__ import annotations
import itertools
from typing import Any, Optional
from tilecraft.codegen.rewrite import graph_rewrite, symbolic_rules
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import DType, dtypes
from tilecraft.helpers import prod
from tilecraft.ops import INDEX, BinaryOps, BufferOps, ConstBuffer, LazyOp, MemBuffer, ReduceOps, TernaryOps, UnaryOps
from tilecraft.shape.shapetracker import ShapeTracker
from tilecraft.shape.symbolic import And, Div, Lt, Mod, Node, Prod, Sum, Variable, sint, sym_and, sym_lt

INT32_MAX = 2**31 - 1

def _ceil(s: sint) -> int: return s if isinstance(s, int) else s.vmax

def launch_dims(k: Any) -> tuple[Optional[list[sint]], Optional[list[sint]]]:
  """Global and local launch sizes (None on targets without workgroups)."""
  if not k.opts.has_local: return None, None
  gl = list(k.full_shape[:k.global_dims])
  lc = list(k.full_shape[k.global_dims:k.first_reduce]) + list(k.full_shape[k.first_reduce:k.first_reduce + k.group_for_reduces])
  if k.dont_use_locals: return [prod(gl)] if gl else [1], None
  return (_fold_dims(gl, k.opts.global_max)[::-1] or [1]), (_fold_dims(lc, k.opts.local_max)[::-1] or [1])

def _fold_dims(dims: list[sint], maxes: Optional[tuple[int, ...]]) -> list[sint]:
  """Fold dims into at most len(maxes) (3) launch dims: the outermost extra dims merge into one. When
  a launch dim would exceed the target's limit for it (CUDA's grid y and z are at most 65535), fold
  into fewer dims: launch dim 0 (the innermost, listed last here) has the largest limit."""
  n = len(maxes) if maxes else 3
  while True:
    out = list(dims)
    while len(out) > n: out = [out[0] * out[1]] + out[2:]
    if not maxes or n == 1 or all(not isinstance(d, int) or d <= m for d, m in zip(reversed(out), maxes)): return out
    n -= 1

class Lowerer:
  def __init__(self, k: Any, ast: LazyOp):
    self.k, self.ast, self.ren = k, ast, k.opts
    self.shape = k.full_shape
    n = k.shape_len
    self.first_upcast, self.first_reduce, self.group = k.first_upcast, k.first_reduce, k.group_for_reduces
    self.red_axes = list(range(self.first_reduce + self.group, self.first_upcast))
    self.group_axes = list(range(self.first_reduce, self.first_reduce + self.group))
    self.upcast_axes = list(range(self.first_upcast, n))
    self.magenta = [a for a in self.upcast_axes if k.full_shape[a] != k.output_shape[a]]
    self.vax = self._pick_vector_axis()
    self.lane_axes = [a for a in self.upcast_axes if a != self.vax]
    self.W = self.shape[self.vax] if self.vax is not None else 1
    self.vlane = Variable("_vlane", 0, self.W - 1) if self.vax is not None else None
    self.varmap: dict[Variable, UOp] = {}
    self.idx_vars: list[sint] = [0] * n
    self.acc_count = 0
    self.memo: dict[Any, Any] = {}
    self.outer_range: Optional[UOp] = None  # innermost loop around the reduce (CPU global loops)
    self.block_axis: Optional[int] = self.first_reduce if getattr(k, "reduce_block", False) else None
    self.block_range: Optional[UOp] = None
    # the accumulators start from the earlier blocks' sums, unless their vector lanes are reduce lanes
    self.block_in_acc = self.vax is None or self.vax not in self.magenta
    self._make_index_vars()

  # ---- axes ---------------------------------------------------------------------------------------
  def _pick_vector_axis(self) -> Optional[int]:
    """The upcast axis kept as vector lanes: an output axis the output walks contiguously, or an
    unrolled reduce axis (vector accumulators, one horizontal reduce after the loop). Among those,
    the one where the fewest inputs need gathers, then the most read contiguously."""
    if not self.ren.supports_float4: return None
    if any(not _vectorizable(self.ren, b.dtype) for b in self.k.bufs): return None
    if any(x.op is ReduceOps.WMMA for x in self.ast.lazyops): return None  # fragments are gathered lane by lane
    out_rs = self.k.sts[0].real_strides()
    ins = [st.real_strides() for b, st in zip(self.k.bufs, self.k.sts) if isinstance(b, MemBuffer) and b.idx >= len(self.k.outbufs)]
    reduces = [r for r in self.ast.lazyops if r.op in ReduceOps]
    best: Optional[tuple] = None
    for a in self.upcast_axes:
      if self.shape[a] not in (2, 4, 8, 16): continue
      if a in self.magenta:
        if self.k.group_for_reduces or not all(a in r.arg for r in reduces): continue
      elif out_rs[a] != 1: continue
      gathers = sum(1 for rs in ins if rs[a] not in (0, 1))
      contiguous = sum(1 for rs in ins if rs[a] == 1) + (a not in self.magenta)
      if a in self.magenta and not any(rs[a] == 1 for rs in ins): continue
      score = (-gathers, contiguous, a not in self.magenta, a)
      if best is None or score > best[0]: best = (score, a)
    return best[1] if best is not None else None

  def _make_index_vars(self) -> None:
    shape = self.shape
    def var(name: str, s: sint) -> sint: return 0 if s == 1 else Variable(name, 0, _ceil(s) - 1)
    if not self.ren.has_local:
      # CPU: global axes are nested loops, the outermost parallel unless the kernel is too small
      # for waking the other cores to pay off
      work = prod(shape)
      parallel = not isinstance(work, int) or work >= 1 << 15
      parent: Optional[UOp] = None
      for i in range(self.first_reduce):
        v = var(f"gidx{i}", shape[i])
        self.idx_vars[i] = v
        if isinstance(v, Variable):
          r = self._range(shape[i], parent, ("parallel" if parent is None and parallel else "global", i))
          self.varmap[v] = r
          parent = r
          if self.block_axis is not None and self.block_range is None: parent = self._make_block_range(parent)
      if self.block_axis is not None and self.block_range is None: parent = self._make_block_range(parent)
      self.outer_range = parent
    else:
      self._make_gpu_ids(var)
    parent = self.outer_range
    for i in self.red_axes:
      if i == self.block_axis: continue
      v = var(f"ridx{i}", shape[i])
      self.idx_vars[i] = v
      if isinstance(v, Variable):
        r = self._range(shape[i], parent, ("reduce", i))
        self.varmap[v] = r
        parent = r
    self.reduce_ranges = [self.varmap[v] for v in (self.idx_vars[i] for i in self.red_axes if i != self.block_axis) if isinstance(v, Variable)]

  def _make_block_range(self, parent: Optional[UOp]) -> UOp:
    """BLOCK: the loop over blocks of the reduce, inside the outermost output loop and around the
    other output loops; the accumulators live inside it (see lower_store)."""
    a = self.block_axis
    assert a is not None
    v = Variable(f"ridx{a}", 0, _ceil(self.shape[a]) - 1)
    self.idx_vars[a] = v
    r = UOp(UOps.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 0), self.sym_to_uop(self.shape[a], dtypes.int32)) + ((parent,) if parent is not None else ()),
            ("reduce", a))
    self.varmap[v] = self.block_range = r
    return r

  def _range(self, size: sint, parent: Optional[UOp], arg: tuple) -> UOp:
    """A loop 0..size; its counter is 64-bit when the trip count doesn't fit in int32."""
    end = self.sym_to_uop(size, dtypes.int32)
    return UOp(UOps.RANGE, end.dtype, (UOp.const(end.dtype, 0), end) + ((parent,) if parent is not None else ()), arg)

  def _make_gpu_ids(self, var: Any) -> None:
    k = self.k
    gl = list(range(k.global_dims))
    lc = list(range(k.global_dims, self.first_reduce)) + self.group_axes
    def ids(axes: list[int], prefix: str, maxes: Any) -> None:
      if not axes: return
      sizes = [self.shape[a] for a in axes]
      folded = _fold_dims(sizes, maxes) if not (prefix == "gidx" and k.dont_use_locals) else [prod(sizes)]
      # the first launch dim may hold several axes (outermost first): unravel it. Hardware dim 0
      # is the innermost axis (neighbouring threads touch neighbouring memory).
      n_first = len(axes) - len(folded) + 1
      for j, size in enumerate(folded):
        d = len(folded) - 1 - j
        kind = "global" if prefix == "gidx" and k.dont_use_locals else ("group" if prefix == "gidx" else "local")
        # ids are int unless the launch dim can exceed int32 (one flat global dim with NOLOCALS)
        sp = UOp(UOps.SPECIAL, dtypes.int64 if self._needs_int64(size) else dtypes.int32, (),
                 (f"{prefix}{d}", size if isinstance(size, int) else self.sym_to_uop(size, dtypes.int32), d, kind))
        spv = Variable(f"{prefix}{d}", 0, _ceil(size) - 1)
        self.varmap[spv] = sp
        mine = axes[:n_first] if j == 0 else [axes[n_first + j - 1]]
        acc: sint = spv
        for j, a in enumerate(reversed(mine)):
          s = self.shape[a]
          rest = len(mine) - 1 - j
          self.idx_vars[a] = acc % s if rest else acc
          acc = acc // s
    ids(gl, "gidx", k.opts.global_max)
    ids(lc, "lidx", k.opts.local_max)

  # ---- symbolic -> UOps ---------------------------------------------------------------------------
  def sym_to_uop(self, x: sint, dtype: DType) -> UOp:
    """An index expression as UOps: in `dtype` (int32) unless it or a partial result can exceed int32,
    then all in int64. Plain ints are checked too (a constant index or loop bound past 2^31)."""
    if dtype != dtypes.int64 and self._needs_int64(x): dtype = dtypes.int64
    if isinstance(x, int): return UOp.const(dtype, x)
    return self._sym(x, dtype)

  def _sym(self, x: sint, dtype: DType) -> UOp:
    if isinstance(x, int): return UOp.const(dtype, x)
    key = (x, dtype)
    if (r := self.memo.get(key)) is not None: return r
    if isinstance(x, Variable):
      if x in self.varmap: u = self.varmap[x]
      else:
        u = self.varmap.setdefault(x, UOp(UOps.DEFINE_VAR, dtypes.int64, (), x))
      u = u.cast(dtype)
    elif isinstance(x, Sum):
      terms = [self._sym(t, dtype) if c == 1 else UOp.alu(BinaryOps.MUL, self._sym(t, dtype), UOp.const(dtype, c)) for t, c in x.terms]
      u = terms[0]
      for t in terms[1:]: u = UOp.alu(BinaryOps.ADD, u, t)
      if x.const: u = UOp.alu(BinaryOps.ADD, u, UOp.const(dtype, x.const))
    elif isinstance(x, Prod): u = UOp.alu(BinaryOps.MUL, self._sym(x.a, dtype), self._sym(x.b, dtype))
    elif isinstance(x, (Div, Mod)):
      a, b = x.a, x.b
      amin = a if isinstance(a, int) else a.vmin
      # C division truncates: shift a negative numerator up by a multiple of b to get floor semantics
      shift = 0
      if amin < 0:
        if not isinstance(b, int): raise NotImplementedError(f"floor division of possibly negative {x} by a symbolic divisor")
        shift = -(amin // b)
      au = self._sym(a + shift * b if shift else a, dtype)
      op = BinaryOps.IDIV if isinstance(x, Div) else BinaryOps.MOD
      u = UOp.alu(op, au, self._sym(b, dtype))
      if shift and isinstance(x, Div): u = UOp.alu(BinaryOps.ADD, u, UOp.const(dtype, -shift))
    elif isinstance(x, Lt): u = UOp.alu(BinaryOps.CMPLT, self._sym(x.a, dtype), UOp.const(dtype, x.b))
    elif isinstance(x, And):
      parts = [self.sym_bool(n) for n in x.nodes]
      u = parts[0]
      for p in parts[1:]: u = UOp.alu(BinaryOps.AND, u, p)
      return u
    else: raise TypeError(f"cannot lower {x!r}")
    self.memo[key] = u
    return u

  def sym_bool(self, x: sint) -> UOp:
    """A 0/1 expression as a bool UOp."""
    if isinstance(x, int): return UOp.const(dtypes.bool, bool(x))
    if isinstance(x, (Lt, And)): return self.sym_to_uop(x, dtypes.int32) if isinstance(x, And) else self._lt(x)
    # 1 - (a < b)  ==  not (a < b)
    if isinstance(x, Sum) and x.const == 1 and len(x.terms) == 1 and x.terms[0][1] == -1 and isinstance(x.terms[0][0], Lt):
      return UOp.alu(BinaryOps.CMPNE, self._lt(x.terms[0][0]), UOp.const(dtypes.bool, True))
    u = self.sym_to_uop(x, dtypes.int32)
    return UOp.alu(BinaryOps.CMPNE, u, UOp.const(u.dtype, 0))
  def _needs_int64(self, x: sint) -> bool:
    if isinstance(x, int): return not -INT32_MAX <= x <= INT32_MAX
    if (r := self.memo.get(("i64", x))) is None: r = self.memo[("i64", x)] = _needs_int64(x)
    return r
  def _lt(self, x: Lt) -> UOp:
    dt = dtypes.int64 if self._needs_int64(x) else dtypes.int32
    return UOp.alu(BinaryOps.CMPLT, self._sym(x.a, dt), UOp.const(dt, x.b))

  # ---- lanes --------------------------------------------------------------------------------------
  def lanes(self, inner: bool) -> list[tuple[int, ...]]:
    sizes = [self.shape[a] if (inner or a not in self.magenta) else 1 for a in self.lane_axes]
    return list(itertools.product(*[range(s) for s in sizes]))

  def index(self, st: ShapeTracker, lane: tuple[int, ...]) -> tuple[sint, sint]:
    key = ("idx", st, lane, tuple(self.idx_vars))
    if (r := self.memo.get(key)) is not None: return r
    idxs = list(self.idx_vars)
    for a, v in zip(self.lane_axes, lane): idxs[a] = v
    if self.vax is not None: idxs[self.vax] = self.vlane
    # an axis the buffer doesn't span (size 1 in its view) indexes at 0
    idxs = [0 if s == 1 else i for s, i in zip(st.shape, idxs)]
    r = st.expr_idxs(tuple(idxs))
    self.memo[key] = r
    return r

  def vec_form(self, idx: sint, valid: sint) -> tuple[str, Any]:
    """How an access varies along the vector axis: ('scalar', (idx, valid)), ('vector', (base, valid))
    for unit stride, or ('gather', [(idx, valid)] per lane)."""
    if self.vlane is None: return "scalar", (idx, valid)
    v = self.vlane
    in_valid = isinstance(valid, Node) and v in valid.vars()
    in_idx = isinstance(idx, Node) and v in idx.vars()
    if not in_idx and not in_valid: return "scalar", (idx, valid)
    if _direct_unit_term(idx, v):
      base = idx - v
      if not in_valid: return "vector", (base, valid)
      return "gather", [(base + i, self._at_lane(valid, i)) for i in range(self.W)]
    per = [(self._at_lane(idx, i), self._at_lane(valid, i)) for i in range(self.W)]
    # unit stride: lane i reads base + i for every lane (checked lane by lane, exactly)
    if not in_valid and all(_is_zero(ix - (per[0][0] + i)) for i, (ix, _) in enumerate(per)): return "vector", (per[0][0], valid)
    return "gather", per

  def _at_lane(self, x: sint, i: int) -> sint:
    """x with the vector lane variable set to i, memoized per conjunct (lanes and loads share most of a mask)."""
    if not isinstance(x, Node) or self.vlane not in x.vars(): return x
    key = ("lane", x, i)
    if (r := self.memo.get(key)) is None:
      r = self.memo[key] = sym_and(*[self._at_lane(n, i) for n in x.nodes]) if isinstance(x, And) else _subst(x, self.vlane, i)
    return r

  # ---- AST ops ------------------------------------------------------------------------------------
  def lower(self) -> UOp:
    stores = [s for out in self.ast.src for s in self.lower_store(out)]
    # every kernel argument exists even if no load survives simplification: the signature is fixed
    args = [self.buf_uop(b) for b in self.k.membufs if b.idx >= 0]
    args += [self.varmap.get(v) or UOp(UOps.DEFINE_VAR, dtypes.int64, (), v) for v in sorted(self.ast.vars(), key=lambda v: v.expr)]
    return UOp(UOps.SINK, dtypes.void, tuple(stores) + tuple(dict.fromkeys(args)))

  def buf_uop(self, mb: MemBuffer) -> UOp:
    if mb.idx < 0: return UOp(UOps.DEFINE_LOCAL, mb.dtype.ptr(local=True), (), (f"temp{-mb.idx}", mb.st.real_size()))
    return UOp(UOps.DEFINE_GLOBAL, mb.dtype.ptr(), (), mb.idx)

  def lower_store(self, op: LazyOp) -> list[UOp]:
    val = self.lower_op(op.src[0], inner=False)
    mb: MemBuffer = op.arg
    buf = self.buf_uop(mb)
    out = []
    for lane in self.lanes(False):
      v = val[lane]
      idx, valid = self.index(mb.st, lane)
      kind, data = self.vec_form(idx, valid)
      if self.block_range is not None and not self.block_in_acc: v = self._combine(ReduceOps.SUM, v, self._earlier_blocks(lane, v.dtype.count))
      if kind == "vector" and v.dtype.count > 1:
        out.append(self._store(buf, *data, v))
      elif kind == "scalar" and v.dtype.count == 1: out.append(self._store(buf, *data, v))
      else:
        if kind == "scalar": raise RuntimeError(f"output {mb.idx} has one address for several vector lanes: the kernel would race")
        per = data if kind == "gather" else [(data[0] + i, data[1]) for i in range(self.W)]
        for i, (ix, vl) in enumerate(per): out.append(self._store(buf, ix, vl, v.gep(i) if v.dtype.count > 1 else v))
    return out

  def _earlier_blocks(self, lane: tuple[int, ...], width: int) -> UOp:
    """BLOCK: what the earlier blocks stored for this output lane (0 in the first block). It starts
    the accumulator, or, where the accumulator's vector lanes are reduce lanes, is added at the store."""
    assert self.block_range is not None
    mb: MemBuffer = self.ast.src[0].arg
    buf = self.buf_uop(mb)
    kind, data = self.vec_form(*self.index(mb.st, lane))
    later = UOp.alu(BinaryOps.CMPNE, self.block_range, UOp.const(dtypes.int32, 0))
    def load(idx: sint, valid: sint, dt: DType) -> UOp:
      gate = later if valid == 1 else UOp.alu(BinaryOps.AND, self.sym_bool(valid), later)
      return UOp(UOps.LOAD, dt, (buf, self.sym_to_uop(idx, dtypes.int32), gate, UOp.const(dt, 0)))
    if kind == "scalar": prev = load(*data, mb.dtype)
    elif kind == "vector": prev = load(*data, mb.dtype.vec(self.W))
    else: prev = UOp(UOps.VECTORIZE, mb.dtype.vec(self.W), tuple(load(ix, vl, mb.dtype) for ix, vl in data))
    if prev.dtype.count < width: prev = UOp(UOps.VECTORIZE, prev.dtype.vec(width), (prev,) * width)
    return prev

  def _store(self, buf: UOp, idx: sint, valid: sint, v: UOp) -> UOp:
    if buf.op is UOps.DEFINE_GLOBAL and self.group:  # after a grouped reduce, only the group's first thread writes
      valid = sym_and(valid, *[sym_lt(self.idx_vars[a], 1) for a in self.group_axes])
    src = (buf, self.sym_to_uop(idx, dtypes.int32), v)
    if valid != 1: src += (self.sym_bool(valid),)
    return UOp(UOps.STORE, dtypes.void, src)

  def lower_op(self, op: LazyOp, inner: bool) -> dict[tuple, UOp]:
    key = ("op", op, inner)
    if (r := self.memo.get(key)) is not None: return r
    if op.op is BufferOps.LOAD: res = self.lower_load(op, inner)
    elif op.op is BufferOps.CONST: res = self.lower_const(op, inner)
    elif op.op in ReduceOps: res = self.lower_reduce(op)
    else:
      srcs = [self.lower_op(s, inner) for s in op.src]
      res = {lane: self.alu(op, [s[lane] for s in srcs]) for lane in self.lanes(inner)}
    self.memo[key] = res
    return res

  def lower_load(self, op: LazyOp, inner: bool) -> dict[tuple, UOp]:
    mb: MemBuffer = op.arg
    barrier = self._barrier(op.src[0]) if op.src else None  # a local buffer is loaded after its store and a barrier
    buf = self.buf_uop(mb)
    res = {}
    for lane in self.lanes(inner):
      idx, valid = self.index(mb.st, lane)
      kind, data = self.vec_form(idx, valid)
      if kind == "scalar": res[lane] = self._load(buf, *data, mb.dtype, barrier)
      elif kind == "vector": res[lane] = self._load(buf, *data, mb.dtype.vec(self.W), barrier)
      else: res[lane] = UOp(UOps.VECTORIZE, mb.dtype.vec(self.W), tuple(self._load(buf, ix, vl, mb.dtype, barrier) for ix, vl in data))
    return res

  def _barrier(self, store: LazyOp) -> UOp:
    key = ("barrier", store)
    if (r := self.memo.get(key)) is None: r = self.memo[key] = UOp(UOps.BARRIER, dtypes.void, tuple(self.lower_store(store)))
    return r

  def _load(self, buf: UOp, idx: sint, valid: sint, dtype: DType, barrier: Optional[UOp]) -> UOp:
    if valid == 0: return UOp.const(dtype, 0)
    src = (buf, self.sym_to_uop(idx, dtypes.int32))
    if valid != 1: src += (self.sym_bool(valid), UOp.const(dtype, 0))
    if barrier is not None: src += (barrier,)
    return UOp(UOps.LOAD, dtype, src)

  def lower_const(self, op: LazyOp, inner: bool) -> dict[tuple, UOp]:
    cb: ConstBuffer = op.arg
    if cb.val is INDEX: return self._lower_index(cb, inner)
    if isinstance(cb.val, Variable): c = self._sym(cb.val, dtypes.int64).cast(cb.dtype)
    else: c = UOp.const(cb.dtype, cb.val)
    res = {}
    for lane in self.lanes(inner):
      idx, valid = self.index(cb.st, lane)
      kind, data = self.vec_form(0, valid)
      if kind == "scalar": res[lane] = c if data[1] == 1 else self._where(self.sym_bool(data[1]), c, cb.dtype)
      else: res[lane] = UOp(UOps.VECTORIZE, cb.dtype.vec(self.W), tuple(c if vl == 1 else self._where(self.sym_bool(vl), c, cb.dtype) for _, vl in data))
    return res

  def _lower_index(self, cb: ConstBuffer, inner: bool) -> dict[tuple, UOp]:
    """An index constant: each element's flat index through its view, as cb.dtype (0 where masked)."""
    res = {}
    for lane in self.lanes(inner):
      kind, data = self.vec_form(*self.index(cb.st, lane))
      per = [data] if kind == "scalar" else [(data[0] + i, data[1]) for i in range(self.W)] if kind == "vector" else data
      vals = []
      for ix, vl in per:
        v = UOp.const(cb.dtype, 0) if vl == 0 else self.sym_to_uop(ix, dtypes.int32).cast(cb.dtype)
        vals.append(v if vl in (0, 1) else self._where(self.sym_bool(vl), v, cb.dtype))
      res[lane] = vals[0] if kind == "scalar" else UOp(UOps.VECTORIZE, cb.dtype.vec(self.W), tuple(vals))
    return res

  def _where(self, cond: UOp, c: UOp, dtype: DType) -> UOp: return UOp.alu(TernaryOps.WHERE, cond, c, UOp.const(dtype, 0))

  def alu(self, op: LazyOp, vals: list[UOp]) -> UOp:
    width = max(v.dtype.count for v in vals)
    if width > 1 and not _alu_vectorizable(self.ren, op, vals):
      return UOp(UOps.VECTORIZE, op.dtype.vec(width), tuple(self._scalar_alu(op, [v.gep(i) if v.dtype.count > 1 else v for v in vals]) for i in range(width)))
    if width > 1: vals = [v if v.dtype.count > 1 else UOp(UOps.VECTORIZE, v.dtype.vec(width), (v,) * width) for v in vals]
    return self._scalar_alu(op, vals, width)

  def _scalar_alu(self, op: LazyOp, vals: list[UOp], width: int = 1) -> UOp:
    dt = op.dtype.vec(width) if width > 1 else op.dtype
    if op.op is UnaryOps.CAST: return UOp(UOps.CAST, dt, (vals[0],))
    if op.op is UnaryOps.BITCAST: return UOp(UOps.BITCAST, dt, (vals[0],))
    if any(v.dtype.scalar() == dtypes.bfloat16 for v in vals):  # no bfloat16 arithmetic: compute in float
      f32 = dtypes.float32.vec(width) if width > 1 else dtypes.float32
      vals = [v.cast(f32) if v.dtype.scalar() == dtypes.bfloat16 else v for v in vals]
      res = UOp(UOps.ALU, f32 if dt.scalar() == dtypes.bfloat16 else dt, tuple(vals), op.op)
      return res.cast(dt)
    if op.op in (BinaryOps.IDIV, BinaryOps.MOD) and dtypes.is_int(dt): return _floor_divmod(op.op, vals[0], vals[1])
    return UOp(UOps.ALU, dt, tuple(vals), op.op)

  def lower_reduce(self, op: LazyOp) -> dict[tuple, UOp]:
    if op.op is ReduceOps.WMMA: return self.lower_wmma(op)
    if (collapsed := self._collapse_const_sum(op)) is not None: return collapsed
    red_axes = set(op.arg)
    # which loops this reduce runs over: the serial reduce loops, or in a grouped reduce's second
    # stage, loops over the group axes (whose index is then the loop, not the thread id)
    if op.src[0].op is BufferOps.LOAD and op.src[0].src:
      self._barrier(op.src[0].src[0])  # stage one is lowered with the thread ids
      group = self._group_ranges()
      saved = list(self.idx_vars)
      for a, v, _ in group: self.idx_vars[a] = v
      src = self.lower_op(op.src[0], inner=True)
      self.idx_vars = saved
      ranges = [r for _, _, r in group]
    else:
      src = self.lower_op(op.src[0], inner=True)
      ranges = [r for r in self.reduce_ranges if r.arg[1] in red_axes]
    init = _identity(op.op, op.dtype)
    res: dict[tuple, UOp] = {}
    magenta_pos = [j for j, a in enumerate(self.lane_axes) if a in self.magenta and a in red_axes]
    for lane in self.lanes(False):
      group = [src[l] for l in self.lanes(True) if all(l[j] == lane[j] for j in range(len(lane)) if j not in magenta_pos)]
      width = max(v.dtype.count for v in group)
      group = [v if v.dtype.count == width else UOp(UOps.VECTORIZE, v.dtype.vec(width), (v,) * width) for v in group]
      total = group[0]
      for v in group[1:]: total = self._combine(op.op, total, v)
      if not ranges:
        res[lane] = self._combine(op.op, total, self._earlier_blocks(lane, total.dtype.count)) if self.block_range is not None and self.block_in_acc else total
        continue
      dt = total.dtype
      self.acc_count += 1
      parent = ranges[0].src[2:]  # the loop around the reduce loops, if any
      start = self._earlier_blocks(lane, dt.count) if self.block_range is not None and self.block_in_acc else UOp.const(dt, init)
      acc = UOp(UOps.DEFINE_ACC, dt, (start,) + parent, self.acc_count)
      # the accumulator's value inside the loop changes every iteration: read it there (the ranges
      # in src keep the read, and everything computed from it, inside the loop)
      acc_in = UOp(UOps.ACCREAD, dt, (acc,) + tuple(ranges))
      phi = UOp(UOps.PHI, dt, (acc, self._combine(op.op, acc_in, total)) + tuple(ranges))
      # ENDRANGE marks "after the loop" (and keeps the update in the graph)
      res[lane] = UOp(UOps.ACCREAD, dt, (acc, UOp(UOps.ENDRANGE, dtypes.void, (ranges[0], phi))))
    if self.vax is not None and self.vax in self.magenta:  # the vector lanes were reduce lanes: combine them
      for lane, v in res.items():
        if v.dtype.count > 1: res[lane] = self._horizontal(op.op, v)
    return res

  # ---- tensor cores -------------------------------------------------------------------------------
  def lower_wmma(self, op: LazyOp) -> dict[tuple, UOp]:
    """A WMMA reduce: per thread, the A/B fragments are its operands' values at the register
    positions, C is a vector accumulator over C's register positions; the serial reduce loops
    accumulate, and unrolled (non-tile) reduce lanes chain one instruction each."""
    from tilecraft.renderer.tensor_cores import wmma_arg
    info = op.arg[4]
    tc = info.tc
    A, B = self.lower_op(op.src[0], inner=True), self.lower_op(op.src[1], inner=True)
    red = set(op.arg[-1])
    ranges = [r for r in self.reduce_ranges if r.arg[1] in red]
    pos = {a: i for i, a in enumerate(self.lane_axes)}
    tc_up = set(info.a_regs + info.b_regs + info.c_regs + info.k_axes)
    other = [a for a in self.lane_axes if a not in tc_up]
    yellow, mag = [a for a in other if a not in self.magenta], [a for a in other if a in self.magenta]
    nc = 1 << len(info.c_regs)
    vec = tc.dtype_out.vec(nc)
    def at(base: list[int], axes: tuple[int, ...], i: int) -> tuple[int, ...]:
      lane = list(base)
      for j, a in enumerate(axes): lane[pos[a]] = (i >> j) & 1
      return tuple(lane)
    def frag(vals: dict, base: list[int], axes: tuple[int, ...]) -> UOp:
      return UOp(UOps.VECTORIZE, tc.dtype_in.vec(1 << len(axes)), tuple(vals[at(base, axes, i)] for i in range(1 << len(axes))))
    res: dict[tuple, UOp] = {}
    for yl in itertools.product(*[range(self.shape[a]) for a in yellow]):
      base = [0] * len(self.lane_axes)
      for a, v in zip(yellow, yl): base[pos[a]] = v
      self.acc_count += 1
      acc = None
      if ranges:
        acc = UOp(UOps.DEFINE_ACC, vec, (UOp.const(vec, 0),) + ranges[0].src[2:], self.acc_count)
        c = UOp(UOps.ACCREAD, vec, (acc,) + tuple(ranges))
      else: c = UOp.const(vec, 0)
      for ml in itertools.product(*[range(self.shape[a]) for a in mag]):
        lane = list(base)
        for a, v in zip(mag, ml): lane[pos[a]] = v
        fa, fb = frag(A, lane, info.a_regs), frag(B, lane, info.b_regs)
        c = UOp(UOps.WMMA, vec, (fa, fb, c), wmma_arg(tc)) if info.use == 1 else self._emulate_wmma(info, fa, fb, c, ranges)
      if acc is not None:
        phi = UOp(UOps.PHI, vec, (acc, c) + tuple(ranges))
        c = UOp(UOps.ACCREAD, vec, (acc, UOp(UOps.ENDRANGE, dtypes.void, (ranges[0], phi))))
      for i in range(nc): res[at(base, info.c_regs, i)] = c.gep(i)
    return res

  def _emulate_wmma(self, info: Any, fa: UOp, fb: UOp, c: UOp, ranges: list[UOp]) -> UOp:
    """use 3: each lane stores its A and B registers to local memory in the vendor's layout; after a
    barrier each thread reads back, from the lanes and registers holding them, the A and B elements
    its C registers need, and multiply-adds them. The buffers alternate between two halves on
    successive reduce iterations, so one barrier per step keeps the next step's stores apart from
    this step's reads."""
    tc = info.tc
    lay = tc.layout
    n_lane = len(info.lanes)
    lane_bit = {j: self.idx_vars[info.lanes[n_lane - 1 - j]] for j in range(n_lane)}  # lane bit j -> its index variable
    own_lane: sint = sum((v * (1 << j) for j, v in lane_bit.items()), 0)
    others = [a for a in range(self.k.global_dims, self.first_reduce) if a not in info.lanes]
    warp: sint = 0
    for a in others: warp = warp * self.shape[a] + self.idx_vars[a]
    warps = prod(self.shape[a] for a in others)
    parity: sint = 0
    if ranges:
      it: sint = 0
      for r in ranges: it = it * _ceil(self.shape[r.arg[1]]) + self.idx_vars[r.arg[1]]
      parity = it % 2
    # which C coordinate bit each own lane / register bit is (C is a bijection), for reading back
    c_src: dict[str, tuple[str, int]] = {b: ("lane", j) for j, b in enumerate(lay.c.lanes)} | {b: ("reg", j) for j, b in enumerate(lay.c.regs)}
    def stage(frag: Any, v: UOp) -> tuple[UOp, UOp, int]:
      nregs = v.dtype.count
      size = warps * tc.threads * nregs * (2 if ranges else 1)
      self.acc_count += 1
      buf = UOp(UOps.DEFINE_LOCAL, tc.dtype_in.ptr(local=True), (), (f"tc{self.acc_count}", size))
      base = ((parity * warps + warp) * tc.threads + own_lane) * nregs
      stores = tuple(self._store(buf, base + r, 1, v.gep(r)) for r in range(nregs))
      return buf, UOp(UOps.BARRIER, dtypes.void, stores), nregs
    bufs = [stage(lay.a, fa), stage(lay.b, fb)]
    out = []
    n, m, kk = tc.dims
    for ci in range(c.dtype.count):
      total = c.gep(ci)
      for kv in range(kk):
        def bit(b: str) -> sint:  # the value of coordinate bit b for this thread's C register ci at k = kv
          if b[0] == "k": return (kv >> int(b[1:])) & 1
          kind, j = c_src[b]
          return lane_bit[j] if kind == "lane" else (ci >> j) & 1
        prods = []
        for (buf, barrier, nregs), frag in zip(bufs, (lay.a, lay.b)):
          lane: sint = sum((bit(b) * (1 << j) for j, b in enumerate(frag.lanes) if b is not None), 0)
          reg: sint = sum((bit(b) * (1 << j) for j, b in enumerate(frag.regs)), 0)
          idx = ((parity * warps + warp) * tc.threads + lane) * nregs + reg
          prods.append(self._load(buf, idx, 1, tc.dtype_in, barrier).cast(tc.dtype_out))
        total = UOp.alu(BinaryOps.ADD, total, UOp.alu(BinaryOps.MUL, prods[0], prods[1]))
      out.append(total)
    return UOp(UOps.VECTORIZE, c.dtype, tuple(out))

  def _horizontal(self, op: Any, v: UOp) -> UOp:
    parts = [v.gep(i) for i in range(v.dtype.count)]
    while len(parts) > 1: parts = [self._combine(op, parts[i], parts[i + 1]) if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
    return parts[0]

  def _collapse_const_sum(self, op: LazyOp) -> Optional[dict[tuple, UOp]]:
    """arange-style reduces: a SUM of a masked constant over a loop whose mask bounds the loop
    variable linearly is a count, computed in closed form instead of looping."""
    if op.op is not ReduceOps.SUM: return None
    src, casts = op.src[0], []
    while src.op is UnaryOps.CAST: casts.append(src.arg); src = src.src[0]
    if src.op is not BufferOps.CONST or isinstance(src.arg.val, Variable) or src.arg.val is INDEX: return None
    if any(a in self.magenta or a == self.vax for a in op.arg if self.shape[a] != 1): return None
    loop_vars = {self.idx_vars[a]: a for a in op.arg if isinstance(self.idx_vars[a], Variable) and a in self.red_axes}
    if not loop_vars: return None
    c = src.arg.val
    for dt in reversed(casts): c = dtypes.as_const(c, dt)
    res: dict[tuple, UOp] = {}
    for lane in self.lanes(False):
      _, valid = self.index(src.arg.st, lane)
      per = [valid] if self.vlane is None or not (isinstance(valid, Node) and self.vlane in valid.vars()) else [_subst(valid, self.vlane, i) for i in range(self.W)]
      counts = [self._count(v, loop_vars) for v in per]
      if any(x is None for x in counts): return None
      vals = [UOp.alu(BinaryOps.MUL, n.cast(op.dtype), UOp.const(op.dtype, c)) for n in counts]  # type: ignore[union-attr]
      res[lane] = vals[0] if len(vals) == 1 else UOp(UOps.VECTORIZE, op.dtype.vec(self.W), tuple(vals))
    return res

  def _count(self, valid: sint, loop_vars: dict[Variable, int]) -> Optional[UOp]:
    """How many values of the loop variables make `valid` true, if it bounds one of them linearly."""
    conds = [] if valid == 1 else list(valid.nodes) if isinstance(valid, And) else [valid]
    dep = {v for cnd in conds if isinstance(cnd, Node) for v in cnd.vars() if v in loop_vars}
    if len(dep) > 1: return None
    r = next(iter(dep)) if dep else None
    size = prod(self.shape[a] for v, a in loop_vars.items() if v is not r)
    lo: list[sint] = [0]
    hi: list[sint] = [self.shape[loop_vars[r]]] if r is not None else []
    free: list[sint] = []
    for cnd in conds:
      if r is None or r not in cnd.vars(): free.append(cnd); continue
      negated = isinstance(cnd, Sum) and cnd.const == 1 and len(cnd.terms) == 1 and cnd.terms[0][1] == -1 and isinstance(cnd.terms[0][0], Lt)
      lt = cnd.terms[0][0] if negated else cnd
      if not isinstance(lt, Lt): return None
      terms = dict(lt.a.terms) if isinstance(lt.a, Sum) else {lt.a: 1}
      coef = terms.get(r)
      if coef not in (1, -1): return None
      rest = lt.a - r * coef
      if isinstance(rest, Node) and r in rest.vars(): return None
      # coef*r + rest < b
      if coef == 1: (lo if negated else hi).append(lt.b - rest)
      else: (hi if negated else lo).append(rest - lt.b + 1)
    # the count is at most the product of the loop sizes; top - bot at most the sum of their magnitudes
    total = prod(_ceil(self.shape[a]) for a in loop_vars.values())
    wide = total > INT32_MAX or 2 * max(_maxabs(x) for x in lo + hi) > INT32_MAX or any(self._needs_int64(x) for x in lo + hi)
    dt = dtypes.int64 if wide else dtypes.int32
    if r is None: n: UOp = UOp.const(dt, 1)
    else:
      lo_u = [self._sym(x, dt) for x in lo]
      hi_u = [self._sym(x, dt) for x in hi]
      top, bot = hi_u[0], lo_u[0]
      for h in hi_u[1:]: top = UOp.alu(UnaryOps.NEG, UOp.alu(BinaryOps.MAX, UOp.alu(UnaryOps.NEG, top), UOp.alu(UnaryOps.NEG, h)))
      for b in lo_u[1:]: bot = UOp.alu(BinaryOps.MAX, bot, b)
      n = UOp.alu(BinaryOps.MAX, UOp.alu(BinaryOps.SUB, top, bot), UOp.const(dt, 0))
    if size != 1: n = UOp.alu(BinaryOps.MUL, n, UOp.const(dt, size))
    if free: n = UOp.alu(TernaryOps.WHERE, self.sym_bool(sym_and(*free)), n, UOp.const(dt, 0))
    return n

  def _group_ranges(self) -> list[UOp]:
    """Loops over the group axes for a grouped reduce's second stage (reading local memory)."""
    ranges = []
    for a in self.group_axes:
      if self.shape[a] == 1: continue
      v = Variable(f"gridx{a}", 0, self.shape[a] - 1)
      r = UOp(UOps.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 0), UOp.const(dtypes.int32, self.shape[a])) + ((ranges[-1],) if ranges else ()), ("reduce", a))
      self.varmap[v] = r
      ranges.append((a, v, r))
    return ranges

  def _combine(self, op: Any, a: UOp, b: UOp) -> UOp:
    alu = BinaryOps.ADD if op is ReduceOps.SUM else BinaryOps.MAX
    if a.dtype.count > 1 and not _vector_op_ok(self.ren, alu, a.dtype):
      return UOp(UOps.VECTORIZE, a.dtype, tuple(UOp.alu(alu, a.gep(i), b.gep(i)) for i in range(a.dtype.count)))
    return UOp.alu(alu, a, b)

def _floor_divmod(op: Any, a: UOp, b: UOp) -> UOp:
    """numpy semantics for integer // and %: floor rounding, and 0 when dividing by 0 (C would trap)."""
    dt = a.dtype
    c = lambda v: UOp.const(dt, v)  # noqa: E731
    nonzero = UOp.alu(BinaryOps.CMPNE, b, c(0))
    if dtypes.is_unsigned(dt):
      safe_b = UOp.alu(TernaryOps.WHERE, nonzero, b, c(1))
      q, r = UOp.alu(BinaryOps.IDIV, a, safe_b), UOp.alu(BinaryOps.MOD, a, safe_b)
    else:
      # b == -1 is a negation: the hardware traps on MIN // -1, numpy wraps
      not_neg1 = UOp.alu(BinaryOps.CMPNE, b, c(-1))
      safe_b = UOp.alu(TernaryOps.WHERE, UOp.alu(BinaryOps.AND, nonzero, not_neg1), b, c(1))
      q = UOp.alu(TernaryOps.WHERE, not_neg1, UOp.alu(BinaryOps.IDIV, a, safe_b), UOp.alu(BinaryOps.SUB, c(0), a))
      r = UOp.alu(BinaryOps.MOD, a, safe_b)
    if dtypes.is_unsigned(dt): res = q if op is BinaryOps.IDIV else r
    else:
      # truncation differs from floor when the remainder is nonzero and its sign differs from b's
      adjust = UOp.alu(BinaryOps.AND, UOp.alu(BinaryOps.CMPNE, r, c(0)),
                       UOp.alu(BinaryOps.CMPNE, UOp.alu(BinaryOps.CMPLT, r, c(0)), UOp.alu(BinaryOps.CMPLT, safe_b, c(0))))
      if op is BinaryOps.IDIV: res = UOp.alu(BinaryOps.SUB, q, adjust.cast(dt))
      else: res = UOp.alu(BinaryOps.ADD, r, UOp.alu(TernaryOps.WHERE, adjust, safe_b, c(0)))
    return UOp.alu(TernaryOps.WHERE, nonzero, res, c(0))

def _identity(op: Any, dtype: DType) -> Any:
  if op is ReduceOps.SUM: return 0
  return dtypes.min(dtype.scalar())

def _direct_unit_term(idx: sint, v: Variable) -> bool:
  """idx == v + (terms free of v)."""
  if idx == v: return True
  if not isinstance(idx, Sum): return False
  return all((t == v and c == 1) or (t != v and v not in t.vars()) for t, c in idx.terms) and any(t == v for t, _ in idx.terms)

def _is_zero(x: sint) -> bool: return isinstance(x, int) and x == 0

def _subst(x: sint, v: Optional[Variable], i: int) -> sint:
  return x.substitute({v: i}) if isinstance(x, Node) and v is not None else x

def _maxabs(x: sint) -> int: return abs(x) if isinstance(x, int) else max(abs(x.vmin), abs(x.vmax))

def _needs_int64(x: sint) -> bool:
  """Whether computing x in int32 could overflow: x, any subexpression, any partial sum of a Sum (summed
  by magnitude, so any order of the terms is safe), a Lt bound, or the shifted numerator that lowering
  builds for a floor division of a possibly negative value."""
  if isinstance(x, int): return not -INT32_MAX <= x <= INT32_MAX
  stack = [x]
  while stack:
    n = stack.pop()
    if n.vmax > INT32_MAX or n.vmin < -INT32_MAX: return True
    if isinstance(n, Sum) and abs(n.const) + sum(abs(c) * _maxabs(t) for t, c in n.terms) > INT32_MAX: return True
    if isinstance(n, Lt) and not -INT32_MAX <= n.b <= INT32_MAX: return True
    if isinstance(n, (Div, Mod)) and isinstance(n.b, int) and isinstance(n.a, Node) and n.a.vmin < 0 and n.a.vmax - (n.a.vmin // n.b) * n.b > INT32_MAX: return True
    stack.extend(n.children())
  return False

def _vectorizable(ren: Any, dt: DType) -> bool: return dt.scalar() in getattr(ren, "vector_dtypes", ())
def _vector_op_ok(ren: Any, op: Any, dt: DType) -> bool:
  return dt.scalar() in getattr(ren, "vector_dtypes", ()) and op in getattr(ren, "vector_alu", ())
def _alu_vectorizable(ren: Any, op: LazyOp, vals: list[UOp]) -> bool:
  if op.op in (UnaryOps.CAST, UnaryOps.BITCAST): return False
  return _vector_op_ok(ren, op.op, op.dtype) and all(_vectorizable(ren, v.dtype) for v in vals)

def lower_kernel(k: Any) -> UOp:
  """The kernel's UOp graph (a SINK of stores), simplified by the rewrite rules."""
  ast = k.get_optimized_ast()
  sink = Lowerer(k, ast).lower()
  rules = symbolic_rules
  extra = getattr(k.opts, "extra_rewrites", None)
  if extra is not None: rules = rules + extra
  return graph_rewrite(sink, rules)
