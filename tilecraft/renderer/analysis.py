"""Facts about linearized UOps that more than one renderer acts on: whether an index is a provable
multiple of a vector width (aligned vector access), which stores may stream past the caches, and
which integer values computed without data can overflow."""
from __future__ import annotations
import math
from collections import Counter
from tilecraft.codegen.uops import UOp, UOps
from typing import Optional
from tilecraft.dtype import dtypes
from tilecraft.ops import BinaryOps, TernaryOps, UnaryOps

# bytes a kernel must write to an output before its stores stream (a smaller output may be read back
# from cache by the next kernel); the CPU_STREAM_MIN_BYTES setting overrides it (0: whenever allowed)
STREAM_MIN_BYTES = 16 << 20

def streamable_stores(uops: list[UOp], least_bytes: int) -> frozenset:
  """The vector STOREs that may stream past the caches (the C and LLVM CPU renderers): ungated, at
  an index that is a multiple of the vector width, outside reduce loops, into an output the kernel
  never reads, which the kernel writes at least `least_bytes` of (a smaller output may be read back
  from cache by the next kernel)."""
  loaded = {u.src[0] for u in uops if u.op is UOps.LOAD}
  written: Counter = Counter()
  cands: list[UOp] = []
  loops: list[UOp] = []
  for u in uops:
    if u.op is UOps.RANGE: loops.append(u)
    elif u.op is UOps.ENDRANGE: loops.pop()
    elif u.op is UOps.STORE and len(u.src) == 3 and u.src[0].op is UOps.DEFINE_GLOBAL and u.src[0] not in loaded:
      dt = u.src[2].dtype
      if dt.count == 1 or dt.itemsize < 16 or dt.itemsize & (dt.itemsize - 1) or not multiple_of(u.src[1], dt.count): continue
      if any(lp.arg[0] == "reduce" or lp.src[0].op is not UOps.CONST or lp.src[1].op is not UOps.CONST for lp in loops): continue
      written[u.src[0]] += math.prod(lp.src[1].arg - lp.src[0].arg for lp in loops) * dt.itemsize
      cands.append(u)
  return frozenset(u for u in cands if written[u.src[0]] >= least_bytes)

def multiple_of(idx: UOp, n: int) -> bool:
  """Whether the integer index `idx` is provably a multiple of n (every value it can take), from its
  structure: constants, sums of multiples, products with a multiple, shifts by enough bits."""
  if n == 1: return True
  if idx.op is UOps.CONST: return isinstance(idx.arg, int) and idx.arg % n == 0
  if idx.op is UOps.CAST and dtypes.is_int(idx.dtype) and dtypes.is_int(idx.src[0].dtype): return multiple_of(idx.src[0], n)
  if idx.op is not UOps.ALU: return False
  if idx.arg in (BinaryOps.ADD, BinaryOps.SUB): return all(multiple_of(s, n) for s in idx.src)
  if idx.arg is BinaryOps.MUL: return any(multiple_of(s, n) for s in idx.src)
  if idx.arg is BinaryOps.SHL and idx.src[1].op is UOps.CONST: return multiple_of(idx.src[0], n) or (1 << max(0, idx.src[1].arg)) % n == 0
  if idx.arg is TernaryOps.WHERE: return multiple_of(idx.src[1], n) and multiple_of(idx.src[2], n)
  return False

