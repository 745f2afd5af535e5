"""UOps: the low-level graph a kernel is lowered to, then rewritten, linearized and rendered.

UOps are hash-consed: building the same (op, dtype, src, arg) twice returns the same object, so
common subexpressions are shared by construction and identity comparison is structural equality.
"""
from __future__ import annotations
import math, weakref
from enum import Enum, auto
from typing import Any, Optional
from tilecraft.dtype import DType, dtypes, float_to_int, truncate
from tilecraft.ops import BinaryOps, TernaryOps, UnaryOps

class UOps(Enum):
  # kernel arguments and storage
  DEFINE_GLOBAL = auto(); DEFINE_VAR = auto(); DEFINE_LOCAL = auto(); DEFINE_ACC = auto()  # noqa: E702
  CONST = auto(); SPECIAL = auto()  # noqa: E702
  # control flow
  RANGE = auto(); ENDRANGE = auto(); IF = auto(); ENDIF = auto(); BARRIER = auto()  # noqa: E702
  # memory
  LOAD = auto(); STORE = auto(); PREFETCH = auto()  # noqa: E702  # PREFETCH: a cache hint (buf, idx[, gate]), only for renderers with has_prefetch
  # values
  ALU = auto(); CAST = auto(); BITCAST = auto(); VECTORIZE = auto(); GEP = auto(); WMMA = auto()  # noqa: E702
  PHI = auto(); ACCREAD = auto()  # noqa: E702  # PHI: in-loop accumulator update; ACCREAD: its value after the loop
  SINK = auto()

UOps.__hash__ = object.__hash__  # type: ignore[method-assign]  # identity hash, as for the op enums (ops.py)
END_FOR = {UOps.RANGE: UOps.ENDRANGE, UOps.IF: UOps.ENDIF}
Alu = Any  # UnaryOps | BinaryOps | TernaryOps

class UOp:
  """One node. `src` are UOps; `arg` is op-specific (ALU: the op enum; CONST: the value; ...)."""
  __slots__ = ("op", "dtype", "src", "arg", "_key", "__weakref__")
  _cache: "weakref.WeakValueDictionary[tuple, UOp]" = weakref.WeakValueDictionary()
  op: UOps
  dtype: DType
  src: tuple["UOp", ...]
  arg: Any

  def __new__(cls, op: UOps, dtype: DType = dtypes.void, src: tuple["UOp", ...] = (), arg: Any = None) -> "UOp":
    key = (op, dtype, tuple(id(s) for s in src), _argkey(arg))
    if (u := UOp._cache.get(key)) is not None: return u
    u = object.__new__(cls)
    u.op, u.dtype, u.src, u.arg, u._key = op, dtype, tuple(src), arg, key
    UOp._cache[key] = u
    return u

  def replace(self, **kw: Any) -> "UOp":
    return UOp(kw.get("op", self.op), kw.get("dtype", self.dtype), kw.get("src", self.src), kw.get("arg", self.arg))
  def __repr__(self) -> str:
    return f"UOp({self.op.name}, {self.dtype}, arg={self.arg!r}, src=({', '.join(s.op.name for s in self.src)}))"

  # ---- constructors ------------------------------------------------------------------------------
  @staticmethod
  def const(dtype: DType, val: Any) -> "UOp":
    key = (dtype, _argkey(val), type(val))
    if (u := _const_cache.get(key)) is not None: return u
    if dtype.count > 1: u = UOp(UOps.VECTORIZE, dtype, (UOp.const(dtype.scalar(), val),) * dtype.count)
    else: u = UOp(UOps.CONST, dtype, (), _const_value(dtype, val))
    if len(_const_cache) > 100000: _const_cache.clear()
    _const_cache[key] = u
    return u
  @staticmethod
  def alu(op: Alu, *src: "UOp", dtype: Optional[DType] = None) -> "UOp":
    if dtype is None: dtype = dtypes.bool.vec(src[0].dtype.count) if op in (BinaryOps.CMPLT, BinaryOps.CMPNE) else src[-1].dtype
    return UOp(UOps.ALU, dtype, tuple(src), op)
  def cast(self, dtype: DType) -> "UOp": return self if self.dtype == dtype else UOp(UOps.CAST, dtype, (self,))
  def gep(self, i: int) -> "UOp": return UOp(UOps.GEP, self.dtype.scalar(), (self,), i)
  def __add__(self, x: "UOp") -> "UOp": return UOp.alu(BinaryOps.ADD, self, x)
  def __mul__(self, x: "UOp") -> "UOp": return UOp.alu(BinaryOps.MUL, self, x)
  def lt(self, x: "UOp") -> "UOp": return UOp.alu(BinaryOps.CMPLT, self, x)

  # ---- analysis ----------------------------------------------------------------------------------
  def toposort(self) -> list["UOp"]:
    """All UOps this one depends on (and itself), sources before users."""
    order: list[UOp] = []
    seen: set[int] = set()
    stack: list[tuple[UOp, bool]] = [(self, False)]
    while stack:
      u, done = stack.pop()
      if done: order.append(u); continue
      if id(u) in seen: continue
      seen.add(id(u))
      stack.append((u, True))
      stack.extend((s, False) for s in reversed(u.src) if id(s) not in seen)
    return order

