"""Linearize: order a UOp graph into a list the renderers print top to bottom.

Each UOp lives in the innermost loop whose index it depends on (so loop-invariant work is hoisted
out of loops automatically). Within one loop body, the UOps and the nested loops are ordered
topologically as units: a nested loop is emitted whole (RANGE, body, ENDRANGE), and what reads an
accumulator after a loop depends on that loop's ENDRANGE. Sibling loops are never nested.
"""
from __future__ import annotations
import heapq
from typing import Optional
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import dtypes
from tilecraft.ops import TernaryOps
from tilecraft.shape.symbolic import sint

_DEFERRABLE = {UOps.ALU, UOps.CAST, UOps.BITCAST, UOps.GEP, UOps.VECTORIZE}  # pure values (see emit)
DEFER_AFTER_LOOPS = True  # (the switch is for A/B measurements)

def _late(u: UOp) -> bool:
  """A pure value or a load from a kernel argument: placed where it is used costs nothing but its recomputation."""
  return u.op in _DEFERRABLE or (u.op is UOps.LOAD and u.src[0].op is UOps.DEFINE_GLOBAL)

def _sink_epilogue_values(topo: list[UOp], scope: dict, rng: dict, depth: dict) -> None:
  """Move into loop R each _late value whose uses are all in R's own body and feed none of R's nested loops (a bias
  or residual read by a conv tile's epilogue, after its reduce loop): hoisted above R it would be live across R's
  reduce, in registers the accumulators need (or spilled and reloaded). In R, emit puts it after the reduce. In
  reverse graph order, so a chain of such values (a load, its broadcast) moves together. `scope` (uop -> its loop,
  None at the top) is updated in place."""
  users: dict[UOp, list[UOp]] = {}
  for u in topo:
    for x in u.src: users.setdefault(x, []).append(u)
  def level(r: Optional[UOp]) -> int: return -1 if r is None else depth[r]
  deepest: dict[UOp, int] = {}  # the deepest loop a value's uses (transitively) run in
  for u in reversed(topo):
    if u.op in (UOps.RANGE, UOps.ENDRANGE, UOps.SINK): continue
    us = users.get(u, [])
    if _late(u) and us and all(w in scope and scope[w] is not None for w in us):  # (a loop's bound stays above the loop)
      r = scope[us[0]]
      if all(scope[w] is r for w in us) and all(deepest[w] == level(r) for w in us) and level(r) > level(scope[u]) and \
          (scope[u] is None or scope[u] in rng[r]):
        scope[u] = r
    deepest[u] = max([level(scope[u])] + [deepest[w] if w in scope else depth.get(w, 1 << 30) for w in us])