def overflowing_int_alus(uops: list[UOp], ops: frozenset) -> frozenset:
  """The int32/int64 ALUs among `ops` computed without data (from thread ids, loop counters,
  variables and constants) whose value can leave their type's range, by interval arithmetic over
  the linearized UOps. Index math never does (the lowerer picks a width it fits in); a value such
  as arange(n)*2**30 in int32 does, and numpy wraps it. Where an interval is unknown (a load, an
  accumulator, a float cast) it is the whole range of the type, so an overflow is never missed;
  a sum of two unknowns is flagged, which is only ever a stricter rendering."""
  bounds: dict[UOp, tuple[int, int]] = {}
  out: set[UOp] = set()
  def of(u: UOp) -> tuple[int, int]:
    if (b := bounds.get(u)) is not None: return b
    dt = u.dtype.scalar()
    if not (dtypes.is_int(dt) or dtypes.is_bool(dt)): return (0, 0)  # never used: float values are no int's bounds
    b = None
    if u.op is UOps.CONST:
      vals = [int(v) for v in (u.arg if isinstance(u.arg, tuple) else (u.arg,))]
      b = (min(vals), max(vals))
    elif u.op is UOps.SPECIAL: b = (0, (u.arg[1] if isinstance(u.arg[1], int) else of(u.arg[1])[1]) - 1)
    elif u.op is UOps.RANGE: b = (of(u.src[0])[0], max(of(u.src[0])[0], of(u.src[1])[1] - 1))
    elif u.op is UOps.DEFINE_VAR: b = (u.arg.vmin, u.arg.vmax)
    elif u.op in (UOps.VECTORIZE, UOps.GEP): b = (min(of(x)[0] for x in u.src), max(of(x)[1] for x in u.src))
    elif u.op is UOps.CAST and (dtypes.is_int(u.src[0].dtype) or dtypes.is_bool(u.src[0].dtype)): b = of(u.src[0])
    elif u.op is UOps.ALU: b = _alu_bounds(u.arg, [of(x) for x in u.src], u.src)
    if b is not None and (b[0] < dtypes.min(dt) or b[1] > dtypes.max(dt)):
      if u.op is UOps.ALU and u.arg in ops and dt in (dtypes.int32, dtypes.int64): out.add(u)
      b = None  # it wraps (or a cast clamps it): anything in the type's range
    bounds[u] = b = b if b is not None else (int(dtypes.min(dt)), int(dtypes.max(dt)))
    return b
  for u in uops: of(u)
  return frozenset(out)

def _alu_bounds(op, s: list[tuple[int, int]], src: tuple) -> Optional[tuple[int, int]]:
  """The exact interval of an integer ALU's value over its operands' intervals (unbounded ints), or
  None where it isn't tracked (then: the whole range of the type)."""
  def corners(f) -> tuple[int, int]:
    v = [f(a, b) for a in s[0] for b in s[1]]
    return (min(v), max(v))
  if op is BinaryOps.ADD: return (s[0][0] + s[1][0], s[0][1] + s[1][1])
  if op is BinaryOps.SUB: return (s[0][0] - s[1][1], s[0][1] - s[1][0])
  if op is BinaryOps.MUL: return corners(lambda a, b: a * b)
  if op is UnaryOps.NEG: return (-s[0][1], -s[0][0])
  if op is TernaryOps.MULACC:
    lo, hi = corners(lambda a, b: a * b)
    return (lo + s[2][0], hi + s[2][1])
  if op is BinaryOps.MAX: return (max(s[0][0], s[1][0]), max(s[0][1], s[1][1]))
  if op is TernaryOps.WHERE: return (min(s[1][0], s[2][0]), max(s[1][1], s[2][1]))
  if op in (BinaryOps.CMPLT, BinaryOps.CMPNE): return (0, 1)
  if op is BinaryOps.SHL and src[1].op is UOps.CONST and 0 <= s[1][0] < 64: return (s[0][0] << s[1][0], s[0][1] << s[1][0])
  if op is BinaryOps.SHR and s[1][0] == s[1][1] and 0 <= s[1][0] < 64: return (s[0][0] >> s[1][0], s[0][1] >> s[1][0])
  if op is BinaryOps.IDIV and s[1][0] == s[1][1] and s[1][0] > 0:  # C division truncates toward zero; monotonic in the dividend
    def tdiv(a: int) -> int: return abs(a) // s[1][0] * (1 if a >= 0 else -1)
    return (tdiv(s[0][0]), tdiv(s[0][1]))
  if op is BinaryOps.MOD and s[1][0] == s[1][1] and s[1][0] > 0:  # C remainder takes the dividend's sign
    d = s[1][0]
    return (0 if s[0][0] >= 0 else -(d - 1), min(d - 1, max(s[0][1], 0)))
  if op is BinaryOps.AND and (s[0][0] >= 0 or s[1][0] >= 0): return (0, min(x[1] for x in s if x[0] >= 0))
  return None
