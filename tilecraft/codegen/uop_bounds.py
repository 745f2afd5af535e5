"""Integer bounds and divisibility of UOps: the one range analysis over the UOp graph.

`bound(u)` of an integer or bool UOp is a `Bound(vmin, vmax, divisor, wraps)`, and it promises:
- every value `u` takes (in every thread, every loop iteration, every vector lane) lies in
  [vmin, vmax], and is a multiple of `divisor` (0: the value is always 0, a multiple of every n;
  1: nothing is known);
- `wraps` is True when the exact result of `u`'s operation (on unbounded integers, over its
  operands' bounds) can leave `u`'s dtype, so the hardware may wrap it; [vmin, vmax] is then the
  type's whole range. Signed overflow is undefined in OpenCL C, CUDA, HIP and Metal, so the
  renderers use this to decide which arithmetic goes through unsigned types.
The bounds are sound, not exact: a value outside them is a bug here, a bound wider than needed is
not. Semantics are C's, as every target computes them: integer division truncates toward zero, the
remainder takes the dividend's sign, shifts are by 0..63 bits.

Known: CONST, DEFINE_VAR (its Variable's range), RANGE (start .. end-1), SPECIAL (0 .. size-1),
the integer ALUs (ADD SUB MUL NEG MULACC MAX WHERE CMPLT CMPNE IDIV MOD SHL SHR AND OR XOR), CAST
between integer and bool types, VECTORIZE and GEP. Anything else (a LOAD, an accumulator, a cast
from a float, a BITCAST) is unknown: the whole range of its type, divisor 1.

It is memoized per UOp: UOps are immutable and hash-consed, so a node's bound is a function of the
node alone, computed once (iteratively, sources first: a graph may be any depth) and kept while
the node lives.

Users: the renderers' overflow check and aligned-vector test (`renderer/analysis.py:
overflowing_int_alus`, `multiple_of`; through them streaming stores and the GPU dialects' vector
legality: a vector access not provably aligned is split into lanes), and the tests' largest trip
counts of loops.

Not users, by design, because they decide before any UOp exists: the lowerer's int32/int64 choice
for index math (`lower_index._needs_int64`) and the simplification of masks (valid expressions).
Both work on the symbolic index expression (`shape/symbolic.py` vmin/vmax, the one symbolic system),
from which every index and gate UOp is built with its dtype already chosen. The int64 choice also
bounds every partial sum in any order of its terms, because later rewrites may re-associate a sum;
a bound of the UOps as first built would cover only the order they were built in, and a constant
past int32 would already have been truncated by `UOp.const`. This analysis checks the result: no
UOp an address is computed from `wraps` (tests/codegen/test_uop_bounds.py,
tests/renderer/test_signed_overflow.py).
"""
from __future__ import annotations
import math, weakref
from dataclasses import dataclass
from typing import Callable, Optional
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import DType, dtypes
from tilecraft.ops import BinaryOps, TernaryOps, UnaryOps

@dataclass(frozen=True)
class Bound:
  """What every value of one integer/bool UOp satisfies (see the module docstring)."""
  vmin: int
  vmax: int
  divisor: int  # every value is a multiple of it; 0: the value is always 0
  wraps: bool = False  # the exact result can leave the dtype (then vmin/vmax are the type's range)

  def multiple_of(self, n: int) -> bool:
    """Whether every value is provably a multiple of n (n > 0)."""
    return self.divisor % n == 0

def is_integral(dt: DType) -> bool:
  """The dtypes this analysis bounds: ints and bools (vectors of them too)."""
  return dtypes.is_int(dt) or dtypes.is_bool(dt)

_memo: "weakref.WeakKeyDictionary[UOp, Bound]" = weakref.WeakKeyDictionary()

def bound(u: UOp) -> Bound:
  """The Bound of the integer or bool UOp u (memoized)."""
  if (b := _memo.get(u)) is not None: return b
  if not is_integral(u.dtype): raise ValueError(f"uop_bounds: {u.op.name} of dtype {u.dtype} is not an integer or bool value")
  stack = [u]
  while stack:
    x = stack[-1]
    if x in _memo:
      stack.pop()
      continue
    todo = [s for s in _inputs(x) if s not in _memo]
    if todo:
      stack.extend(todo)
      continue
    stack.pop()
    _memo[x] = _compute(x)
  return _memo[u]

def multiple_of(u: UOp, n: int) -> bool:
  """Whether the integer UOp u is provably a multiple of n (every value it can take)."""
  return n == 1 or bound(u).multiple_of(n)

