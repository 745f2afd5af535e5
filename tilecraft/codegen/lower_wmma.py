"""Tensor-core reduces as UOps (a mixin of the Lowerer): WMMA instructions over per-thread
fragments (use 1), or the same layout emulated with plain multiply-adds, through local memory in
the vendor's register layout (use 3)."""
from __future__ import annotations
import itertools
from typing import TYPE_CHECKING, Any
from tilecraft.codegen.lower_index import _ceil
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import dtypes
from tilecraft.helpers import prod
from tilecraft.ops import BinaryOps, LazyOp
from tilecraft.shape.symbolic import sint
if TYPE_CHECKING: from tilecraft.codegen.lowerer import Lowerer

class TensorCoreLowering:
  __slots__ = ()
  def lower_wmma(self: Lowerer, op: LazyOp) -> dict[tuple, UOp]:
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

  def _emulate_wmma(self: Lowerer, info: Any, fa: UOp, fb: UOp, c: UOp, ranges: list[UOp]) -> UOp:
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
