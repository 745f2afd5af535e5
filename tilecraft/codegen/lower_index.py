"""Index expressions as UOps: the one symbolic system's nodes become integer UOps in int32, or in
int64 when the value or any partial result could pass 2^31, and integer // and % get numpy's floor
semantics instead of C's truncation.

`IndexUOps` holds what the conversion needs and nothing else: the UOp each symbolic variable stands
for (loop counters, thread ids, kernel variables; the lowering adds them as it creates them) and a
memo of converted expressions."""
from __future__ import annotations
from typing import Any, Optional
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import DType, dtypes
from tilecraft.ops import BinaryOps, TernaryOps
from tilecraft.shape.symbolic import And, Div, Lt, Mod, Node, Prod, Sum, Variable, sint

INT32_MAX = 2**31 - 1

def _ceil(s: sint) -> int: return s if isinstance(s, int) else s.vmax
def _maxabs(x: sint) -> int: return abs(x) if isinstance(x, int) else max(abs(x.vmin), abs(x.vmax))

def _subst(x: sint, v: Optional[Variable], i: int) -> sint:
  return x.substitute({v: i}) if isinstance(x, Node) and v is not None else x

class IndexUOps:
  """Symbolic index expressions -> UOps, for one kernel. `varmap`: variable -> the UOp it stands for
  (a variable not in it is a kernel argument: DEFINE_VAR, added on first use)."""
  def __init__(self) -> None:
    self.varmap: dict[Variable, UOp] = {}
    self.memo: dict[Any, Any] = {}

  def sym_to_uop(self, x: sint, dtype: DType) -> UOp:
    """An index expression as UOps: in `dtype` (int32) unless it or a partial result can exceed int32,
    then all in int64. Plain ints are checked too (a constant index or loop bound past 2^31)."""
    if dtype != dtypes.int64 and self.needs_int64(x): dtype = dtypes.int64
    if isinstance(x, int): return UOp.const(dtype, x)
    return self.sym(x, dtype)

  def sym(self, x: sint, dtype: DType) -> UOp:
    """x as UOps in exactly `dtype` (the caller has checked that it fits)."""
    if isinstance(x, int): return UOp.const(dtype, x)
    key = (x, dtype)
    if (r := self.memo.get(key)) is not None: return r
    if isinstance(x, Variable):
      if x in self.varmap: u = self.varmap[x]
      else:
        u = self.varmap.setdefault(x, UOp(UOps.DEFINE_VAR, dtypes.int64, (), x))
      u = u.cast(dtype)
    elif isinstance(x, Sum):
      terms = [self.sym(t, dtype) if c == 1 else UOp.alu(BinaryOps.MUL, self.sym(t, dtype), UOp.const(dtype, c)) for t, c in x.terms]
      u = terms[0]
      for t in terms[1:]: u = UOp.alu(BinaryOps.ADD, u, t)
      if x.const: u = UOp.alu(BinaryOps.ADD, u, UOp.const(dtype, x.const))
    elif isinstance(x, Prod): u = UOp.alu(BinaryOps.MUL, self.sym(x.a, dtype), self.sym(x.b, dtype))
    elif isinstance(x, (Div, Mod)):
      a, b = x.a, x.b
      amin = a if isinstance(a, int) else a.vmin
      # C division truncates: shift a negative numerator up by a multiple of b to get floor semantics
      shift = 0
      if amin < 0:
        if not isinstance(b, int): raise NotImplementedError(f"floor division of possibly negative {x} by a symbolic divisor")
        shift = -(amin // b)
      au = self.sym(a + shift * b if shift else a, dtype)
      op = BinaryOps.IDIV if isinstance(x, Div) else BinaryOps.MOD
      u = UOp.alu(op, au, self.sym(b, dtype))
      if shift and isinstance(x, Div): u = UOp.alu(BinaryOps.ADD, u, UOp.const(dtype, -shift))
    elif isinstance(x, Lt): u = UOp.alu(BinaryOps.CMPLT, self.sym(x.a, dtype), UOp.const(dtype, x.b))
    elif isinstance(x, And):
      parts = [self.sym_bool(n) for n in x.nodes]
      u = parts[0]
      for p in parts[1:]: u = UOp.alu(BinaryOps.AND, u, p)
      return u
    else: raise TypeError(f"cannot lower {x!r}")
    self.memo[key] = u
    return u

  def sym_bool(self, x: sint) -> UOp:
    """A 0/1 expression as a bool UOp."""
    if isinstance(x, int): return UOp.const(dtypes.bool, bool(x))
    if isinstance(x, (Lt, And)): return self.sym_to_uop(x, dtypes.int32) if isinstance(x, And) else self.lt(x)
    # 1 - (a < b)  ==  not (a < b)
    if isinstance(x, Sum) and x.const == 1 and len(x.terms) == 1 and x.terms[0][1] == -1 and isinstance(x.terms[0][0], Lt):
      return UOp.alu(BinaryOps.CMPNE, self.lt(x.terms[0][0]), UOp.const(dtypes.bool, True))
    u = self.sym_to_uop(x, dtypes.int32)
    return UOp.alu(BinaryOps.CMPNE, u, UOp.const(u.dtype, 0))
  def needs_int64(self, x: sint, headroom: int = 1) -> bool:
    """Whether x (or any step of computing it) leaves int32; with headroom n, also whether n times
    its magnitude does (a difference or sum of such values is computed in the same type)."""
    if headroom != 1 and headroom * _maxabs(x) > INT32_MAX: return True
    if isinstance(x, int): return not -INT32_MAX <= x <= INT32_MAX
    if (r := self.memo.get(("i64", x))) is None: r = self.memo[("i64", x)] = _needs_int64(x)
    return r
  def lt(self, x: Lt) -> UOp:
    dt = dtypes.int64 if self.needs_int64(x) else dtypes.int32
    return UOp.alu(BinaryOps.CMPLT, self.sym(x.a, dt), UOp.const(dt, x.b))

def _floor_divmod(op: Any, a: UOp, b: UOp) -> UOp:
    """numpy semantics for integer // and %: floor rounding, and 0 when dividing by 0 (C would trap)."""
    dt = a.dtype
    c = lambda v: UOp.const(dt, v)  # noqa: E731
    nonzero = UOp.alu(BinaryOps.CMPNE, b, c(0))
    if dtypes.is_unsigned(dt):
      safe_b = UOp.alu(TernaryOps.WHERE, nonzero, b, c(1))
      q, r = UOp.alu(BinaryOps.IDIV, a, safe_b), UOp.alu(BinaryOps.MOD, a, safe_b)
    else:
      # b == -1 is a negation: the hardware traps on MIN // -1, numpy wraps
      not_neg1 = UOp.alu(BinaryOps.CMPNE, b, c(-1))
      safe_b = UOp.alu(TernaryOps.WHERE, UOp.alu(BinaryOps.AND, nonzero, not_neg1), b, c(1))
      q = UOp.alu(TernaryOps.WHERE, not_neg1, UOp.alu(BinaryOps.IDIV, a, safe_b), UOp.alu(BinaryOps.SUB, c(0), a))
      r = UOp.alu(BinaryOps.MOD, a, safe_b)
    if dtypes.is_unsigned(dt): res = q if op is BinaryOps.IDIV else r
    else:
      # truncation differs from floor when the remainder is nonzero and its sign differs from b's
      adjust = UOp.alu(BinaryOps.AND, UOp.alu(BinaryOps.CMPNE, r, c(0)),
                       UOp.alu(BinaryOps.CMPNE, UOp.alu(BinaryOps.CMPLT, r, c(0)), UOp.alu(BinaryOps.CMPLT, safe_b, c(0))))
      if op is BinaryOps.IDIV: res = UOp.alu(BinaryOps.SUB, q, adjust.cast(dt))
      else: res = UOp.alu(BinaryOps.ADD, r, UOp.alu(TernaryOps.WHERE, adjust, safe_b, c(0)))
    return UOp.alu(TernaryOps.WHERE, nonzero, res, c(0))

def _needs_int64(x: sint) -> bool:
  """Whether computing x in int32 could overflow: x, any subexpression, any partial sum of a Sum (summed
  by magnitude, so any order of the terms is safe), a Lt bound, or the shifted numerator that lowering
  builds for a floor division of a possibly negative value."""
  if isinstance(x, int): return not -INT32_MAX <= x <= INT32_MAX
  stack = [x]
  while stack:
    n = stack.pop()
    if n.vmax > INT32_MAX or n.vmin < -INT32_MAX: return True
    if isinstance(n, Sum) and abs(n.const) + sum(abs(c) * _maxabs(t) for t, c in n.terms) > INT32_MAX: return True
    if isinstance(n, Lt) and not -INT32_MAX <= n.b <= INT32_MAX: return True
    if isinstance(n, (Div, Mod)) and isinstance(n.b, int) and isinstance(n.a, Node) and n.a.vmin < 0 and n.a.vmax - (n.a.vmin // n.b) * n.b > INT32_MAX: return True
    stack.extend(n.children())
  return False
