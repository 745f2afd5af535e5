"""Lowering: an optimized kernel AST -> a UOp graph (a SINK of STOREs).

Axes become index variables of the one symbolic system: global axes are loops on a CPU (the
outermost runs in parallel) and group/thread ids on GPUs; reduce axes are loops; upcast and
unrolled axes are expanded into lanes. One upcast axis (the vector axis, contiguous in the
output) stays a vector: values along it are single vector UOps (float4, float8, ...), so loads,
stores and arithmetic along it are vector instructions. Index expressions are built and
simplified symbolically, then converted to UOps.

The Lowerer is split by idea: this file holds axes, lanes, loads, stores and arithmetic;
lower_index.py turns index expressions into integer UOps, lower_reduce.py lowers reduces (loops,
grouped second stages, closed-form counts) and lower_wmma.py lowers tensor-core reduces.
"""
from __future__ import annotations
import itertools
from typing import Any, Optional
from tilecraft.codegen.rewrite import graph_rewrite, symbolic_rules
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import DType, ImageDType, dtypes
from tilecraft.helpers import prod
from tilecraft.ops import INDEX, BinaryOps, BufferOps, ConstBuffer, LazyOp, MemBuffer, ReduceOps, TernaryOps, UnaryOps
from tilecraft.renderer import Renderer
from tilecraft.shape.shapetracker import ShapeTracker
from tilecraft.shape.symbolic import And, Node, Sum, Variable, sint, sym_and, sym_lt
from tilecraft.codegen.lower_index import IndexLowering, _ceil, _floor_divmod, _subst
from tilecraft.codegen.lower_reduce import ReduceLowering
from tilecraft.codegen.lower_wmma import TensorCoreLowering
from tilecraft.codegen.lower_image import ImageLowering, ImageLoweringError
from tilecraft.codegen.lower_pack import PackLowering

# blocked sums (Lowerer._blocked_sum_axis): loops of at least this many iterations, at most this many
# accumulators, blocks of at least this many iterations
BLOCKED_SUM_MIN, BLOCKED_SUM_MAX_ACCS, BLOCKED_SUM_BLOCK = 256, 4, 16

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

