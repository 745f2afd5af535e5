"""Reduces as UOps: accumulator loops, the second stage of grouped (workgroup) reduces over local
memory, horizontal combines of vector lanes, and arange-style constant sums computed in closed form.

Functions of the LoweringState (lower_state.py). A reduce's source is lowered by the caller's
`lower_op` (lowerer.py), under the index variables this pass sets for its loops; a grouped reduce's
first stage is a local STORE lowered behind a barrier by the caller's `barrier`."""
from __future__ import annotations
from typing import Any, Callable, Optional
from tilecraft.codegen.lower_index import _ceil, _subst
from tilecraft.codegen import lower_state
from tilecraft.codegen.lower_state import LowerOp, LoweringState
from tilecraft.codegen.lower_wmma import lower_wmma
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import DType, dtypes
from tilecraft.helpers import prod
from tilecraft.ops import INDEX, BinaryOps, BufferOps, LazyOp, ReduceOps, TernaryOps, UnaryOps
from tilecraft.shape.symbolic import And, Lt, Node, Sum, Variable, sint, sym_and

CHAIN_MIN_ACCS = 8  # independent accumulators that hide an FMA's latency (4 cycles x 2 FMA units)

Barrier = Callable[[LoweringState, LazyOp], UOp]  # lowerer.py: barrier

def lower_reduce(s: LoweringState, op: LazyOp, lower_op: LowerOp, barrier: Barrier) -> dict[tuple, UOp]:
  if op.op is ReduceOps.WMMA: return lower_wmma(s, op, lower_op)
  if (collapsed := _collapse_const_sum(s, op)) is not None: return collapsed
  red_axes = set(op.arg)
  # which loops this reduce runs over: the serial reduce loops, or in a grouped reduce's second
  # stage, loops over the group axes (whose index is then the loop, not the thread id)
  if op.src[0].op is BufferOps.LOAD and op.src[0].src:
    # stage one is lowered with the thread ids (white axes too: there they are threads)
    saved_ids = (s.idx_vars, s.mid)
    s.idx_vars, s.mid = list(s.thread_vars), None
    try: barrier(s, op.src[0].src[0])
    finally: s.idx_vars, s.mid = saved_ids
    group = _group_ranges(s)
    saved = list(s.idx_vars)
    for a, v, _ in group: s.idx_vars[a] = v
    src = lower_op(s, op.src[0], True)
    s.idx_vars = saved
    ranges = [r for _, _, r in group]
  elif any(x.op in ReduceOps for x in op.src[0].lazyops): src, ranges = _dependent_loops(s, op, red_axes, lower_op)
  else:
    src = lower_op(s, op.src[0], True)
    ranges = [r for r in s.reduce_ranges if r.arg[1] in red_axes]
  init = _identity(op.op, op.dtype)
  res: dict[tuple, UOp] = {}
  magenta_pos = [j for j, a in enumerate(s.lane_axes) if a in s.magenta and a in red_axes]
  out_lanes = s.lanes(False)
  vector_reduce = s.vax is not None and s.vax in s.magenta and s.vax in red_axes
  # unrolled terms of a SUM on a CPU with many accumulators are added into the accumulator one by one:
  # a multiply-add each (FMA), where summing them first costs a multiply and an add more per
  # accumulator and step; the accumulators' chains are independent, so the longer chain costs no latency
  chain = op.op is ReduceOps.SUM and not s.ren.has_local and len(out_lanes) >= CHAIN_MIN_ACCS
  for lane in out_lanes:
    group = [src[l] for l in s.lanes(True) if all(l[j] == lane[j] for j in range(len(lane)) if j not in magenta_pos)]
    # a term that doesn't vary along a reduced vector axis (a constant, a broadcast load) still counts
    # once per lane of it: widen it to the vector, so the horizontal combine below sees every lane
    width = max([v.dtype.count for v in group] + ([s.W] if vector_reduce else []))
    group = [v if v.dtype.count == width else UOp(UOps.VECTORIZE, v.dtype.vec(width), (v,) * width) for v in group]
    total = group[0]
    if not (chain and ranges and len(group) > 1):
      for v in group[1:]: total = s.combine(op.op, total, v)
    if not ranges:
      res[lane] = s.combine(op.op, total, s.earlier_blocks(lane, total.dtype.count, init)) if s.block_range is not None and s.block_in_acc else total
      continue
    dt = total.dtype
    start = s.earlier_blocks(lane, dt.count, init) if s.block_range is not None and s.block_in_acc else UOp.const(dt, init)
    # a blocked sum (LoweringState._blocked_sum_axis): an accumulator per block loop, whose sum is added to
    # the accumulator of the loop around it after each block
    cuts = [j for j, r in enumerate(ranges) if len(r.arg) > 2 and r.arg[2] == "block"]
    v, terms = total, group if chain else None
    for lo, hi in reversed(list(zip(cuts, cuts[1:] + [len(ranges)]))):  # innermost block first
      v, terms = _accumulate(s, op, UOp.const(dt, init), ranges[lo:hi], v, terms), None
    res[lane] = _accumulate(s, op, start, ranges[:cuts[0]] if cuts else ranges, v, terms)
  if s.vax is not None and s.vax in s.magenta:  # the vector lanes were reduce lanes: combine them
    for lane, v in res.items():
      if v.dtype.count > 1: res[lane] = _horizontal(s, op.op, v)
      # BLOCK, where the accumulators couldn't start from the earlier blocks' results: combine those now
      if s.block_range is not None and not s.block_in_acc: res[lane] = s.combine(op.op, res[lane], s.earlier_blocks(lane, res[lane].dtype.count, init))
  return res
