"""Lowering: an optimized kernel AST and a renderer -> a UOp graph (a SINK of STOREs).

`lower_kernel(ast, renderer)` is the whole interface: the AST is Kernel.get_optimized_ast()'s (its
leaves' views and its KernelInfo say everything about the layout, lower_state.py), and nothing else
about the Kernel is read. Index expressions are built and simplified symbolically, then converted to
UOps (lower_index.py).

The passes are functions of one LoweringState (lower_state.py: the layout, the renderer, the index
variables and loops made so far, the memo). This file holds the AST walk (lower_op), loads, stores,
constants and arithmetic; lower_reduce.py lowers reduces (loops, grouped second stages, closed-form
counts), lower_wmma.py tensor-core reduces, lower_image.py image loads and stores, lower_pack.py
packed (PACK) loads. They import the state, never this file: where a pass needs to lower a
sub-expression it is handed `lower_op` (and `barrier`) as arguments.
"""
from __future__ import annotations
import itertools
from typing import Optional
from tilecraft.codegen.lower_image import ImageLoweringError, check_images, image_elems, image_load_lane, image_stores  # noqa: F401 - ImageLoweringError: public here
from tilecraft.codegen.lower_index import _floor_divmod
from tilecraft.codegen.lower_pack import lower_packed_load
from tilecraft.codegen.lower_reduce import lower_reduce
from tilecraft.codegen.lower_state import LoweringState, _is_zero, _vectorizable, _vector_op_ok
from tilecraft.codegen.rewrite import graph_rewrite, symbolic_rules
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import DType, ImageDType, dtypes
from tilecraft.ops import INDEX, BinaryOps, BufferOps, ConstBuffer, LazyOp, MemBuffer, ReduceOps, TernaryOps, UnaryOps
from tilecraft.renderer import Renderer
from tilecraft.shape.symbolic import Variable, sint

def lower_kernel(ast: LazyOp, ren: Renderer) -> UOp:
  """The UOp graph (a SINK of stores) of an optimized kernel AST for renderer `ren`, simplified by the rewrite rules."""
  check_images(ast, ren)
  sink = lower(LoweringState(ast, ren))
  return graph_rewrite(sink, symbolic_rules)

def lower(s: LoweringState) -> UOp:
  stores = [st for out in s.ast.src for st in lower_store(s, out)]
  # every kernel argument exists even if no load survives simplification: the signature is fixed
  args = [s.buf_uop(b) for b in s.outbufs + s.leaves if isinstance(b, MemBuffer) and b.idx >= 0]
  args += [s.varmap.get(v) or UOp(UOps.DEFINE_VAR, dtypes.int64, (), v) for v in sorted(s.ast.vars(), key=lambda v: v.expr)]
  return UOp(UOps.SINK, dtypes.void, tuple(stores) + tuple(dict.fromkeys(s.prefetches)) + tuple(dict.fromkeys(args)))

def lower_store(s: LoweringState, op: LazyOp) -> list[UOp]:
  """A STORE's UOps. With white axes, a global store is lowered once per white index (`mid`): the
  first thread of the group writes the values of all of them."""
  mb: MemBuffer = op.arg
  combos = list(itertools.product(*[range(s.shape[a]) for a in s.white])) if s.white and mb.idx >= 0 else [None]
  image = isinstance(mb.dtype, ImageDType)
  out: list[UOp] = []
  elems: list = []
  for combo in combos:
    saved = (list(s.idx_vars), s.mid)
    if combo is not None:
      for a, c in zip(s.white, combo): s.idx_vars[a] = c
      s.mid = combo
    try:
      val = lower_op(s, op.src[0], inner=False)
      if s.block_range is not None and op.src[0].op not in ReduceOps: val = _last_block_epilogue(s, op.src[0], val)
      if image: elems += image_elems(s, mb, val)
      else: out += _store_lanes(s, mb, val)
    finally: s.idx_vars, s.mid = saved
  return image_stores(s, mb, elems) if image else out