class Lowerer(IndexLowering, ReduceLowering, TensorCoreLowering, ImageLowering, PackLowering):
  def __init__(self, k: Any, ast: LazyOp):
    self.k, self.ast, self.ren = k, ast, k.opts
    self.shape = k.full_shape
    n = k.shape_len
    self.first_upcast, self.first_reduce, self.group = k.first_upcast, k.first_reduce, k.group_for_reduces
    self.red_axes = list(range(self.first_reduce + self.group, self.first_upcast))
    self.group_axes = list(range(self.first_reduce, self.first_reduce + self.group))
    # UPCASTMID's (white) axes: thread ids in a grouped reduce's first stage, lanes after it (`mid`)
    self.white = [a for a in k.upcast_in_mid_reduce_axes if k.full_shape[a] != 1]
    self.mid: Optional[tuple[int, ...]] = None
    self.upcast_axes = list(range(self.first_upcast, n))
    self.magenta = [a for a in self.upcast_axes if k.full_shape[a] != k.output_shape[a]]
    self.vax = self._pick_vector_axis()
    # use 3 on a target without threads (CPU): the tensor core's lane axes are expanded lanes, not
    # loops, so one thread holds a whole warp and can stage its fragments through a stack array
    self.warp_axes: list[int] = self._warp_axes()
    self.lane_axes = self.warp_axes + [a for a in self.upcast_axes if a != self.vax]
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
    # a dependent reduce (one that reads another reduce's result) runs its own loops over the reduce
    # axes: `loop` numbers the loops whose variables idx_vars holds now (0: the kernel's reduce loops)
    self.loop, self.loops = 0, 0
    self.prefetches: list[UOp] = []  # cache hints issued in dependent loops (see lower_load)
    self._make_index_vars()
    self.thread_vars: list[sint] = list(self.idx_vars)  # the ids, also while `mid` sets the white axes
    self.base_vars: list[sint] = list(self.idx_vars)

  # ---- axes ---------------------------------------------------------------------------------------
  def _pick_vector_axis(self) -> Optional[int]:
    """The upcast axis kept as vector lanes: an output axis the output walks contiguously, or an
    unrolled reduce axis (vector accumulators, one horizontal reduce after the loop). Among those,
    the one where the fewest inputs need gathers, then the most read contiguously."""
    if not self.ren.supports_float4: return None
    if any(not _vectorizable(self.ren, b.dtype) for b in self.k.bufs): return None
    if any(x.op is ReduceOps.WMMA for x in self.ast.lazyops): return None  # fragments are gathered lane by lane
    # a padded output axis (PADTO) still walks the output contiguously: its lanes past the end are gated stores
    out_rs = self.k.sts[0].real_strides(ignore_valid=True)
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

  def _warp_axes(self) -> list[int]:
    st = getattr(self.k, "tensor_core_opts", None)
    if st is None or st.use != 3 or self.ren.has_local: return []
    from tilecraft.codegen.tensor_cores import tc_axes
    return tc_axes(self.k)[0]

  def _make_index_vars(self) -> None:
    shape = self.shape
    def var(name: str, s: sint) -> sint: return 0 if s == 1 else Variable(name, 0, _ceil(s) - 1)
    if not self.ren.has_local:
      # CPU: global axes are nested loops, the outermost parallel unless the kernel is too small
      # for waking the other cores to pay off
      work = prod(shape)
      parallel = not isinstance(work, int) or work >= 1 << 15
      parent: Optional[UOp] = None
      # BLOCK with one output loop (column sums: its tiles): the block loop goes outside it, so each
      # thread walks a block of rows across all its tiles (whole pages of each row, not a few lines)
      loops = self.loop_axes = [i for i in range(self.first_reduce) if not (isinstance(shape[i], int) and shape[i] == 1)]
      if self.block_axis is not None and len(loops) == 1: parent = self._make_block_range(None)
      first = True
      for i in range(self.first_reduce):
        if i in self.warp_axes: continue  # expanded lanes: set per lane (index)
        v = var(f"gidx{i}", shape[i])
        self.idx_vars[i] = v
        if isinstance(v, Variable):
          r = self._range(shape[i], parent, ("parallel" if first and parallel else "global", i))
          self.varmap[v] = r
          parent, first = r, False
          if self.block_axis is not None and self.block_range is None: parent = self._make_block_range(parent)
      if self.block_axis is not None and self.block_range is None: parent = self._make_block_range(parent)
      self.outer_range = parent
    else:
      self._make_gpu_ids(var)
    parent = self.outer_range
    split = self._blocked_sum_axis()
    self.reduce_ranges = []
    for i in self.red_axes:
      if i == self.block_axis: continue
      if split is not None and i == split[0]:
        # a blocked sum (see _blocked_sum_axis): the loop runs as nested loops, outermost first; the index
        # is their mixed-radix number, and every loop but the outermost is a block with an accumulator
        sizes = split[1]
        idx: sint = 0
        for j, size in enumerate(sizes):
          v = Variable(f"ridx{i}" + "b" * j, 0, size - 1)
          r = self._range(size, parent, ("reduce", i) if j == 0 else ("reduce", i, "block"))
          self.varmap[v] = r
          self.reduce_ranges.append(r)
          idx, parent = idx * size + v, r
        self.idx_vars[i] = idx
        continue
      v = var(f"ridx{i}", shape[i])
      self.idx_vars[i] = v
      if isinstance(v, Variable):
        r = self._range(shape[i], parent, ("reduce", i))
        self.varmap[v] = r
        self.reduce_ranges.append(r)
        parent = r

  def _blocked_sum_axis(self) -> Optional[tuple[int, list[int]]]:
    """(axis, loop sizes, outermost first) where a float SUM's innermost reduce loop should run as nested
    loops whose inner ones are blocks: each block adds its iterations in an accumulator of its own, then
    into the block around it. One accumulator over n iterations loses about n roundings' worth of
    precision (the mean of 30M floats of 0.1 was off by 2e-3); blocks of about n^(1/3) at two levels
    (n^(1/2) for shorter loops) cut that to a few n^(1/3), for one add per block. Only where there are
    few accumulators (each gets one per level) and nothing else shapes the reduce loops (grouped, BLOCK,
    tensor-core, packed and dependent reduces keep theirs). None where the loop stays as it is."""
    reduces = [x for x in self.ast.lazyops if x.op in ReduceOps]
    if len(reduces) != 1 or reduces[0].op is not ReduceOps.SUM or not dtypes.is_float(reduces[0].dtype): return None
    if self.group or self.block_axis is not None or getattr(self.k, "tensor_core_opts", None) is not None or getattr(self.k, "packed", ()): return None
    if self.k.const_sum_reduce(): return None  # a count in closed form (lower_reduce: _collapse_const_sum) needs the plain loop
    axes = [i for i in self.red_axes if isinstance(self.shape[i], int) and self.shape[i] > 1]
    if not axes or axes[-1] != self.red_axes[-1]: return None
    a, n = axes[-1], self.shape[axes[-1]]
    if n < BLOCKED_SUM_MIN or prod(self.shape[x] for x in self.lane_axes if x not in self.magenta) > BLOCKED_SUM_MAX_ACCS: return None
    sizes: list[int] = []
    for levels in ((3, 2) if n >= BLOCKED_SUM_MIN ** 1.5 else (2,)):
      divs = [d for d in range(BLOCKED_SUM_BLOCK, n // BLOCKED_SUM_BLOCK + 1) if n % d == 0]
      if not divs: break
      target = n ** (1 / levels)
      b = min(divs, key=lambda d: max(d / target, target / d))  # the block nearest n^(1/levels)
      sizes.insert(0, b)
      n //= b
    return (a, [n] + sizes) if sizes else None

  def _make_block_range(self, parent: Optional[UOp]) -> UOp:
    """BLOCK: the loop over blocks of the reduce, inside the outermost output loop and around the
    other output loops (outside the output loop when there is only one); the accumulators live
    inside it (see lower_store)."""
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

  # ---- lanes --------------------------------------------------------------------------------------
  def lanes(self, inner: bool) -> list[tuple[int, ...]]:
    sizes = [self.shape[a] if (inner or a not in self.magenta) else 1 for a in self.lane_axes]
    return list(itertools.product(*[range(s) for s in sizes]))

  def index(self, st: ShapeTracker, lane: tuple[int, ...]) -> tuple[sint, sint]:
    # lanes differing only along axes the buffer ignores (stride 0, not in its mask: a conv's weights
    # along the output rows) share one index expression, computed once
    if (fixed := self.memo.get(("fixed", st))) is None:
      rs = st.real_strides()
      fixed = self.memo[("fixed", st)] = tuple(i for i, a in enumerate(self.lane_axes) if rs[a] == 0 and not st.axis_is_masked(a))
    if fixed: lane = tuple(0 if i in fixed else v for i, v in enumerate(lane))
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

  def vec_form(self, idx: sint, valid: sint, masked: bool = False) -> tuple[str, Any]:
    """How an access varies along the vector axis: ('scalar', (idx, valid)), ('vector', (base, valid))
    for unit stride, or ('gather', [(idx, valid)] per lane). `masked`: a unit-stride access whose
    validity varies by lane is ('masked', (base, valid, the gather's lanes)) instead."""
    if self.vlane is None: return "scalar", (idx, valid)
    v = self.vlane
    in_valid = isinstance(valid, Node) and v in valid.vars()
    in_idx = isinstance(idx, Node) and v in idx.vars()
    if not in_idx and not in_valid: return "scalar", (idx, valid)
    if _direct_unit_term(idx, v):
      base = idx - v
      if not in_valid: return "vector", (base, valid)
      if masked: return "masked", (base, valid, None)  # the lanes only if the caller falls back to them (lane_forms)
      per = self.lane_forms(base, valid)
    else:
      per = [(self._at_lane(idx, i), self._at_lane(valid, i)) for i in range(self.W)]
      # unit stride: lane i reads base + i for every lane (checked lane by lane, exactly)
      if not all(_is_zero(ix - (per[0][0] + i)) for i, (ix, _) in enumerate(per)): return "gather", per
      base = per[0][0]
      if not in_valid: return "vector", (base, valid)
    return ("masked", (base, valid, per)) if masked else ("gather", per)

  def lane_forms(self, base: sint, valid: sint) -> list[tuple[sint, sint]]:
    """(index, valid) of each lane of a unit-stride access at `base`."""
    return [(base + i, self._at_lane(valid, i)) for i in range(self.W)]

  def masked_gate(self, valid: sint) -> Optional[UOp]:
    """The bool-vector gate of a unit-stride access whose validity varies by lane: the lane-free
    conjuncts (a row mask) as one scalar splat, ANDed with the lane-dependent ones evaluated per lane
    (a column mask, the same in every iteration of the loops inside the one that sets it). None
    where the target has no masked vector loads."""
    if not self.ren.masked_loads: return None
    key = ("mgate", valid)
    if (r := self.memo.get(key)) is not None: return r
    assert self.vlane is not None
    parts = valid.nodes if isinstance(valid, And) else (valid,)
    free = sym_and(*[p for p in parts if not (isinstance(p, Node) and self.vlane in p.vars())])
    per_lane = sym_and(*[p for p in parts if isinstance(p, Node) and self.vlane in p.vars()])
    vb, lanes = dtypes.bool.vec(self.W), [self._at_lane(per_lane, i) for i in range(self.W)]
    if all(isinstance(m, int) for m in lanes) and len(set(lanes)) == 1: r = self.sym_bool(sym_and(free, lanes[0]))  # one gate for all lanes
    else:
      r = UOp(UOps.VECTORIZE, vb, tuple(self.sym_bool(m) for m in lanes))
      if free != 1: r = UOp.alu(BinaryOps.AND, r, UOp(UOps.VECTORIZE, vb, (self.sym_bool(free),) * self.W))
    self.memo[key] = r
    return r

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
    return UOp(UOps.SINK, dtypes.void, tuple(stores) + tuple(dict.fromkeys(self.prefetches)) + tuple(dict.fromkeys(args)))

  def buf_uop(self, mb: MemBuffer) -> UOp:
    if mb.idx < 0: return UOp(UOps.DEFINE_LOCAL, mb.dtype.ptr(local=True), (), (f"temp{-mb.idx}", mb.st.real_size()))
    return UOp(UOps.DEFINE_GLOBAL, mb.dtype if isinstance(mb.dtype, ImageDType) else mb.dtype.ptr(), (), mb.idx)

  def lower_store(self, op: LazyOp) -> list[UOp]:
    """A STORE's UOps. With white axes, a global store is lowered once per white index (`mid`): the
    first thread of the group writes the values of all of them."""
    mb: MemBuffer = op.arg
    combos = list(itertools.product(*[range(self.shape[a]) for a in self.white])) if self.white and mb.idx >= 0 else [None]
    image = isinstance(mb.dtype, ImageDType)
    out: list[UOp] = []
    elems: list = []
    for combo in combos:
      saved = (list(self.idx_vars), self.mid)
      if combo is not None:
        for a, c in zip(self.white, combo): self.idx_vars[a] = c
        self.mid = combo
      try:
        val = self.lower_op(op.src[0], inner=False)
        if image: elems += self.image_elems(mb, val)
        else: out += self._store_lanes(mb, val)
      finally: self.idx_vars, self.mid = saved
    return self.image_stores(mb, elems) if image else out

  def _store_lanes(self, mb: MemBuffer, val: dict[tuple, UOp]) -> list[UOp]:
    buf = self.buf_uop(mb)
    out = []
    # a unit-stride store whose validity varies by lane (a padded row's last vector) is one masked
    # vector store on targets with masked loads and stores, lane by lane elsewhere
    masked = self.ren.masked_loads and buf.op is UOps.DEFINE_GLOBAL and not self.group
    for lane in self.lanes(False):
      v = val[lane]
      idx, valid = self.index(mb.st, lane)
      kind, data = self.vec_form(idx, valid, masked=masked and v.dtype.count > 1)
      if self.block_range is not None and not self.block_in_acc: v = self._combine(ReduceOps.SUM, v, self._earlier_blocks(lane, v.dtype.count))
      if kind == "masked" and (gate := self.masked_gate(data[1])) is not None:
        out.append(UOp(UOps.STORE, dtypes.void, (buf, self.sym_to_uop(data[0], dtypes.int32), v, gate)))
        continue
      if kind == "masked": kind, data = "gather", data[2] or self.lane_forms(data[0], data[1])
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

  def _store(self, buf: UOp, idx: sint, valid: sint, v: UOp) -> UOp: return self._store_at(buf, self.sym_to_uop(idx, dtypes.int32), valid, v)
  def _store_at(self, buf: UOp, at: UOp, valid: sint, v: UOp) -> UOp:
    if buf.op is UOps.DEFINE_GLOBAL and self.group:  # after a grouped reduce, only the group's first thread writes
      valid = sym_and(valid, *[sym_lt(self.thread_vars[a], 1) for a in self.group_axes])
    src = (buf, at, v)
    if valid != 1: src += (self.sym_bool(valid),)
    return UOp(UOps.STORE, dtypes.void, src)

  def lower_op(self, op: LazyOp, inner: bool) -> dict[tuple, UOp]:
    key = ("op", op, inner, self.mid, self.loop)
    if (r := self.memo.get(key)) is not None: return r
    if op.op in ReduceOps and (inner or self.loop):
      # a reduce read inside another reduce (broadcast over its axes): lowered once, on the kernel's
      # own reduce loops, and the same value used for every unrolled lane of the reader
      saved = (list(self.idx_vars), self.loop)
      for a in self.red_axes: self.idx_vars[a] = self.base_vars[a]
      self.loop = 0
      try: outer = self.lower_op(op, False)
      finally: self.idx_vars, self.loop = saved
      mag = [a in self.magenta for a in self.lane_axes]
      res = {lane: outer[tuple(0 if m else i for m, i in zip(mag, lane))] for lane in self.lanes(inner)}
    elif op.op is BufferOps.LOAD: res = self.lower_load(op, inner)
    elif op.op is BufferOps.CONST: res = self.lower_const(op, inner)
    elif op.op in ReduceOps: res = self.lower_reduce(op)
    else:
      self._lower_sources(op, inner)
      srcs = [self.lower_op(s, inner) for s in op.src]
      res = {lane: self.alu(op, [s[lane] for s in srcs]) for lane in self.lanes(inner)}
    self.memo[key] = res
    return res

  def _lower_sources(self, op: LazyOp, inner: bool) -> None:
    """Lower the elementwise ops under op in the order lower_op's own recursion would (sources first,
    left to right), with an explicit stack: an expression may be deeper than Python's recursion
    limit. Loads, constants and reduces are lowered where they come, without looking inside."""
    stack = [(s, False) for s in reversed(op.src)]
    while stack:
      x, ready = stack.pop()
      if ("op", x, inner, self.mid, self.loop) in self.memo: continue
      if ready or not x.src or x.op in ReduceOps or x.op in BufferOps: self.lower_op(x, inner)
      else:
        stack.append((x, True))
        stack.extend((s, False) for s in reversed(x.src))

  def lower_load(self, op: LazyOp, inner: bool) -> dict[tuple, UOp]:
    mb: MemBuffer = op.arg
    if mb.idx in getattr(self.k, "packed", ()): return self.lower_packed_load(mb, inner)
    barrier = self._barrier(op.src[0]) if op.src else None  # a local buffer is loaded after its store and a barrier
    buf = self.buf_uop(mb)
    res = {}
    for lane in self.lanes(inner):
      idx, valid = self.index(mb.st, lane)
      if isinstance(mb.dtype, ImageDType):
        res[lane] = self.image_load_lane(buf, mb, idx, valid)
        continue
      kind, data = self.vec_form(idx, valid, masked=barrier is None)
      if self.loop and kind in ("vector", "masked"): self._prefetch_next(buf, data[0])
      if kind == "masked" and (gate := self.masked_gate(data[1])) is not None:
        vdt = mb.dtype.vec(self.W)
        res[lane] = UOp(UOps.LOAD, vdt, (buf, self.sym_to_uop(data[0], dtypes.int32), gate, UOp.const(vdt, 0)))
        continue
      if kind == "masked": kind, data = "gather", data[2] or self.lane_forms(data[0], data[1])
      if kind == "scalar": res[lane] = self._load(buf, *data, mb.dtype, barrier)
      elif kind == "vector": res[lane] = self._load(buf, *data, mb.dtype.vec(self.W), barrier)
      else: res[lane] = UOp(UOps.VECTORIZE, mb.dtype.vec(self.W), tuple(self._load(buf, ix, vl, mb.dtype, barrier) for ix, vl in data))
    return res

  def _prefetch_next(self, buf: UOp, idx: sint) -> None:
    """In a dependent reduce's loop (which re-reads a row from cache) the memory is idle: ask for what
    the same load reads in the next iteration of the loop around the reduce (on targets with has_prefetch)."""
    if not self.ren.has_prefetch or buf.op is not UOps.DEFINE_GLOBAL or self.outer_range is None: return
    g = next((v for v, r in self.varmap.items() if r is self.outer_range), None)
    if g is None or not isinstance(idx, Node) or g not in idx.vars(): return
    self.prefetches.append(UOp(UOps.PREFETCH, dtypes.void, (buf, self.sym_to_uop(_subst(idx, g, g + 1), dtypes.int32))))

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

  def vector_op_ok(self, op: Any, dt: DType) -> bool: return _vector_op_ok(self.ren, op, dt)

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

def _direct_unit_term(idx: sint, v: Variable) -> bool:
  """idx == v + (terms free of v)."""
  if idx == v: return True
  if not isinstance(idx, Sum): return False
  return all((t == v and c == 1) or (t != v and v not in t.vars()) for t, c in idx.terms) and any(t == v for t, _ in idx.terms)

def _is_zero(x: sint) -> bool: return isinstance(x, int) and x == 0

def _vectorizable(ren: Renderer, dt: DType) -> bool: return dt.scalar() in ren.vector_dtypes
def _vector_op_ok(ren: Renderer, op: Any, dt: DType) -> bool:
  return dt.scalar() in ren.vector_dtypes and op in ren.vector_alu
def _alu_vectorizable(ren: Renderer, op: LazyOp, vals: list[UOp]) -> bool:
  if op.op in (UnaryOps.CAST, UnaryOps.BITCAST): return False
  if ren.vector_masks and op.op in ren.vector_alu:
    # a target with lane masks compares vectors into a bool vector, and WHERE selects lanes by one
    if op.op in (BinaryOps.CMPLT, BinaryOps.CMPNE): return all(_vectorizable(ren, v.dtype) for v in vals)
    if op.op is TernaryOps.WHERE:
      return vals[0].dtype.scalar() == dtypes.bool and _vectorizable(ren, op.dtype) and all(_vectorizable(ren, v.dtype) for v in vals[1:])
  return _vector_op_ok(ren, op.op, op.dtype) and all(_vectorizable(ren, v.dtype) for v in vals)

def lower_kernel(k: Any) -> UOp:
  """The kernel's UOp graph (a SINK of stores), simplified by the rewrite rules."""
  check_images(k)
  ast = k.get_optimized_ast()
  sink = Lowerer(k, ast).lower()
  return graph_rewrite(sink, symbolic_rules)

def check_images(k: Any) -> None:
  """Image buffers need a target with images, fit its size limit, and are read-only or write-only in a kernel."""
  imgs = {b.idx: b.dtype for b in k.membufs if b.idx >= 0 and isinstance(b.dtype, ImageDType)}
  if not imgs: return
  ren = k.opts
  if not ren.supports_images:
    raise ImageLoweringError(f"{ren.device or type(ren).__name__} has no image buffers ({', '.join(repr(d) for d in imgs.values())}): "
                             "images are an OPENCL feature (on a device with image support)")
  wmax, hmax = ren.image_max
  for i, d in imgs.items():
    if d.shape[1] > wmax or d.shape[0] > hmax: raise ImageLoweringError(f"buffer {i}: {d!r} is over the device's image limit of {wmax}x{hmax} texels")
    if i < len(k.outbufs) and any(x.op is BufferOps.LOAD and x.arg.idx == i for x in k.ast.lazyops):
      raise ImageLoweringError(f"buffer {i}: an image is read-only or write-only in one kernel, this one reads and writes it")