def linearize_uops(sink: UOp) -> list[UOp]:
  topo = sink.toposort()
  order = {u: i for i, u in enumerate(topo)}
  rng: dict[UOp, frozenset] = {}
  for u in topo:
    if u.op is UOps.ENDRANGE: rng[u] = rng[u.src[0]] - {u.src[0]}
    else:
      s = frozenset().union(*[rng[x] for x in u.src]) if u.src else frozenset()
      rng[u] = s | {u} if u.op is UOps.RANGE else s
  depth = {r: len(rng[r]) - 1 for r in topo if r.op is UOps.RANGE}
  def innermost(s: frozenset) -> Optional[UOp]: return max(s, key=lambda r: depth[r]) if s else None
  def chain(scope: Optional[UOp]) -> list[UOp]: return [] if scope is None else sorted(rng[scope], key=lambda r: depth[r])
  scope = {u: innermost(rng[u]) for u in topo if u.op not in (UOps.RANGE, UOps.ENDRANGE, UOps.SINK)}
  if DEFER_AFTER_LOOPS: _sink_epilogue_values(topo, scope, rng, depth)
  def path(u: UOp) -> list[UOp]:
    if u.op is UOps.ENDRANGE: return path(u.src[0])
    if u.op is UOps.RANGE: return chain(u)
    return chain(scope[u]) + [u]
  # per scope: the units (uops and nested loops) and the order constraints between them
  units: dict[Optional[UOp], set[UOp]] = {}
  edges: dict[Optional[UOp], set[tuple[UOp, UOp]]] = {}
  paths = {u: path(u) for u in topo if u.op is not UOps.SINK}
  for u, p in paths.items():
    if u.op is UOps.ENDRANGE: continue
    for d, unit in enumerate(p): units.setdefault(p[d - 1] if d else None, set()).add(unit)
    for s in u.src:
      ps = paths[s]
      for d, (a, b) in enumerate(zip(ps, p)):
        if a is not b:
          edges.setdefault(p[d - 1] if d else None, set()).add((a, b))
          break
  out: list[UOp] = []
  def emit(scope: Optional[UOp]) -> None:
    members = units.get(scope, set())
    indeg = {m: 0 for m in members}
    succ: dict[UOp, list[UOp]] = {}
    pred: dict[UOp, list[UOp]] = {}
    for a, b in edges.get(scope, ()):
      if a in indeg and b in indeg:
        indeg[b] += 1
        succ.setdefault(a, []).append(b)
        pred.setdefault(b, []).append(a)
    # what no loop of this scope needs (an epilogue's loads and math after a reduce loop) goes after the loops: held
    # across a loop it takes registers from the loop body
    feeds_loop: set[UOp] = set()
    stack = [m for m in members if m.op is UOps.RANGE]
    while stack:
      for a in pred.get(stack.pop(), ()):
        if a not in feeds_loop: feeds_loop.add(a); stack.append(a)  # noqa: E702
    def key(m: UOp) -> tuple:
      late = DEFER_AFTER_LOOPS and m not in feeds_loop and _late(m)
      return (late, order[m], id(m), m)
    heap = [key(m) for m, d in indeg.items() if d == 0]
    heapq.heapify(heap)
    done = 0
    while heap:
      m = heapq.heappop(heap)[-1]
      done += 1
      out.append(m)
      if m.op is UOps.RANGE:
        emit(m)
        out.append(UOp(UOps.ENDRANGE, dtypes.void, (m,)))
      for n in succ.get(m, ()):
        indeg[n] -= 1
        if indeg[n] == 0: heapq.heappush(heap, key(n))
    if done != len(members): raise RuntimeError("linearize: the UOp graph has a cycle between loops")
  emit(None)
  return out

def range_size(r: UOp) -> sint:
  """The trip count of a RANGE as a symbolic int."""
  return uop_to_sint(r.src[1]) - uop_to_sint(r.src[0])

def uop_to_sint(u: UOp) -> sint:
  from tilecraft.ops import BinaryOps
  if u.op is UOps.CONST: return int(u.arg)
  if u.op is UOps.DEFINE_VAR: return u.arg
  if u.op is UOps.CAST: return uop_to_sint(u.src[0])
  if u.op is UOps.SPECIAL: return u.arg[1] if isinstance(u.arg[1], int) else uop_to_sint(u.arg[1])
  if u.op is UOps.ALU and u.arg in (BinaryOps.ADD, BinaryOps.MUL):
    a, b = uop_to_sint(u.src[0]), uop_to_sint(u.src[1])
    return a + b if u.arg is BinaryOps.ADD else a * b
  raise ValueError(f"not a size: {u}")

def estimate_flops(uops: list[UOp]) -> sint:
  """ALU operations on non-index values, times the trip counts of the loops around them."""
  mult: sint = 1
  stack: list[sint] = []
  flops: sint = 0
  for u in uops:
    if u.op is UOps.RANGE:
      stack.append(mult)
      mult = mult * range_size(u)
    elif u.op is UOps.ENDRANGE: mult = stack.pop()
    elif u.op is UOps.SPECIAL: mult = mult * uop_to_sint(u)
    elif u.op is UOps.ALU and dtypes.is_float(u.dtype):
      flops = flops + mult * u.dtype.count * (2 if u.arg is TernaryOps.MULACC else 1)
  return flops