def _accumulate(s: LoweringState, op: LazyOp, start: UOp, ranges: list[UOp], total: UOp, terms: Optional[list[UOp]]) -> UOp:
  """An accumulator from `start` that combines `total` (or each of `terms`, one by one) in every
  iteration of `ranges`; its value after them."""
  dt = total.dtype
  s.acc_count += 1
  parent = ranges[0].src[2:]  # the loop around these loops, if any
  acc = UOp(UOps.DEFINE_ACC, dt, (start,) + parent, s.acc_count)
  # the accumulator's value inside the loop changes every iteration: read it there (the ranges
  # in src keep the read, and everything computed from it, inside the loop)
  acc_in = UOp(UOps.ACCREAD, dt, (acc,) + tuple(ranges))
  if terms is not None and len(terms) > 1:
    upd = acc_in
    for v in terms: upd = s.combine(op.op, upd, v)
  else: upd = s.combine(op.op, acc_in, total)
  phi = UOp(UOps.PHI, dt, (acc, upd) + tuple(ranges))
  # ENDRANGE marks "after the loop" (and keeps the update in the graph)
  return UOp(UOps.ACCREAD, dt, (acc, UOp(UOps.ENDRANGE, dtypes.void, (ranges[0], phi))))
def _dependent_loops(s: LoweringState, op: LazyOp, red_axes: set, lower_op: LowerOp) -> tuple[dict[tuple, UOp], list[UOp]]:
  """A reduce that reads another reduce's result (broadcast over the same axes) can only start once
  that result is known: it gets loops of its own over the reduce axes, after the first ones (the
  data it reads again is still in cache). Its source is lowered with their variables."""
  s.loops += 1
  n = s.loops
  saved = (list(s.idx_vars), s.loop)
  parent, ranges = s.outer_range, []
  for a in s.red_axes:
    if not isinstance(s.base_vars[a], Variable): continue  # size 1
    v = Variable(f"ridx{a}_{n}", 0, _ceil(s.shape[a]) - 1)
    r = s.make_range(s.shape[a], parent, ("reduce", a, n))
    s.varmap[v], s.idx_vars[a] = r, v
    parent = r
    ranges.append(r)
  s.loop = n
  try: src = lower_op(s, op.src[0], True)
  finally: s.idx_vars, s.loop = saved
  return src, [r for r in ranges if r.arg[1] in red_axes]