def _last_block_epilogue(s: LoweringState, value: LazyOp, val: dict[tuple, UOp]) -> dict[tuple, UOp]:
  """BLOCK with an epilogue (kernel.py: _block): the blocks before the last store the bare partial sum
  (the next block starts from it), the last one the value computed from the whole sum."""
  red = next(x for x in value.lazyops if x.op in ReduceOps)
  raw = lower_op(s, red, inner=False)
  assert s.block_range is not None and s.block_axis is not None
  last = UOp.alu(BinaryOps.CMPLT, s.block_range, UOp.const(dtypes.int32, s.shape[s.block_axis] - 1))
  out = {}
  for lane, v in val.items():
    r = raw[lane]
    if r.dtype.count < v.dtype.count: r = UOp(UOps.VECTORIZE, r.dtype.vec(v.dtype.count), (r,) * v.dtype.count)
    if v.dtype.count < r.dtype.count: v = UOp(UOps.VECTORIZE, v.dtype.vec(r.dtype.count), (v,) * r.dtype.count)
    cond = last if v.dtype.count == 1 else UOp(UOps.VECTORIZE, dtypes.bool.vec(v.dtype.count), (last,) * v.dtype.count)
    out[lane] = UOp.alu(TernaryOps.WHERE, cond, r, v)
  return out

def _store_lanes(s: LoweringState, mb: MemBuffer, val: dict[tuple, UOp]) -> list[UOp]:
  buf = s.buf_uop(mb)
  out = []
  # a unit-stride store whose validity varies by lane (a padded row's last vector) is one masked
  # vector store on targets with masked loads and stores, lane by lane elsewhere
  masked = s.ren.masked_loads and buf.op is UOps.DEFINE_GLOBAL and not s.group
  for lane in s.lanes(False):
    v = val[lane]
    idx, valid = s.index(mb.st, lane)
    kind, data = s.vec_form(idx, valid, masked=masked and v.dtype.count > 1)
    if kind == "masked" and (gate := s.masked_gate(data[1])) is not None:
      out.append(UOp(UOps.STORE, dtypes.void, (buf, s.ix.sym_to_uop(data[0], dtypes.int32), v, gate)))
      continue
    if kind == "masked": kind, data = "gather", data[2] or s.lane_forms(data[0], data[1])
    if kind == "vector" and v.dtype.count > 1:
      out.append(s.store(buf, *data, v))
    elif kind == "scalar" and v.dtype.count == 1: out.append(s.store(buf, *data, v))
    else:
      if kind == "scalar": raise RuntimeError(f"output {mb.idx} has one address for several vector lanes: the kernel would race")
      per = data if kind == "gather" else [(data[0] + i, data[1]) for i in range(s.W)]
      for i, (ix, vl) in enumerate(per): out.append(s.store(buf, ix, vl, v.gep(i) if v.dtype.count > 1 else v))
  return out

def lower_op(s: LoweringState, op: LazyOp, inner: bool) -> dict[tuple, UOp]:
  key = ("op", op, inner, s.mid, s.loop)
  if (r := s.memo.get(key)) is not None: return r
  if op.op in ReduceOps and (inner or s.loop):
    # a reduce read inside another reduce (broadcast over its axes): lowered once, on the kernel's
    # own reduce loops, and the same value used for every unrolled lane of the reader
    saved = (list(s.idx_vars), s.loop)
    for a in s.red_axes: s.idx_vars[a] = s.base_vars[a]
    s.loop = 0
    try: outer = lower_op(s, op, False)
    finally: s.idx_vars, s.loop = saved
    mag = [a in s.magenta for a in s.lane_axes]
    res = {lane: outer[tuple(0 if m else i for m, i in zip(mag, lane))] for lane in s.lanes(inner)}
  elif op.op is BufferOps.LOAD: res = lower_load(s, op, inner)
  elif op.op is BufferOps.CONST: res = lower_const(s, op, inner)
  elif op.op in ReduceOps: res = lower_reduce(s, op, lower_op, barrier)
  else:
    _lower_sources(s, op, inner)
    srcs = [lower_op(s, x, inner) for x in op.src]
    res = {lane: alu(s, op, [v[lane] for v in srcs]) for lane in s.lanes(inner)}
  s.memo[key] = res
  return res

def _lower_sources(s: LoweringState, op: LazyOp, inner: bool) -> None:
  """Lower the elementwise ops under op in the order lower_op's own recursion would (sources first,
  left to right), with an explicit stack: an expression may be deeper than Python's recursion
  limit. Loads, constants and reduces are lowered where they come, without looking inside."""
  stack = [(x, False) for x in reversed(op.src)]
  while stack:
    x, ready = stack.pop()
    if ("op", x, inner, s.mid, s.loop) in s.memo: continue
    if ready or not x.src or x.op in ReduceOps or x.op in BufferOps: lower_op(s, x, inner)
    else:
      stack.append((x, True))
      stack.extend((y, False) for y in reversed(x.src))

