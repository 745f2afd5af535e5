"""The one rewrite engine: patterns over UOps, applied bottom-up to a fixed point.

A rule is (UPat, fn). `fn(**captures)` returns a replacement UOp or None (no change). Because UOps
are hash-consed, rebuilding a node with rewritten sources is also common-subexpression elimination.
"""
from __future__ import annotations
import math
from typing import Any, Callable, Iterable, Optional, Union
from tilecraft.codegen.uops import UOp, UOps, exec_alu
from tilecraft.dtype import DType, dtypes
from tilecraft.ops import BinaryOps, TernaryOps

class UPat:
  """Matches a UOp by op (one or a set), ALU arg, dtype, and sources; `name` captures the match.
  `src=None` matches any sources; a tuple must match position by position; `commutative=True`
  also tries the two sources of a binary op swapped."""
  __slots__ = ("ops", "arg", "dtypes", "src", "name", "commutative", "pred")
  def __init__(self, op: Union[UOps, set, None] = None, arg: Any = None, src: Optional[tuple] = None, name: Optional[str] = None,
               dtype: Union[DType, set, None] = None, commutative: bool = False, pred: Optional[Callable[[UOp], bool]] = None):
    self.ops = None if op is None else (frozenset(op) if isinstance(op, (set, frozenset)) else frozenset({op}))
    self.arg, self.src, self.name, self.commutative, self.pred = arg, src, name, commutative, pred
    self.dtypes = None if dtype is None else (frozenset(dtype) if isinstance(dtype, (set, frozenset)) else frozenset({dtype}))

  @staticmethod
  def alu(op: Any, *src: "UPat", name: Optional[str] = None, commutative: bool = False) -> "UPat":
    return UPat(UOps.ALU, op, tuple(src) if src else None, name, commutative=commutative)
  @staticmethod
  def cvar(name: str, dtype: Any = None) -> "UPat": return UPat(UOps.CONST, name=name, dtype=dtype)
  @staticmethod
  def var(name: str, dtype: Any = None) -> "UPat": return UPat(name=name, dtype=dtype)

  def match(self, u: UOp, caps: dict[str, UOp]) -> bool:
    if self.ops is not None and u.op not in self.ops: return False
    if self.arg is not None and (u.arg not in self.arg if isinstance(self.arg, (set, frozenset)) else u.arg != self.arg): return False
    if self.dtypes is not None and u.dtype not in self.dtypes and u.dtype.scalar() not in self.dtypes: return False
    if self.pred is not None and not self.pred(u): return False
    if self.name is not None:
      if self.name in caps and caps[self.name] is not u: return False
    if self.src is not None:
      if len(self.src) != len(u.src): return False
      saved = dict(caps)
      if not all(p.match(s, caps) for p, s in zip(self.src, u.src)):
        caps.clear(); caps.update(saved)
        if not (self.commutative and len(u.src) == 2 and self.src[0].match(u.src[1], caps) and self.src[1].match(u.src[0], caps)):
          caps.clear(); caps.update(saved)
          return False
    if self.name is not None: caps[self.name] = u
    return True

class PatternMatcher:
  def __init__(self, rules: Iterable[tuple[UPat, Callable[..., Optional[UOp]]]]):
    self.rules = list(rules)
    self._by_key: dict[tuple, list[tuple[UPat, Callable]]] = {}
  def __add__(self, other: "PatternMatcher") -> "PatternMatcher": return PatternMatcher(self.rules + other.rules)
  def _candidates(self, op: UOps, arg: Any) -> list[tuple[UPat, Callable]]:
    """The rules that can match a UOp with this op (and, for ALUs, this ALU op), in rule order."""
    key = (op, arg if op is UOps.ALU else None)
    if (c := self._by_key.get(key)) is None:
      c = self._by_key[key] = [(p, f) for p, f in self.rules if (p.ops is None or op in p.ops) and
                               (op is not UOps.ALU or p.arg is None or (arg in p.arg if isinstance(p.arg, (set, frozenset)) else p.arg == arg))]
    return c
  def rewrite(self, u: UOp) -> Optional[UOp]:
    for pat, fn in self._candidates(u.op, u.arg if u.op is UOps.ALU else None):
      caps: dict[str, UOp] = {}
      if pat.match(u, caps) and (r := fn(**caps)) is not None and r is not u: return r
    return None

