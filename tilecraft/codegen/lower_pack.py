"""Lowering of PACK (see codegen/pack.py): the copy loop that fills a packed stack array inside the
pack's scope loop (the block loop, or the output loop pack.py picks for the buffer), and the loads
that read the array instead of the buffer.

The copy is a loop nest over the packed reduce axes (fresh loop variables) with the packed lane
axes unrolled into stores, inside the scope loop; a BARRIER over its stores orders every read of
the array after it (on a CPU that is only program order: the linearizer places the copy loop
before the inner loops that read it). The copy reads the buffer the ordinary way, gates included,
so a masked element is stored as 0. Functions of the LoweringState (lower_state.py).
"""
from __future__ import annotations
import itertools
from tilecraft.codegen.lower_state import LoweringState
from tilecraft.codegen.pack import pack_axes, pack_inner_axes, pack_scope_axis
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import dtypes
from tilecraft.helpers import prod
from tilecraft.ops import BufferOps, MemBuffer
from tilecraft.shape.symbolic import Variable, sint

def _pack_layout(s: LoweringState, mb: MemBuffer) -> tuple[list[int], dict[int, int]]:
  """The packed axes (the vector axis last) and each one's stride in the array."""
  # the array's layout follows the first load of the buffer (the one PACK checked)
  first = next(x.arg for x in s.ast.lazyops if x.op is BufferOps.LOAD and x.arg.idx == mb.idx)
  axes = pack_axes(first.st, s.first_reduce, s.info.reduce_block)
  if s.vax in axes: axes = [a for a in axes if a != s.vax] + [s.vax]
  strides, acc = {}, 1
  for a in reversed(axes):
    strides[a] = acc
    acc *= s.shape[a]
  return axes, strides

def _pack_offset(axes: list[int], strides: dict[int, int], vals: dict[int, sint]) -> sint:
  return sum((vals[a] * strides[a] for a in axes), start=0)

def _pack(s: LoweringState, mb: MemBuffer) -> tuple[UOp, UOp]:
  """The packed array of buffer mb and the barrier after its copy loop (built once per buffer)."""
  key = ("pack", mb.idx)
  if (r := s.memo.get(key)) is not None: return r
  axes, strides = _pack_layout(s, mb)
  local = UOp(UOps.DEFINE_LOCAL, mb.dtype.ptr(local=True), (), (f"pack{mb.idx}", prod(s.shape[a] for a in axes)))
  first = next(x.arg for x in s.ast.lazyops if x.op is BufferOps.LOAD and x.arg.idx == mb.idx)
  scope_axis = pack_scope_axis(first.st, s.shape, s.first_reduce)
  scope = s.block_range if s.block_range is not None else s.varmap[s.idx_vars[scope_axis]]
  saved = list(s.idx_vars)
  try:
    # the buffer doesn't move along the inner loops (checked by PACK)
    for a in pack_inner_axes(first.st, s.shape, s.first_reduce, s.info.reduce_block): s.idx_vars[a] = 0
    parent, vals = scope, {}
    for a in s.red_axes:
      if a == s.block_axis: continue
      if a not in axes: s.idx_vars[a] = 0
      else:
        v = Variable(f"pidx{a}", 0, s.shape[a] - 1)
        parent = s.make_range(s.shape[a], parent, ("reduce", a))
        s.varmap[v] = parent
        s.idx_vars[a] = vals[a] = v
    lane_packed = [a in axes for a in s.lane_axes]
    sizes = [s.shape[a] if p else 1 for a, p in zip(s.lane_axes, lane_packed)]
    stores = []
    for lane in itertools.product(*[range(s) for s in sizes]):
      for a, x in zip(s.lane_axes, lane): vals[a] = x
      if s.vax in axes: vals[s.vax] = 0  # the base of a vector store
      at = _pack_offset(axes, strides, vals)
      v = _pack_value(s, mb, lane)
      if s.vax in axes and v.dtype.count == 1: v = UOp(UOps.VECTORIZE, mb.dtype.vec(s.W), (v,) * s.W)
      stores.append(s.store(local, at, 1, v))
  finally: s.idx_vars = saved
  barrier = UOp(UOps.BARRIER, dtypes.void, tuple(stores))
  s.memo[key] = (local, barrier)
  return local, barrier

def _pack_value(s: LoweringState, mb: MemBuffer, lane: tuple[int, ...]) -> UOp:
  """The buffer's value (a vector along the vector axis, if any) at the current index variables."""
  idx, valid = s.index(mb.st, lane)
  kind, data = s.vec_form(idx, valid)
  if kind == "scalar": return s.load(s.buf_uop(mb), *data, mb.dtype, None)
  if kind == "vector": return s.load(s.buf_uop(mb), *data, mb.dtype.vec(s.W), None)
  return UOp(UOps.VECTORIZE, mb.dtype.vec(s.W), tuple(s.load(s.buf_uop(mb), ix, vl, mb.dtype, None) for ix, vl in data))

def lower_packed_load(s: LoweringState, mb: MemBuffer, inner: bool) -> dict[tuple, UOp]:
  local, barrier = _pack(s, mb)
  axes, strides = _pack_layout(s, mb)
  res = {}
  for lane in s.lanes(inner):
    vals: dict[int, sint] = {a: s.idx_vars[a] for a in axes}
    for a, x in zip(s.lane_axes, lane): vals[a] = x
    if s.vax in axes:
      vals[s.vax] = 0
      res[lane] = s.load(local, _pack_offset(axes, strides, vals), 1, mb.dtype.vec(s.W), barrier)
    else: res[lane] = s.load(local, _pack_offset(axes, strides, vals), 1, mb.dtype, barrier)
  return res