def lower_load(s: LoweringState, op: LazyOp, inner: bool) -> dict[tuple, UOp]:
  mb: MemBuffer = op.arg
  if mb.idx in s.info.packed: return lower_packed_load(s, mb, inner)
  after = barrier(s, op.src[0]) if op.src else None  # a local buffer is loaded after its store and a barrier
  buf = s.buf_uop(mb)
  res = {}
  for lane in s.lanes(inner):
    idx, valid = s.index(mb.st, lane)
    if isinstance(mb.dtype, ImageDType):
      res[lane] = image_load_lane(s, buf, mb, idx, valid)
      continue
    kind, data = s.vec_form(idx, valid, masked=after is None)
    if s.loop and kind in ("vector", "masked"): _prefetch_next(s, buf, data[0])
    if kind == "masked" and (gate := s.masked_gate(data[1])) is not None:
      vdt = mb.dtype.vec(s.W)
      res[lane] = UOp(UOps.LOAD, vdt, (buf, s.ix.sym_to_uop(data[0], dtypes.int32), gate, UOp.const(vdt, 0)))
      continue
    if kind == "masked": kind, data = "gather", data[2] or s.lane_forms(data[0], data[1])
    if kind == "scalar": res[lane] = s.load(buf, *data, mb.dtype, after)
    elif kind == "vector": res[lane] = s.load(buf, *data, mb.dtype.vec(s.W), after)
    elif (pair := _stride_two(s, data)) is not None: res[lane] = _load_stride_two(s, buf, mb.dtype, *pair, after)
    else: res[lane] = UOp(UOps.VECTORIZE, mb.dtype.vec(s.W), tuple(s.load(buf, ix, vl, mb.dtype, after) for ix, vl in data))
  return res

def _stride_two(s: LoweringState, lanes: list[tuple[sint, sint]]) -> Optional[tuple[sint, list[sint]]]:
  """(base, each lane's validity) of a gather whose lane i reads base + 2*i (a stride-2 window: a
  pooling or depthwise conv's row) on a CPU, where its lanes share one validity or the target has
  masked vector loads; else None."""
  if s.ren.has_local or s.W < 4 or s.W % 2: return None
  base, valids = lanes[0][0], [vl for _, vl in lanes]
  if not all(_is_zero(ix - (base + 2 * i)) for i, (ix, _) in enumerate(lanes)) or all(vl == 0 for vl in valids): return None
  if any(vl != valids[0] for vl in valids) and not s.ren.masked_loads: return None
  return base, valids

