"""Tensor-core reduces as UOps (functions of the LoweringState, lower_state.py): WMMA instructions over per-thread
fragments (use 1), or the same layout emulated with plain multiply-adds, through local memory in
the vendor's register layout (use 3).

A thread holds one lane of its warp on targets with threads (the lane bits are thread ids). On a
target without them (CPU) use 3 holds the whole warp in one thread: the lane axes are expanded
lanes (LoweringState.warp_axes), every lane's fragments are staged into one stack array, and
each lane reads back from it what its C registers need. Program order does what the barrier does
on a GPU: all the warp's stores come before its loads, in one thread."""
from __future__ import annotations
import itertools
from tilecraft.codegen.lower_index import _ceil
from tilecraft.codegen.lower_state import LowerOp, LoweringState
from tilecraft.codegen.tensor_cores import WMMAInfo
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import dtypes
from tilecraft.helpers import prod
from tilecraft.ops import BinaryOps, LazyOp
from tilecraft.shape.symbolic import sint

def lower_wmma(s: LoweringState, op: LazyOp, lower_op: LowerOp) -> dict[tuple, UOp]:
  """A WMMA reduce: per lane, the A/B fragments are its operands' values at the register
  positions, C is a vector accumulator over C's register positions; the serial reduce loops
  accumulate, and unrolled (non-tile) reduce lanes chain one instruction each."""
  from tilecraft.renderer.tensor_cores import wmma_arg
  info: WMMAInfo = op.arg[4]
  tc = info.tc
  A, B = lower_op(s, op.src[0], True), lower_op(s, op.src[1], True)
  red = set(op.arg[-1])
  ranges = [r for r in s.reduce_ranges if r.arg[1] in red]
  pos = {a: i for i, a in enumerate(s.lane_axes)}
  warp = [a for a in info.lanes if a in pos]  # the warp's lanes this thread holds (CPU use 3), else none
  assert not warp or (info.use == 3 and len(warp) == len(info.lanes)), "a thread holds one lane or the whole warp"
  tc_up = set(info.a_regs + info.b_regs + info.c_regs + info.k_axes + tuple(warp))
  other = [a for a in s.lane_axes if a not in tc_up]
  yellow, mag = [a for a in other if a not in s.magenta], [a for a in other if a in s.magenta]
  nc = 1 << len(info.c_regs)
  vec = tc.dtype_out.vec(nc)
  def at(base: list[int], axes: tuple[int, ...], i: int) -> tuple[int, ...]:
    lane = list(base)
    for j, a in enumerate(axes): lane[pos[a]] = (i >> j) & 1
    return tuple(lane)
  def frag(vals: dict, base: list[int], axes: tuple[int, ...]) -> UOp:
    return UOp(UOps.VECTORIZE, tc.dtype_in.vec(1 << len(axes)), tuple(vals[at(base, axes, i)] for i in range(1 << len(axes))))
  def setting(base: list[int], axes: list[int], vals: tuple[int, ...]) -> list[int]:
    lane = list(base)
    for a, v in zip(axes, vals): lane[pos[a]] = v
    return lane
  res: dict[tuple, UOp] = {}
  for yl in itertools.product(*[range(s.shape[a]) for a in yellow]):
    held = []  # [lane, accumulator, C value] per lane of the warp this thread holds
    for wl in itertools.product(*[range(s.shape[a]) for a in warp]):
      s.acc_count += 1
      acc = None
      if ranges:
        acc = UOp(UOps.DEFINE_ACC, vec, (UOp.const(vec, 0),) + ranges[0].src[2:], s.acc_count)
        c = UOp(UOps.ACCREAD, vec, (acc,) + tuple(ranges))
      else: c = UOp.const(vec, 0)
      held.append([setting(setting([0] * len(s.lane_axes), yellow, yl), warp, wl), acc, c])
    for ml in itertools.product(*[range(s.shape[a]) for a in mag]):
      lanes = [setting(h[0], mag, ml) for h in held]
      fas, fbs = [frag(A, lane, info.a_regs) for lane in lanes], [frag(B, lane, info.b_regs) for lane in lanes]
      if info.use == 1: cs = [UOp(UOps.WMMA, vec, (fa, fb, h[2]), wmma_arg(tc)) for fa, fb, h in zip(fas, fbs, held)]
      else: cs = _emulate_wmma(s, info, [(lane, fa, fb, h[2]) for lane, fa, fb, h in zip(lanes, fas, fbs, held)], ranges)
      for h, c in zip(held, cs): h[2] = c
    for base, acc, c in held:
      if acc is not None:
        phi = UOp(UOps.PHI, vec, (acc, c) + tuple(ranges))
        c = UOp(UOps.ACCREAD, vec, (acc, UOp(UOps.ENDRANGE, dtypes.void, (ranges[0], phi))))
      for i in range(nc): res[at(base, info.c_regs, i)] = c.gep(i)
  return res