# ---- the rules -----------------------------------------------------------------------------------

def _inputs(u: UOp) -> list[UOp]:
  """The UOps whose bounds u's bound is computed from."""
  if u.op is UOps.SPECIAL: return [u.arg[1]] if isinstance(u.arg[1], UOp) else []
  if u.op is UOps.GEP and u.src[0].op is UOps.VECTORIZE: return [u.src[0].src[u.arg]]  # the lane itself
  if u.op is UOps.RANGE: return list(u.src[:2])  # (start, end); a third source only orders it after its parent loop
  if u.op in (UOps.ALU, UOps.CAST, UOps.VECTORIZE, UOps.GEP): return [s for s in u.src if is_integral(s.dtype)]
  return []

def _type_range(dt: DType) -> tuple[int, int]: return int(dtypes.min(dt)), int(dtypes.max(dt))

def _compute(u: UOp) -> Bound:
  dt = u.dtype.scalar()
  tmin, tmax = _type_range(dt)
  got = _exact(u)
  if got is None: return Bound(tmin, tmax, 1)
  lo, hi, d = got
  if lo < tmin or hi > tmax:  # the exact value can leave the type: it wraps (a cast: converts) into all of it
    return Bound(tmin, tmax, math.gcd(d, 1 << (8 * dt.itemsize)) if dtypes.is_int(dt) else 1, wraps=True)
  if lo == hi: d = abs(lo)
  return Bound(lo, hi, d)

def _corners(f: Callable[[int, int], int], a: Bound, b: Bound) -> tuple[int, int]:
  v = [f(x, y) for x in (a.vmin, a.vmax) for y in (b.vmin, b.vmax)]
  return min(v), max(v)

def _tdiv(a: int, b: int) -> int:
  """C division: truncation toward zero."""
  q = abs(a) // abs(b)
  return q if (a < 0) == (b < 0) else -q

def _low_bit(d: int) -> int:
  """The largest power of two dividing d (0 for 0: a multiple of every power)."""
  return d & -d

def _exact(u: UOp) -> Optional[tuple[int, int, int]]:
  """(lo, hi, divisor) of u's exact value over its inputs' bounds, before the dtype's range is
  applied; None where nothing is known."""
  op = u.op
  if op is UOps.CONST:
    vals = [int(v) for v in (u.arg if isinstance(u.arg, tuple) else (u.arg,))]
    return min(vals), max(vals), math.gcd(*vals)
  if op is UOps.DEFINE_VAR: return int(u.arg.vmin), int(u.arg.vmax), 1
  if op is UOps.SPECIAL:
    size = u.arg[1] if isinstance(u.arg[1], int) else bound(u.arg[1]).vmax
    return 0, max(0, size - 1), 1
  if op is UOps.RANGE:
    start, end = bound(u.src[0]), bound(u.src[1])
    return start.vmin, max(start.vmin, end.vmax - 1), 1
  if op is UOps.VECTORIZE:
    bs = [bound(s) for s in u.src]
    return min(b.vmin for b in bs), max(b.vmax for b in bs), math.gcd(*[b.divisor for b in bs])
  if op is UOps.GEP:
    src = u.src[0]
    b = bound(src.src[u.arg]) if src.op is UOps.VECTORIZE else bound(src)
    return b.vmin, b.vmax, b.divisor
  if op is UOps.CAST:
    if not is_integral(u.src[0].dtype): return None
    b = bound(u.src[0])
    if dtypes.is_bool(u.dtype): return _truth(b)
    return b.vmin, b.vmax, b.divisor
  if op is UOps.ALU: return _alu(u)
  return None

def _truth(b: Bound) -> tuple[int, int, int]:
  """The bool `b != 0`."""
  if b.vmin > 0 or b.vmax < 0: return 1, 1, 1
  if b.vmin == b.vmax == 0: return 0, 0, 0
  return 0, 1, 1