def graph_rewrite(sink: UOp, pm: PatternMatcher) -> UOp:
  """Rewrite every node bottom-up until no rule applies anywhere (a fixed point). A node's sources are
  rewritten first, then the node until no rule applies (at most 1000 times), each replacement's own
  new subgraph rewritten before the next try. Iterative (an explicit stack): a graph may be any depth."""
  done: dict[UOp, UOp] = {}
  # frames: (node, None, 0) to visit; (node, None, -1) to rebuild on its rewritten sources and rewrite;
  # (node, r, n) to go on rewriting once the replacement r (the node's n-th) is done
  stack: list[tuple[UOp, Optional[UOp], int]] = [(sink, None, 0)]
  active: set[UOp] = set()  # visited, not done: a replacement that holds one of these is a cycle of rules
  while stack:
    u, r, n = stack.pop()
    if r is None and n == 0:
      if u in done: continue
      if u in active: raise RuntimeError(f"rewrite rules cycle: a replacement holds the node it replaces ({u.op}, {u.arg!r})")
      active.add(u)
      stack.append((u, None, -1))
      stack.extend((s, None, 0) for s in reversed(u.src) if s not in done)
      continue
    if r is None:
      new, n = u, 0
      if u.src:
        srcs = tuple([done[s] for s in u.src])
        if any(a is not b for a, b in zip(srcs, u.src)): new = u.replace(src=srcs)
    else: new = done[r]
    while n < 1000:
      if (r := pm.rewrite(new)) is None: break
      n += 1
      if (hit := done.get(r)) is None:  # a replacement may hold new, not yet rewritten subgraphs
        stack.append((u, r, n))
        stack.append((r, None, 0))
        break
      new = hit
    else: r = None
    if r is None:
      done[u] = done[new] = new
      active.discard(u)
  return done[sink]

# ---- rule sets -------------------------------------------------------------------------------------

def _fold(op: Any, dtype: DType, *vals: Any) -> Optional[UOp]:
  try: return UOp.const(dtype, exec_alu(op, dtype, list(vals)))
  except (ZeroDivisionError, OverflowError, KeyError): return None

def _fold_alu(a: UOp) -> Optional[UOp]:
  if a.dtype.count > 1 or not all(s.op is UOps.CONST for s in a.src): return None
  if a.arg is BinaryOps.IDIV and a.src[1].arg == 0: return None  # keep the hardware's behaviour
  return _fold(a.arg, a.dtype, *[s.arg for s in a.src])

def _splat(u: UOp) -> Any:
  """The constant value of a CONST, or of a VECTORIZE whose lanes are all the same CONST; else None."""
  if u.op is UOps.CONST: return u.arg
  if u.op is UOps.VECTORIZE and all(s is u.src[0] for s in u.src) and u.src[0].op is UOps.CONST: return u.src[0].arg
  return None

def _fold_vector_alu(a: UOp) -> Optional[UOp]:
  """An ALU over vectors of constants is a vector of folded constants."""
  if a.dtype.count == 1 or not all(s.op is UOps.VECTORIZE and all(x.op is UOps.CONST for x in s.src) or s.op is UOps.CONST for s in a.src): return None
  lanes = []
  for i in range(a.dtype.count):
    vals = [s.src[i].arg if s.op is UOps.VECTORIZE else s.arg for s in a.src]
    if (c := _fold(a.arg, a.dtype.scalar(), *vals)) is None: return None
    lanes.append(c)
  return UOp(UOps.VECTORIZE, a.dtype, tuple(lanes))

def _is_int(u: UOp) -> bool: return dtypes.is_int(u.dtype) or u.dtype.scalar() == dtypes.bool
def _c(u: UOp, v: Any) -> UOp: return UOp.const(u.dtype, v)
def _adds_nothing(x: UOp, c: Any, sub: bool = False) -> bool:
  """x + c == x (x - c == x with sub) for every x: c == 0 for ints, but for floats only -0.0 added
  (+0.0 subtracted), since -0.0 + 0.0 is +0.0."""
  if c is None or isinstance(c, tuple) or c != 0: return False
  if not dtypes.is_float(x.dtype.scalar()): return True
  return math.copysign(1.0, c) > 0 if sub else math.copysign(1.0, c) < 0

X = UPat.var("x")
constant_folding = PatternMatcher([
  (UPat(UOps.ALU, name="a"), _fold_alu),
  (UPat(UOps.ALU, name="a"), _fold_vector_alu),
  (UPat(UOps.CAST, name="c", src=(UPat.cvar("x"),)), lambda c, x: UOp.const(c.dtype, x.arg) if c.dtype.count == 1 and not isinstance(x.arg, tuple) else None),
  (UPat(UOps.GEP, name="g", src=(UPat(UOps.VECTORIZE, name="v"),)), lambda g, v: v.src[g.arg]),
  (UPat(UOps.VECTORIZE, name="v", src=None), lambda v: v.src[0].src[0] if all(s.op is UOps.GEP and s.src[0] is v.src[0].src[0] and s.arg == i for i, s in enumerate(v.src)) and v.src[0].src[0].dtype == v.dtype else None),
])