def _horizontal(s: LoweringState, op: Any, v: UOp) -> UOp:
  n = v.dtype.count
  alu = s.combine_alu(op)
  while lower_state.HORIZONTAL_VECTOR_STEPS and n >= 4 and n % 2 == 0 and s.vector_op_ok(alu, v.dtype.scalar().vec(n // 2)):
    # halves combined as vectors (lane i with lane i + n/2) while the target has the vector op: log2(n) vector steps,
    # not n - 1 scalar ones
    half, sdt = n // 2, v.dtype.scalar()
    lo = UOp(UOps.VECTORIZE, sdt.vec(half), tuple(v.gep(i) for i in range(half)))
    hi = UOp(UOps.VECTORIZE, sdt.vec(half), tuple(v.gep(i + half) for i in range(half)))
    v, n = s.combine(op, lo, hi), half
  parts = [v.gep(i) for i in range(v.dtype.count)]
  while len(parts) > 1: parts = [s.combine(op, parts[i], parts[i + 1]) if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
  return parts[0]

def _collapse_const_sum(s: LoweringState, op: LazyOp) -> Optional[dict[tuple, UOp]]:
  """arange-style reduces: a SUM of a masked constant over a loop whose mask bounds the loop
  variable linearly is a count, computed in closed form instead of looping."""
  if op.op is not ReduceOps.SUM: return None
  src, casts = op.src[0], []
  while src.op is UnaryOps.CAST: casts.append(src.arg); src = src.src[0]
  if src.op is not BufferOps.CONST or isinstance(src.arg.val, Variable) or src.arg.val is INDEX: return None
  if any(a in s.magenta or a == s.vax for a in op.arg if s.shape[a] != 1): return None
  loop_vars = {s.idx_vars[a]: a for a in op.arg if isinstance(s.idx_vars[a], Variable) and a in s.red_axes}
  if not loop_vars: return None
  c = src.arg.val
  for dt in reversed(casts): c = dtypes.as_const(c, dt)
  res: dict[tuple, UOp] = {}
  for lane in s.lanes(False):
    _, valid = s.index(src.arg.st, lane)
    per = [valid] if s.vlane is None or not (isinstance(valid, Node) and s.vlane in valid.vars()) else [_subst(valid, s.vlane, i) for i in range(s.W)]
    counts = [_count(s, v, loop_vars) for v in per]
    if any(x is None for x in counts): return None
    vals = [UOp.alu(BinaryOps.MUL, n.cast(op.dtype), UOp.const(op.dtype, c)) for n in counts]  # type: ignore[union-attr]
    res[lane] = vals[0] if len(vals) == 1 else UOp(UOps.VECTORIZE, op.dtype.vec(s.W), tuple(vals))
  return res

def _count(s: LoweringState, valid: sint, loop_vars: dict[Variable, int]) -> Optional[UOp]:
  """How many values of the loop variables make `valid` true, if it bounds one of them linearly."""
  conds = [] if valid == 1 else list(valid.nodes) if isinstance(valid, And) else [valid]
  dep = {v for cnd in conds if isinstance(cnd, Node) for v in cnd.vars() if v in loop_vars}
  if len(dep) > 1: return None
  r = next(iter(dep)) if dep else None
  size = prod(s.shape[a] for v, a in loop_vars.items() if v is not r)
  lo: list[sint] = [0]
  hi: list[sint] = [s.shape[loop_vars[r]]] if r is not None else []
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
  total = prod(_ceil(s.shape[a]) for a in loop_vars.values())
  wide = s.ix.needs_int64(total) or any(s.ix.needs_int64(x, headroom=2) for x in lo + hi)
  dt = dtypes.int64 if wide else dtypes.int32
  if r is None: n: UOp = UOp.const(dt, 1)
  else:
    lo_u = [s.ix.sym(x, dt) for x in lo]
    hi_u = [s.ix.sym(x, dt) for x in hi]
    top, bot = hi_u[0], lo_u[0]
    for h in hi_u[1:]: top = UOp.alu(UnaryOps.NEG, UOp.alu(BinaryOps.MAX, UOp.alu(UnaryOps.NEG, top), UOp.alu(UnaryOps.NEG, h)))
    for b in lo_u[1:]: bot = UOp.alu(BinaryOps.MAX, bot, b)
    n = UOp.alu(BinaryOps.MAX, UOp.alu(BinaryOps.SUB, top, bot), UOp.const(dt, 0))
  if size != 1: n = UOp.alu(BinaryOps.MUL, n, UOp.const(dt, size))
  if free: n = UOp.alu(TernaryOps.WHERE, s.ix.sym_bool(sym_and(*free)), n, UOp.const(dt, 0))
  return n

def _group_ranges(s: LoweringState) -> list[tuple[int, Variable, UOp]]:
  """(axis, loop variable, RANGE) for each group axis: the nested loops of a grouped reduce's
  second stage (reading local memory), outermost first."""
  ranges = []
  for a in s.group_axes:
    if s.shape[a] == 1 or a in s.white: continue  # a white axis is not reduced: `mid` gives its index
    v = Variable(f"gridx{a}", 0, s.shape[a] - 1)
    r = UOp(UOps.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 0), UOp.const(dtypes.int32, s.shape[a])) + ((ranges[-1][2],) if ranges else ()), ("reduce", a))
    s.varmap[v] = r
    ranges.append((a, v, r))
  return ranges

def _identity(op: Any, dtype: DType) -> Any:
  if op is ReduceOps.SUM: return 0
  return dtypes.min(dtype.scalar())