_const_cache: dict[tuple, "UOp"] = {}

def _argkey(arg: Any) -> Any:
  # -0.0 == 0.0 and nan != nan in python: key floats by their repr so constants stay distinct and hashable
  if isinstance(arg, float): return ("f", repr(arg))
  return arg

def _const_value(dtype: DType, val: Any) -> Any:
  if isinstance(val, (int, float, bool)) and not isinstance(val, type(None)):
    if dtypes.is_float(dtype): return truncate(dtype)(val)  # rounded to dtype, as the kernel holds it (1e20 as a float32 is 1.0000000200408773e20)
    if dtype == dtypes.bool: return bool(val)
    if isinstance(val, float): return float_to_int(val, dtype)  # nan/inf/out of range: as the runtime casts, not an error
    return truncate(dtype)(int(val))
  return val

# ---- evaluation of one ALU op on python values (used by constant folding and the emulator) ---------

def _idiv(a: int, b: int) -> int:
  """C division: truncate toward zero."""
  if b == 0: return 0
  q = abs(a) // abs(b)
  return q if (a < 0) == (b < 0) else -q

def _imod(a: int, b: int) -> int:
  if b == 0: return 0
  return a - _idiv(a, b) * b

def _mod(a: Any, b: Any) -> Any:
  """C's remainder: fmod for floats (exact; nan for an infinite dividend or a zero divisor), truncating for ints."""
  if isinstance(a, float) or isinstance(b, float): return _safe(math.fmod, a, b)
  return _imod(a, b)

def _safe(f, *x):
  try: return f(*x)
  except (OverflowError, ValueError): return math.nan

python_alu: dict[Any, Any] = {
  UnaryOps.EXP2: lambda x: _safe(lambda v: math.inf if v > 1024 else 2.0 ** v, x),
  UnaryOps.LOG2: lambda x: (math.log2(x) if x > 0 else -math.inf if x == 0 else math.nan) if not math.isnan(x) else x,
  UnaryOps.SIN: lambda x: math.sin(x) if not math.isinf(x) else math.nan,
  UnaryOps.SQRT: lambda x: math.sqrt(x) if x >= 0 else math.nan,
  UnaryOps.NEG: lambda x: (not x) if isinstance(x, bool) else -x,
  UnaryOps.RECIP: lambda x: 1 / x if x != 0 else math.copysign(math.inf, x),
  BinaryOps.ADD: lambda a, b: a + b, BinaryOps.SUB: lambda a, b: a - b, BinaryOps.MUL: lambda a, b: a * b,
  BinaryOps.IDIV: _idiv, BinaryOps.MOD: _mod,
  BinaryOps.MAX: lambda a, b: a if (a >= b or math.isnan(a) if isinstance(a, float) else a >= b) else b,
  BinaryOps.CMPLT: lambda a, b: a < b, BinaryOps.CMPNE: lambda a, b: a != b,
  BinaryOps.XOR: lambda a, b: a ^ b, BinaryOps.OR: lambda a, b: a | b, BinaryOps.AND: lambda a, b: a & b,
  BinaryOps.SHL: lambda a, b: a << b, BinaryOps.SHR: lambda a, b: a >> b,
  TernaryOps.WHERE: lambda c, a, b: a if c else b, TernaryOps.MULACC: lambda a, b, c: a * b + c,
}

def exec_alu(op: Alu, dtype: DType, operands: list) -> Any:
  """The value of an ALU op on python constants, wrapped/rounded to `dtype` like the hardware."""
  return truncate(dtype)(python_alu[op](*operands))