def _load_stride_two(s: LoweringState, buf: UOp, dtype: DType, base: sint, valids: list[sint], after: Optional[UOp]) -> UOp:
  """Lanes base, base+2, ..., base+2(W-1) from two vector loads that stay inside what the gather reads:
  [base, base+W-1] holds the first half of the lanes at even positions, [base+W-1, base+2W-2] the second
  half at odd ones. Where the lanes' validity differs, each element of the two loads is gated by the
  validity of the first lane at or after its address (so a gated-on element lies between two addresses
  the gather reads, and an invalid lane reads 0). Two loads and a shuffle instead of W scalar loads."""
  W = s.W
  vdt = dtype.vec(W)
  if all(vl == valids[0] for vl in valids): lo, hi = s.load(buf, base, valids[0], vdt, after), s.load(buf, base + W - 1, valids[0], vdt, after)
  else:
    def gated(start: sint, lane_of: list[int]) -> UOp:
      # (a load whose elements all share one validity, all valid in most steps, is a plain or a scalar-gated load: AVX2's
      # vmaskmov costs more than a load, and a constant all-true mask doesn't fold away)
      if all(valids[j] == valids[lane_of[0]] for j in lane_of): return s.load(buf, start, valids[lane_of[0]], vdt, after)
      gate = UOp(UOps.VECTORIZE, dtypes.bool.vec(W), tuple(s.ix.sym_bool(valids[j]) if valids[j] != 1 else UOp.const(dtypes.bool, True) for j in lane_of))
      src = (buf, s.ix.sym_to_uop(start, dtypes.int32), gate, UOp.const(vdt, 0)) + ((after,) if after is not None else ())
      return UOp(UOps.LOAD, vdt, src)
    lo = gated(base, [(k + 1) // 2 for k in range(W)])
    hi = gated(base + W - 1, [W // 2 + k // 2 for k in range(W)])
  return UOp(UOps.VECTORIZE, vdt, tuple([lo.gep(2 * i) for i in range(W // 2)] + [hi.gep(2 * i + 1) for i in range(W // 2)]))

def _prefetch_next(s: LoweringState, buf: UOp, idx: sint) -> None:
  """In a dependent reduce's loop (which re-reads a row from cache) the memory is idle: ask for what
  the same load reads in the next iteration of the loop around the reduce (on targets with has_prefetch)."""
  if buf.op is UOps.DEFINE_GLOBAL: s.prefetch_next(buf, idx, s.outer_range)

def barrier(s: LoweringState, store: LazyOp) -> UOp:
  key = ("barrier", store)
  if (r := s.memo.get(key)) is None: r = s.memo[key] = UOp(UOps.BARRIER, dtypes.void, tuple(lower_store(s, store)))
  return r

def lower_const(s: LoweringState, op: LazyOp, inner: bool) -> dict[tuple, UOp]:
  cb: ConstBuffer = op.arg
  if cb.val is INDEX: return _lower_index(s, cb, inner)
  if isinstance(cb.val, Variable): c = s.ix.sym(cb.val, dtypes.int64).cast(cb.dtype)
  else: c = UOp.const(cb.dtype, cb.val)
  res = {}
  for lane in s.lanes(inner):
    idx, valid = s.index(cb.st, lane)
    kind, data = s.vec_form(0, valid)
    if kind == "scalar": res[lane] = c if data[1] == 1 else s.where_zero(s.ix.sym_bool(data[1]), c, cb.dtype)
    else: res[lane] = UOp(UOps.VECTORIZE, cb.dtype.vec(s.W), tuple(c if vl == 1 else s.where_zero(s.ix.sym_bool(vl), c, cb.dtype) for _, vl in data))
  return res

def _lower_index(s: LoweringState, cb: ConstBuffer, inner: bool) -> dict[tuple, UOp]:
  """An index constant: each element's flat index through its view, as cb.dtype (0 where masked)."""
  res = {}
  for lane in s.lanes(inner):
    kind, data = s.vec_form(*s.index(cb.st, lane))
    per = [data] if kind == "scalar" else [(data[0] + i, data[1]) for i in range(s.W)] if kind == "vector" else data
    vals = []
    for ix, vl in per:
      v = UOp.const(cb.dtype, 0) if vl == 0 else s.ix.sym_to_uop(ix, dtypes.int32).cast(cb.dtype)
      vals.append(v if vl in (0, 1) else s.where_zero(s.ix.sym_bool(vl), v, cb.dtype))
    res[lane] = vals[0] if kind == "scalar" else UOp(UOps.VECTORIZE, cb.dtype.vec(s.W), tuple(vals))
  return res

def alu(s: LoweringState, op: LazyOp, vals: list[UOp]) -> UOp:
  width = max(v.dtype.count for v in vals)
  if width > 1 and not _alu_vectorizable(s.ren, op, vals):
    return UOp(UOps.VECTORIZE, op.dtype.vec(width), tuple(_scalar_alu(s, op, [v.gep(i) if v.dtype.count > 1 else v for v in vals]) for i in range(width)))
  if width > 1: vals = [v if v.dtype.count > 1 else UOp(UOps.VECTORIZE, v.dtype.vec(width), (v,) * width) for v in vals]
  return _scalar_alu(s, op, vals, width)

def _scalar_alu(s: LoweringState, op: LazyOp, vals: list[UOp], width: int = 1) -> UOp:
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


def _alu_vectorizable(ren: Renderer, op: LazyOp, vals: list[UOp]) -> bool:
  if op.op in (UnaryOps.CAST, UnaryOps.BITCAST): return False
  if ren.vector_masks and op.op in ren.vector_alu:
    # a target with lane masks compares vectors into a bool vector, and WHERE selects lanes by one
    if op.op in (BinaryOps.CMPLT, BinaryOps.CMPNE): return all(_vectorizable(ren, v.dtype) for v in vals)
    if op.op is TernaryOps.WHERE:
      return vals[0].dtype.scalar() == dtypes.bool and _vectorizable(ren, op.dtype) and all(_vectorizable(ren, v.dtype) for v in vals[1:])
  # and logic on those bool vectors (lanes 0, 1 or -1): |, & and == 0 on the int lanes. Lane by lane, a float abs()'s
  # x <= 0 (x < 0 or not x != 0) was 16 scalar ORs per vector (the erf of BERT-like's GELU)
  if ren.vector_masks and op.op in (BinaryOps.AND, BinaryOps.OR, UnaryOps.NEG) and op.dtype == dtypes.bool:
    return all(v.dtype.scalar() == dtypes.bool for v in vals)
  return _vector_op_ok(ren, op.op, op.dtype) and all(_vectorizable(ren, v.dtype) for v in vals)
