"""Lowering of PACK (see codegen/pack.py): the copy loop that fills a packed stack array inside the
pack's scope loop, and the loads that read the array instead of the buffer.

The copy is a loop nest over the packed reduce axes (fresh loop variables) with the packed lane
axes unrolled into stores, inside the scope loop; a BARRIER over its stores orders every read of
the array after it (on a CPU that is only program order: the linearizer places the copy loop
before the inner loops that read it). The copy reads the buffer the ordinary way, gates included,
so a masked element is stored as 0.
"""
from __future__ import annotations
import itertools
from typing import Any
from tilecraft.codegen.pack import pack_axes, pack_inner_axes
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import dtypes
from tilecraft.helpers import prod
from tilecraft.ops import MemBuffer
from tilecraft.shape.symbolic import Variable, sint

class PackLowering:
  def _pack_layout(self: Any, mb: MemBuffer) -> tuple[list[int], dict[int, int]]:
    """The packed axes (the vector axis last) and each one's stride in the array."""
    axes = pack_axes(self.k, mb.idx)
    if self.vax in axes: axes = [a for a in axes if a != self.vax] + [self.vax]
    strides, acc = {}, 1
    for a in reversed(axes):
      strides[a] = acc
      acc *= self.shape[a]
    return axes, strides

  def _pack_offset(self: Any, axes: list[int], strides: dict[int, int], vals: dict[int, sint]) -> sint:
    return sum((vals[a] * strides[a] for a in axes), start=0)

  def _pack(self: Any, mb: MemBuffer) -> tuple[UOp, UOp]:
    """The packed array of buffer mb and the barrier after its copy loop (built once per buffer)."""
    key = ("pack", mb.idx)
    if (r := self.memo.get(key)) is not None: return r
    axes, strides = self._pack_layout(mb)
    local = UOp(UOps.DEFINE_LOCAL, mb.dtype.ptr(local=True), (), (f"pack{mb.idx}", prod(self.shape[a] for a in axes)))
    scope = self.block_range if self.block_range is not None else self.varmap[self.idx_vars[self.loop_axes[0]]]
    saved = list(self.idx_vars)
    try:
      for a in pack_inner_axes(self.k): self.idx_vars[a] = 0  # the buffer doesn't move along them (checked by PACK)
      parent, vals = scope, {}
      for a in self.red_axes:
        if a == self.block_axis: continue
        if a not in axes: self.idx_vars[a] = 0
        else:
          v = Variable(f"pidx{a}", 0, self.shape[a] - 1)
          parent = self._range(self.shape[a], parent, ("reduce", a))
          self.varmap[v] = parent
          self.idx_vars[a] = vals[a] = v
      lane_packed = [a in axes for a in self.lane_axes]
      sizes = [self.shape[a] if p else 1 for a, p in zip(self.lane_axes, lane_packed)]
      stores = []
      for lane in itertools.product(*[range(s) for s in sizes]):
        for a, x in zip(self.lane_axes, lane): vals[a] = x
        if self.vax in axes: vals[self.vax] = 0  # the base of a vector store
        at = self._pack_offset(axes, strides, vals)
        v = self._pack_value(mb, lane)
        if self.vax in axes and v.dtype.count == 1: v = UOp(UOps.VECTORIZE, mb.dtype.vec(self.W), (v,) * self.W)
        stores.append(self._store(local, at, 1, v))
    finally: self.idx_vars = saved
    barrier = UOp(UOps.BARRIER, dtypes.void, tuple(stores))
    self.memo[key] = (local, barrier)
    return local, barrier

  def _pack_value(self: Any, mb: MemBuffer, lane: tuple[int, ...]) -> UOp:
    """The buffer's value (a vector along the vector axis, if any) at the current index variables."""
    idx, valid = self.index(mb.st, lane)
    kind, data = self.vec_form(idx, valid)
    if kind == "scalar": return self._load(self.buf_uop(mb), *data, mb.dtype, None)
    if kind == "vector": return self._load(self.buf_uop(mb), *data, mb.dtype.vec(self.W), None)
    return UOp(UOps.VECTORIZE, mb.dtype.vec(self.W), tuple(self._load(self.buf_uop(mb), ix, vl, mb.dtype, None) for ix, vl in data))

  def lower_packed_load(self: Any, mb: MemBuffer, inner: bool) -> dict[tuple, UOp]:
    local, barrier = self._pack(mb)
    axes, strides = self._pack_layout(mb)
    res = {}
    for lane in self.lanes(inner):
      vals: dict[int, sint] = {a: self.idx_vars[a] for a in axes}
      for a, x in zip(self.lane_axes, lane): vals[a] = x
      if self.vax in axes:
        vals[self.vax] = 0
        res[lane] = self._load(local, self._pack_offset(axes, strides, vals), 1, mb.dtype.vec(self.W), barrier)
      else: res[lane] = self._load(local, self._pack_offset(axes, strides, vals), 1, mb.dtype, barrier)
    return res