def _emulate_wmma(s: LoweringState, info: WMMAInfo, held: list[tuple[list[int], UOp, UOp, UOp]], ranges: list[UOp]) -> list[UOp]:
  """use 3: each lane stores its A and B registers to local memory in the vendor's layout; after a
  barrier each lane reads back, from the lanes and registers holding them, the A and B elements
  its C registers need, and multiply-adds them. `held`: (lane, A, B, C fragments) of each lane this
  thread holds. The buffers alternate between two halves on successive reduce iterations, so one
  barrier per step keeps the next step's stores apart from this step's reads."""
  tc = info.tc
  lay = tc.layout
  n_lane = len(info.lanes)
  pos = {a: i for i, a in enumerate(s.lane_axes)}
  def lane_bits(lane: list[int]) -> dict[int, sint]:  # lane bit j -> its value (a thread id, or this expanded lane's)
    return {j: lane[pos[a]] if a in pos else s.idx_vars[a] for j, a in ((j, info.lanes[n_lane - 1 - j]) for j in range(n_lane))}
  bits = [lane_bits(h[0]) for h in held]
  own = [sum((v * (1 << j) for j, v in lb.items()), 0) for lb in bits]
  others = [a for a in range(s.global_dims, s.first_reduce) if a not in info.lanes]
  warp: sint = 0
  for a in others: warp = warp * s.shape[a] + s.idx_vars[a]
  warps = prod(s.shape[a] for a in others)
  parity: sint = 0
  one_thread = bool(s.warp_axes)  # the whole warp in this thread: program order keeps the steps apart
  if ranges and not one_thread:
    it: sint = 0
    for r in ranges: it = it * _ceil(s.shape[r.arg[1]]) + s.idx_vars[r.arg[1]]
    parity = it % 2
  # which C coordinate bit each own lane / register bit is (C is a bijection), for reading back
  c_src: dict[str, tuple[str, int]] = {b: ("lane", j) for j, b in enumerate(lay.c.lanes)} | {b: ("reg", j) for j, b in enumerate(lay.c.regs)}
  def stage(k: int) -> tuple[UOp, UOp, int]:
    nregs = held[0][k].dtype.count
    size = warps * tc.threads * nregs * (2 if ranges and not one_thread else 1)
    s.acc_count += 1
    buf = UOp(UOps.DEFINE_LOCAL, tc.dtype_in.ptr(local=True), (), (f"tc{s.acc_count}", size))
    stores = tuple(s.store(buf, ((parity * warps + warp) * tc.threads + o) * nregs + r, 1, h[k].gep(r)) for o, h in zip(own, held) for r in range(nregs))
    return buf, UOp(UOps.BARRIER, dtypes.void, stores), nregs
  bufs = [stage(1), stage(2)]
  n, m, kk = tc.dims
  out = []
  for lb, h in zip(bits, held):
    c = h[3]
    vals = []
    for ci in range(c.dtype.count):
      total = c.gep(ci)
      for kv in range(kk):
        def bit(b: str) -> sint:  # the value of coordinate bit b for this lane's C register ci at k = kv
          if b[0] == "k": return (kv >> int(b[1:])) & 1
          kind, j = c_src[b]
          return lb[j] if kind == "lane" else (ci >> j) & 1
        prods = []
        for (buf, barrier, nregs), frag in zip(bufs, (lay.a, lay.b)):
          lane: sint = sum((bit(b) * (1 << j) for j, b in enumerate(frag.lanes) if b is not None), 0)
          reg: sint = sum((bit(b) * (1 << j) for j, b in enumerate(frag.regs)), 0)
          idx = ((parity * warps + warp) * tc.threads + lane) * nregs + reg
          prods.append(s.load(buf, idx, 1, tc.dtype_in, barrier).cast(tc.dtype_out))
        total = UOp.alu(BinaryOps.ADD, total, UOp.alu(BinaryOps.MUL, prods[0], prods[1]))
      vals.append(total)
    out.append(UOp(UOps.VECTORIZE, c.dtype, tuple(vals)))
  return out
