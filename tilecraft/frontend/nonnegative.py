"""Whether a lazy value is known to be >= 0 (or NaN) everywhere, read off the ops that make it.

Contract: `known_nonnegative(lb)` is True only when every element of `lb` is >= 0 or NaN, proved from
its lazy graph by signs (>= 0 or <= 0) carried up from its leaves: unsigned and bool dtypes, constants
and index constants, a relu (`where(x < c, a, x)` with c >= 0 and a >= 0, or a max with a value >= 0),
a minimum (`-max(-x, -y)`: clip(x, 0, 6)), exp2 and sqrt; sums, products, negations, casts and sum/max
reductions of values of known sign, and selections between them (a concatenation is one). A view of
such a value is one too: where a view's mask hides an element it reads 0. Anything else, realized data
included, is not known (False), so a False answer says nothing about the values.

Max-pooling uses it (frontend/nn.py: max_pad_value): over a value known >= 0 the windows may be padded
with 0 instead of the dtype's lowest value wherever every window still reaches one real element. The
maxima are the same (a NaN still wins, and only a -0.0 may come out as 0.0), and a zero pad is a mask on
the pool's own loads, where a pad with -inf is a where() the scheduler realizes as a padded copy
(ResNet-50's stem: a 3.3 MB copy kernel before its max-pool).
"""
from __future__ import annotations
import math
from tilecraft.dtype import DType, dtypes
from tilecraft.engine.lazy import LazyBuffer
from tilecraft.ops import INDEX, BinaryOps, BufferOps, ReduceOps, TernaryOps, UnaryOps

_DEPTH = 12  # ops looked through (a relu over a conv's bias add is 3; a concatenation of k pieces ~2k)

def _const_has_sign(val: object, sign: int) -> bool:
  if val is INDEX: return sign > 0  # 0, 1, ..., n-1
  return isinstance(val, (bool, int, float)) and not (isinstance(val, float) and math.isnan(val)) and val * sign >= 0

def _cast_keeps_sign(src: DType, dst: DType) -> bool:
  """A cast that keeps every value's sign: to a float; between integers only to a wider type, or one as wide
  from a signed one (int64 -> int32 and uint32 -> int32 wrap around). A float NaN cast to an integer is any
  integer."""
  if dtypes.is_float(dst): return True
  if dtypes.is_float(src): return False
  return dst.itemsize > src.itemsize or (dst.itemsize == src.itemsize and not dtypes.is_unsigned(src))

def _is_relu(b: LazyBuffer, depth: int) -> bool:
  """where(x < c, a, x) with c >= 0 and a >= 0: where it keeps x, x >= c (or NaN)."""
  cond, a, x = b.srcs
  cb = cond.base
  if cb.op is not BinaryOps.CMPLT or cond.is_view: return False
  lhs, rhs = cb.srcs
  same = lhs is x or (lhs.base is x.base and lhs.st == x.st)
  return same and rhs.base.op is BufferOps.CONST and _const_has_sign(rhs.base.arg, 1) and _has_sign(a, 1, depth - 1)

def _has_sign(lb: LazyBuffer, sign: int, depth: int) -> bool:
  """Every element of lb is NaN or has `sign` (1: >= 0, -1: <= 0). The <= 0 side is what proves a
  minimum (-max(-x, -y)) or a negation of one >= 0."""
  if lb.dtype == dtypes.bool or dtypes.is_unsigned(lb.dtype): return sign > 0
  b = lb.base
  if depth <= 0 or b.op is None: return False  # realized data: unknown
  if b.op is BufferOps.CONST: return _const_has_sign(b.arg, sign)
  srcs, d = b.srcs, depth - 1
  if b.op is UnaryOps.NEG: return _has_sign(srcs[0], -sign, d)
  if b.op is UnaryOps.CAST: return _cast_keeps_sign(srcs[0].dtype, b.dtype) and _has_sign(srcs[0], sign, d)
  if b.op in (BinaryOps.ADD, ReduceOps.SUM, ReduceOps.MAX): return all(_has_sign(s, sign, d) for s in srcs)
  if b.op is BinaryOps.MUL:
    return any(_has_sign(srcs[0], s0, d) and _has_sign(srcs[1], s0 * sign, d) for s0 in (1, -1))
  if b.op is BinaryOps.MAX:  # max(x, y) >= y >= 0; <= 0 needs both
    return any(_has_sign(s, sign, d) for s in srcs) if sign > 0 else all(_has_sign(s, sign, d) for s in srcs)
  if b.op in (UnaryOps.EXP2, UnaryOps.SQRT): return sign > 0
  if b.op is TernaryOps.WHERE:
    return (sign > 0 and _is_relu(b, depth)) or (_has_sign(srcs[1], sign, d) and _has_sign(srcs[2], sign, d))
  return False

def known_nonnegative(lb: LazyBuffer) -> bool:
  """True only if every element of lb is >= 0 or NaN (see the module's contract)."""
  return _has_sign(lb, 1, _DEPTH)
