"""Facts about linearized UOps that more than one renderer acts on: whether an index is a provable
multiple of a vector width (aligned vector access), and which stores may stream past the caches."""
from __future__ import annotations
import math
from collections import Counter
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import dtypes
from tilecraft.ops import BinaryOps, TernaryOps

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