def _alu(u: UOp) -> Optional[tuple[int, int, int]]:
  op = u.arg
  if op in (BinaryOps.CMPLT, BinaryOps.CMPNE):
    if not all(is_integral(s.dtype) for s in u.src): return 0, 1, 1
    a, b = bound(u.src[0]), bound(u.src[1])
    if op is BinaryOps.CMPLT:
      if a.vmax < b.vmin: return 1, 1, 1
      if a.vmin >= b.vmax: return 0, 0, 0
      return 0, 1, 1
    if a.vmax < b.vmin or b.vmax < a.vmin: return 1, 1, 1
    if a.vmin == a.vmax == b.vmin == b.vmax: return 0, 0, 0
    return 0, 1, 1
  if not is_integral(u.dtype) or not all(is_integral(s.dtype) for s in u.src): return None
  s = [bound(x) for x in u.src]
  boolean = dtypes.is_bool(u.dtype)
  if op is BinaryOps.ADD: return s[0].vmin + s[1].vmin, s[0].vmax + s[1].vmax, math.gcd(s[0].divisor, s[1].divisor)
  if op is BinaryOps.SUB: return s[0].vmin - s[1].vmax, s[0].vmax - s[1].vmin, math.gcd(s[0].divisor, s[1].divisor)
  if op is BinaryOps.MUL: return (*_corners(lambda x, y: x * y, s[0], s[1]), s[0].divisor * s[1].divisor)
  if op is UnaryOps.NEG:
    if boolean: return 1 - s[0].vmax, 1 - s[0].vmin, 1  # logical not
    return -s[0].vmax, -s[0].vmin, s[0].divisor
  if op is TernaryOps.MULACC:
    lo, hi = _corners(lambda x, y: x * y, s[0], s[1])
    return lo + s[2].vmin, hi + s[2].vmax, math.gcd(s[0].divisor * s[1].divisor, s[2].divisor)
  if op is BinaryOps.MAX: return max(s[0].vmin, s[1].vmin), max(s[0].vmax, s[1].vmax), math.gcd(s[0].divisor, s[1].divisor)
  if op is TernaryOps.WHERE:
    c, a, b = s
    if c.vmin > 0 or c.vmax < 0: return a.vmin, a.vmax, a.divisor  # always true
    if c.vmin == c.vmax == 0: return b.vmin, b.vmax, b.divisor
    return min(a.vmin, b.vmin), max(a.vmax, b.vmax), math.gcd(a.divisor, b.divisor)
  a, b = s[0], s[1]
  if op is BinaryOps.IDIV:
    if b.vmin <= 0 <= b.vmax: return None  # a zero divisor: the hardware's business
    return (*_corners(_tdiv, a, b), 1)
  if op is BinaryOps.MOD:
    if b.vmin <= 0 <= b.vmax: return None
    small, big = min(abs(b.vmin), abs(b.vmax)), max(abs(b.vmin), abs(b.vmax)) - 1  # |remainder| <= big; below small it is a itself
    d = math.gcd(a.divisor, b.divisor)
    if a.vmin >= 0: return (a.vmin, a.vmax, a.divisor) if a.vmax < small else (0, min(a.vmax, big), d)
    if a.vmax <= 0: return (a.vmin, a.vmax, a.divisor) if a.vmin > -small else (max(a.vmin, -big), 0, d)
    return max(a.vmin, -big), min(a.vmax, big), d
  if op in (BinaryOps.SHL, BinaryOps.SHR):
    if b.vmin < 0 or b.vmax > 63: return None
    if op is BinaryOps.SHL: return (*_corners(lambda x, y: x << y, a, b), a.divisor << b.vmin)
    d = a.divisor >> b.vmin if b.vmin == b.vmax and a.divisor % (1 << b.vmin) == 0 else 1
    return (*_corners(lambda x, y: x >> y, a, b), d)
  if op in (BinaryOps.AND, BinaryOps.OR, BinaryOps.XOR):
    if boolean:
      if op is BinaryOps.AND: return a.vmin & b.vmin, a.vmax & b.vmax, 1
      if op is BinaryOps.OR: return a.vmin | b.vmin, a.vmax | b.vmax, 1
      if a.vmin != a.vmax or b.vmin != b.vmax: return 0, 1, 1
      return a.vmin ^ b.vmin, a.vmin ^ b.vmin, 1
    if op is BinaryOps.AND:  # low zero bits of either operand stay zero
      d = 0 if 0 in (a.divisor, b.divisor) else max(_low_bit(a.divisor), _low_bit(b.divisor))
      if a.vmin >= 0 and b.vmin >= 0: return 0, min(a.vmax, b.vmax), d
      if a.vmin >= 0 or b.vmin >= 0: return 0, (a if a.vmin >= 0 else b).vmax, d
      return None
    if a.vmin < 0 or b.vmin < 0: return None
    top = (1 << max(a.vmax, b.vmax).bit_length()) - 1
    d = math.gcd(_low_bit(a.divisor), _low_bit(b.divisor))  # low zero bits of both stay zero
    return (max(a.vmin, b.vmin) if op is BinaryOps.OR else 0), top, d
  return None
