"""Reduces as UOps (a mixin of the Lowerer): accumulator loops, the second stage of grouped
(workgroup) reduces over local memory, horizontal combines of vector lanes, and arange-style
constant sums computed in closed form."""
from __future__ import annotations
from typing import TYPE_CHECKING, Any, Optional
from tilecraft.codegen.lower_index import INT32_MAX, _ceil, _maxabs, _subst
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import DType, dtypes
from tilecraft.helpers import prod
from tilecraft.ops import INDEX, BinaryOps, BufferOps, LazyOp, ReduceOps, TernaryOps, UnaryOps
from tilecraft.shape.symbolic import And, Lt, Node, Sum, Variable, sint, sym_and
if TYPE_CHECKING: from tilecraft.codegen.lowerer import Lowerer

CHAIN_MIN_ACCS = 8  # independent accumulators that hide an FMA's latency (4 cycles x 2 FMA units)

class ReduceLowering:
  __slots__ = ()
  def lower_reduce(self: Lowerer, op: LazyOp) -> dict[tuple, UOp]:
    if op.op is ReduceOps.WMMA: return self.lower_wmma(op)
    if (collapsed := self._collapse_const_sum(op)) is not None: return collapsed
    red_axes = set(op.arg)
    # which loops this reduce runs over: the serial reduce loops, or in a grouped reduce's second
    # stage, loops over the group axes (whose index is then the loop, not the thread id)
    if op.src[0].op is BufferOps.LOAD and op.src[0].src:
      # stage one is lowered with the thread ids (white axes too: there they are threads)
      saved_ids = (self.idx_vars, self.mid)
      self.idx_vars, self.mid = list(self.thread_vars), None
      try: self._barrier(op.src[0].src[0])
      finally: self.idx_vars, self.mid = saved_ids
      group = self._group_ranges()
      saved = list(self.idx_vars)
      for a, v, _ in group: self.idx_vars[a] = v
      src = self.lower_op(op.src[0], inner=True)
      self.idx_vars = saved
      ranges = [r for _, _, r in group]
    elif any(x.op in ReduceOps for x in op.src[0].lazyops): src, ranges = self._dependent_loops(op, red_axes)
    else:
      src = self.lower_op(op.src[0], inner=True)
      ranges = [r for r in self.reduce_ranges if r.arg[1] in red_axes]
    init = _identity(op.op, op.dtype)
    res: dict[tuple, UOp] = {}
    magenta_pos = [j for j, a in enumerate(self.lane_axes) if a in self.magenta and a in red_axes]
    out_lanes = self.lanes(False)
    vector_reduce = self.vax is not None and self.vax in self.magenta and self.vax in red_axes
    # unrolled terms of a SUM on a CPU with many accumulators are added into the accumulator one by one:
    # a multiply-add each (FMA), where summing them first costs a multiply and an add more per
    # accumulator and step; the accumulators' chains are independent, so the longer chain costs no latency
    chain = op.op is ReduceOps.SUM and not self.ren.has_local and len(out_lanes) >= CHAIN_MIN_ACCS
    for lane in out_lanes:
      group = [src[l] for l in self.lanes(True) if all(l[j] == lane[j] for j in range(len(lane)) if j not in magenta_pos)]
      # a term that doesn't vary along a reduced vector axis (a constant, a broadcast load) still counts
      # once per lane of it: widen it to the vector, so the horizontal combine below sees every lane
      width = max([v.dtype.count for v in group] + ([self.W] if vector_reduce else []))
      group = [v if v.dtype.count == width else UOp(UOps.VECTORIZE, v.dtype.vec(width), (v,) * width) for v in group]
      total = group[0]
      if not (chain and ranges and len(group) > 1):
        for v in group[1:]: total = self._combine(op.op, total, v)
      if not ranges:
        res[lane] = self._combine(op.op, total, self._earlier_blocks(lane, total.dtype.count)) if self.block_range is not None and self.block_in_acc else total
        continue
      dt = total.dtype
      start = self._earlier_blocks(lane, dt.count) if self.block_range is not None and self.block_in_acc else UOp.const(dt, init)
      # a blocked sum (Lowerer._blocked_sum_axis): an accumulator per block loop, whose sum is added to
      # the accumulator of the loop around it after each block
      cuts = [j for j, r in enumerate(ranges) if len(r.arg) > 2 and r.arg[2] == "block"]
      v, terms = total, group if chain else None
      for lo, hi in reversed(list(zip(cuts, cuts[1:] + [len(ranges)]))):  # innermost block first
        v, terms = self._accumulate(op, UOp.const(dt, init), ranges[lo:hi], v, terms), None
      res[lane] = self._accumulate(op, start, ranges[:cuts[0]] if cuts else ranges, v, terms)
    if self.vax is not None and self.vax in self.magenta:  # the vector lanes were reduce lanes: combine them
      for lane, v in res.items():
        if v.dtype.count > 1: res[lane] = self._horizontal(op.op, v)
    return res
  def _accumulate(self: Lowerer, op: LazyOp, start: UOp, ranges: list[UOp], total: UOp, terms: Optional[list[UOp]]) -> UOp:
    """An accumulator from `start` that combines `total` (or each of `terms`, one by one) in every
    iteration of `ranges`; its value after them."""
    dt = total.dtype
    self.acc_count += 1
    parent = ranges[0].src[2:]  # the loop around these loops, if any
    acc = UOp(UOps.DEFINE_ACC, dt, (start,) + parent, self.acc_count)
    # the accumulator's value inside the loop changes every iteration: read it there (the ranges
    # in src keep the read, and everything computed from it, inside the loop)
    acc_in = UOp(UOps.ACCREAD, dt, (acc,) + tuple(ranges))
    if terms is not None and len(terms) > 1:
      upd = acc_in
      for v in terms: upd = self._combine(op.op, upd, v)
    else: upd = self._combine(op.op, acc_in, total)
    phi = UOp(UOps.PHI, dt, (acc, upd) + tuple(ranges))
    # ENDRANGE marks "after the loop" (and keeps the update in the graph)
    return UOp(UOps.ACCREAD, dt, (acc, UOp(UOps.ENDRANGE, dtypes.void, (ranges[0], phi))))
  def _dependent_loops(self: Lowerer, op: LazyOp, red_axes: set) -> tuple[dict[tuple, UOp], list[UOp]]:
    """A reduce that reads another reduce's result (broadcast over the same axes) can only start once
    that result is known: it gets loops of its own over the reduce axes, after the first ones (the
    data it reads again is still in cache). Its source is lowered with their variables."""
    self.loops += 1
    n = self.loops
    saved = (list(self.idx_vars), self.loop)
    parent, ranges = self.outer_range, []
    for a in self.red_axes:
      if not isinstance(self.base_vars[a], Variable): continue  # size 1
      v = Variable(f"ridx{a}_{n}", 0, _ceil(self.shape[a]) - 1)
      r = self._range(self.shape[a], parent, ("reduce", a, n))
      self.varmap[v], self.idx_vars[a] = r, v
      parent = r
      ranges.append(r)
    self.loop = n
    try: src = self.lower_op(op.src[0], inner=True)
    finally: self.idx_vars, self.loop = saved
    return src, [r for r in ranges if r.arg[1] in red_axes]

  def _horizontal(self: Lowerer, op: Any, v: UOp) -> UOp:
    parts = [v.gep(i) for i in range(v.dtype.count)]
    while len(parts) > 1: parts = [self._combine(op, parts[i], parts[i + 1]) if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
    return parts[0]

  def _collapse_const_sum(self: Lowerer, op: LazyOp) -> Optional[dict[tuple, UOp]]:
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

  def _count(self: Lowerer, valid: sint, loop_vars: dict[Variable, int]) -> Optional[UOp]:
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

  def _group_ranges(self: Lowerer) -> list[tuple[int, Variable, UOp]]:
    """(axis, loop variable, RANGE) for each group axis: the nested loops of a grouped reduce's
    second stage (reading local memory), outermost first."""
    ranges = []
    for a in self.group_axes:
      if self.shape[a] == 1 or a in self.white: continue  # a white axis is not reduced: `mid` gives its index
      v = Variable(f"gridx{a}", 0, self.shape[a] - 1)
      r = UOp(UOps.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 0), UOp.const(dtypes.int32, self.shape[a])) + ((ranges[-1][2],) if ranges else ()), ("reduce", a))
      self.varmap[v] = r
      ranges.append((a, v, r))
    return ranges

  def _combine(self: Lowerer, op: Any, a: UOp, b: UOp) -> UOp:
    alu = BinaryOps.ADD if op is ReduceOps.SUM else BinaryOps.MAX
    if a.dtype.count > 1 and not self.vector_op_ok(alu, a.dtype):
      return UOp(UOps.VECTORIZE, a.dtype, tuple(UOp.alu(alu, a.gep(i), b.gep(i)) for i in range(a.dtype.count)))
    return UOp.alu(alu, a, b)

def _identity(op: Any, dtype: DType) -> Any:
  if op is ReduceOps.SUM: return 0
  return dtypes.min(dtype.scalar())
