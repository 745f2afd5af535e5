"""Facts about linearized UOps that more than one renderer acts on: whether an index is a provable
multiple of a vector width (aligned vector access), which stores may stream past the caches, and
which integer values computed without data can overflow. The integer facts come from the one range
analysis over UOps, `codegen/uop_bounds.py` (`multiple_of` is re-exported from there)."""
from __future__ import annotations
import math
from collections import Counter
from tilecraft.codegen.uop_bounds import bound, multiple_of
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import dtypes

__all__ = ["STREAM_MIN_BYTES", "multiple_of", "overflowing_int_alus", "streamable_stores"]

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

def overflowing_int_alus(uops: list[UOp], ops: frozenset) -> frozenset:
  """The int32/int64 ALUs among `ops` whose exact value can leave their type's range
  (`codegen/uop_bounds.py`: `wraps`). Index math never does (the lowerer picks a width it fits in); a
  value computed without data such as arange(n)*2**30 in int32 does, and numpy wraps it. An unknown
  operand (a load, an accumulator, a float cast) has its type's whole range, so an overflow is never
  missed; a sum of two unknowns is flagged, which is only ever a stricter rendering."""
  return frozenset(u for u in uops if u.op is UOps.ALU and u.arg in ops and u.dtype.scalar() in (dtypes.int32, dtypes.int64) and bound(u).wraps)