algebraic = PatternMatcher([
  # identities
  (UPat.alu(BinaryOps.ADD, X, UPat(UOps.CONST, name="c"), commutative=True), lambda x, c: x if _adds_nothing(x, c.arg) else None),
  (UPat.alu(BinaryOps.ADD, X, UPat(UOps.VECTORIZE, name="c"), commutative=True), lambda x, c: x if _adds_nothing(x, _splat(c)) and x.dtype == c.dtype else None),
  (UPat.alu(BinaryOps.MUL, X, UPat(UOps.CONST, name="c"), commutative=True), lambda x, c: x if c.arg == 1 else (_c(x, 0) if c.arg == 0 and _is_int(x) else None)),
  (UPat.alu(BinaryOps.MUL, X, UPat(UOps.VECTORIZE, name="c"), commutative=True), lambda x, c: x if _splat(c) == 1 and x.dtype == c.dtype else None),
  (UPat.alu(BinaryOps.SUB, X, UPat.cvar("c")), lambda x, c: x if _adds_nothing(x, c.arg, sub=True) else None),
  (UPat.alu(BinaryOps.IDIV, X, UPat.cvar("c")), lambda x, c: x if c.arg == 1 else None),
  (UPat.alu(BinaryOps.MOD, X, UPat.cvar("c")), lambda x, c: _c(x, 0) if c.arg == 1 and _is_int(x) else None),
  (UPat.alu(BinaryOps.AND, X, UPat.cvar("c"), commutative=True), lambda x, c: x if c.arg is True and x.dtype == dtypes.bool else (c if c.arg is False else None)),
  (UPat.alu(BinaryOps.OR, X, UPat.cvar("c"), commutative=True), lambda x, c: x if c.arg is False and x.dtype == dtypes.bool else None),
  (UPat.alu(BinaryOps.AND, X, X), lambda x: x),
  (UPat.alu(BinaryOps.MAX, X, X), lambda x: x),
  (UPat(UOps.ALU, TernaryOps.WHERE, (UPat.cvar("c"), UPat.var("a"), UPat.var("b"))), lambda c, a, b: a if c.arg else b),
  (UPat(UOps.ALU, TernaryOps.WHERE, (UPat.var("c"), UPat.var("a"), UPat.var("a"))), lambda c, a: a),
  (UPat(UOps.CAST, name="c", src=(X,)), lambda c, x: x if c.dtype == x.dtype else None),
  # x - x, x < x, x != x for ints
  (UPat.alu(BinaryOps.CMPNE, UPat.var("x", dtypes.bool), UPat.cvar("c")), lambda x, c: x if c.arg is False else None),
  (UPat.alu(BinaryOps.CMPNE, X, X, name="cmp"), lambda cmp, x: UOp.const(cmp.dtype, False) if _is_int(x) else None),
  (UPat.alu(BinaryOps.CMPLT, X, X, name="cmp"), lambda cmp, x: UOp.const(cmp.dtype, False)),  # a vector compare gives a vector
  # (x + c1) + c2 -> x + (c1 + c2) for ints: keeps index arithmetic short
  (UPat.alu(BinaryOps.ADD, UPat.alu(BinaryOps.ADD, X, UPat.cvar("c1")), UPat.cvar("c2")),
   lambda x, c1, c2: x + _c(x, c1.arg + c2.arg) if _is_int(x) else None),
  # a gated load whose gate is always true is a plain load
  (UPat(UOps.LOAD, name="ld", src=(UPat.var("b"), UPat.var("i"), UPat.cvar("g"), UPat.var("alt"))),
   lambda ld, b, i, g, alt: (UOp(UOps.LOAD, ld.dtype, (b, i), ld.arg) if g.arg else alt) if g.dtype.scalar() == dtypes.bool else None),
  (UPat(UOps.STORE, name="st", src=(UPat.var("b"), UPat.var("i"), UPat.var("v"), UPat.cvar("g"))),
   lambda st, b, i, v, g: UOp(UOps.STORE, st.dtype, (b, i, v), st.arg) if g.arg else UOp(UOps.SINK, dtypes.void, ())),
])

def _is_bf16(dt: DType) -> bool: return dt.scalar() == dtypes.bfloat16
def _f32_for(dt: DType) -> DType: return dtypes.float32.vec(dt.count) if _is_bf16(dt) else dt

def _promote_bf16(a: UOp) -> Optional[UOp]:
  """No target computes in bfloat16 (C, OpenCL and LLVM hold it as its 16 bits): an ALU op that reads
  or makes bfloat16 values reads them as float32 (exact), computes in float32 and rounds its bfloat16
  result to nearest even once (a CAST), as a bfloat16 op would. The lowerer does this for elementwise
  ops already; this rule catches every other ALU (accumulator updates, horizontal and grouped combines)."""
  if not (_is_bf16(a.dtype) or any(_is_bf16(s.dtype) for s in a.src)): return None
  return UOp(UOps.ALU, _f32_for(a.dtype), tuple(s.cast(_f32_for(s.dtype)) for s in a.src), a.arg).cast(a.dtype)

# bfloat16 arithmetic as float32 arithmetic (first: the rules after it then see float32 ops)
bf16_promote = PatternMatcher([(UPat(UOps.ALU, name="a"), _promote_bf16)])

symbolic_rules = bf16_promote + constant_folding + algebraic
