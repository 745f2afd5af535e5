"""Elementwise ONNX ops: arithmetic, math functions, activations, comparisons, logic and bitwise ops,
casts and the variadic Sum/Mean/Max/Min. Contract: results have the dtype the ONNX spec gives
(the input's, bool for comparisons, `to` for Cast); math functions and activations are the Tensor
frontend's (frontend/math.py, frontend/activations.py), called with the node's attributes. Inputs of
dtypes an op's spec doesn't allow are refused with NotImplementedError."""
from __future__ import annotations
import math
from typing import Any
from tilecraft.dtype import dtypes
from tilecraft.onnx.types import onnx_dtype
from tilecraft.onnx.ops.common import const, is_float
from tilecraft.onnx.registry import Node, OpFn, op, unsupported
from tilecraft.tensor import Tensor

def _float_only(n: Node, x: Tensor) -> None:
  if not is_float(x): raise unsupported(n, f"input of dtype {x.dtype.name}")

# ---- arithmetic ----------------------------------------------------------------------------------
@op("Add")
def _add(n: Node, i: list) -> Tensor: return _same(n, i[0], i[1], i[0] + i[1])
@op("Sub")
def _sub(n: Node, i: list) -> Tensor: return _same(n, i[0], i[1], i[0] - i[1])
@op("Mul")
def _mul(n: Node, i: list) -> Tensor: return _same(n, i[0], i[1], i[0] * i[1])

def _same(n: Node, a: Tensor, b: Tensor, out: Tensor) -> Tensor:
  if a.dtype != b.dtype: raise unsupported(n, f"operands of dtypes {a.dtype.name} and {b.dtype.name}")
  if n.opset < 7 and "broadcast" in n.attrs: raise unsupported(n, "legacy broadcast attribute")
  return out.cast(a.dtype)

@op("Div")
def _div(n: Node, i: list) -> Tensor:
  a, b = i
  if is_float(a): return _same(n, a, b, a / b)
  if a.dtype == dtypes.bool: raise unsupported(n, "bool division")
  q = a // b  # floor; ONNX (C) integer division truncates toward zero
  r = a - q * b
  fix = (r != 0) & ((a < 0) != (b < 0))
  return _same(n, a, b, fix.where(q + 1, q))

@op("Mod")
def _mod(n: Node, i: list) -> Tensor:
  a, b = i
  if n.attr("fmod", 0) == 0: return _same(n, a, b, a % b)  # numpy's: the divisor's sign (floats: opset 28 semantics)
  if is_float(a):
    from tilecraft.ops import BinaryOps
    x, y = a._broadcasted(b)
    return _same(n, a, b, x._e(BinaryOps.MOD, y))  # C fmod
  m = a % b  # numpy (divisor's sign) -> C fmod (dividend's sign)
  return _same(n, a, b, ((m != 0) & ((m < 0) != (a < 0))).where(m - b, m))

@op("Pow")
def _pow(n: Node, i: list) -> Tensor:
  x, y = i
  if not is_float(x) and not is_float(y):
    if dtypes.is_unsigned(y.dtype) or True:
      return _int_pow(n, x, y)
  if not is_float(x):  # int ** float: integral exponents >= 0 exactly (as C pow is), others truncated from float64
    f = x.cast(dtypes.float64).pow(y.cast(dtypes.float64))
    integral = (y == y.floor()) & (y >= 0) & (y < 64)
    yi = integral.where(y, const(y, 0)).cast(dtypes.int64)
    return integral.where(_int_pow(n, x, yi), f.cast(x.dtype)).cast(x.dtype)
  wide = dtypes.float64 if dtypes.float64 in (x.dtype, y.dtype) or (not is_float(x) and x.dtype.itemsize == 8) else dtypes.float32 \
    if x.dtype in (dtypes.float16, dtypes.bfloat16) or not is_float(x) else x.dtype
  return x.cast(wide).pow(y.cast(wide)).cast(x.dtype)

def _int_pow(n: Node, x: Tensor, y: Tensor) -> Tensor:
  """Integer ** integer by squaring over the exponent's bits (negative exponents refused as unsupported data)."""
  if y.dtype != x.dtype: y = y.cast(dtypes.int64)
  xb, yb = x._broadcasted(y.cast(x.dtype) if y.dtype.itemsize <= x.dtype.itemsize else y)
  res, base, e = xb._const_like(1), xb, yb.cast(dtypes.int64)
  for _ in range(63 if x.dtype.itemsize == 8 else 32):
    res = ((e & 1) == 1).where(res * base, res)
    base, e = base * base, e >> 1
  return res.cast(x.dtype)

@op("Neg")
def _neg(n: Node, i: list) -> Tensor: return -i[0]
@op("Abs")
def _abs(n: Node, i: list) -> Tensor: return i[0].abs()
@op("Sign")
def _sign(n: Node, i: list) -> Tensor: return i[0].sign()
# float-only unary ops that are one Tensor method each: ONNX name -> method
_FLOAT_UNARY = {"Reciprocal": "reciprocal", "Sqrt": "sqrt", "Exp": "exp", "Log": "log", "Sin": "sin", "Cos": "cos", "Tan": "tan", "Tanh": "tanh", "Floor": "floor", "Ceil": "ceil", "Round": "round", "Sigmoid": "sigmoid",
                "Atan": "arctan", "Asin": "arcsin", "Acos": "arccos", "Sinh": "sinh", "Cosh": "cosh", "Asinh": "arcsinh", "Acosh": "arccosh", "Atanh": "arctanh", "Erf": "erf"}

def _float_unary(method: str) -> OpFn:
  def run(n: Node, i: list) -> Tensor:
    _float_only(n, i[0])
    return getattr(i[0], method)()
  return run

for _name, _method in _FLOAT_UNARY.items(): op(_name)(_float_unary(_method))

# ---- activations ---------------------------------------------------------------------------------
@op("Relu")
def _relu(n: Node, i: list) -> Tensor: return i[0].relu()
@op("LeakyRelu")
def _leaky(n: Node, i: list) -> Tensor: return i[0].leaky_relu(n.attr("alpha", 0.01))
@op("PRelu")
def _prelu(n: Node, i: list) -> Tensor:
  x, s = i
  return (x < 0).where(x * s, x).cast(x.dtype)
@op("Elu")
def _elu(n: Node, i: list) -> Tensor: return i[0].elu(n.attr("alpha", 1.0))
@op("Celu")
def _celu(n: Node, i: list) -> Tensor: return i[0].celu(n.attr("alpha", 1.0))
@op("Selu")
def _selu(n: Node, i: list) -> Tensor: return i[0].selu(n.attr("alpha", 1.67326319217681884765625), n.attr("gamma", 1.05070102214813232421875))
@op("ThresholdedRelu")
def _trelu(n: Node, i: list) -> Tensor:
  x = i[0]; return (x > n.attr("alpha", 1.0)).where(x, 0.0)
@op("HardSigmoid")
def _hsig(n: Node, i: list) -> Tensor: return i[0].hardsigmoid(n.attr("alpha", 0.2), n.attr("beta", 0.5))
@op("HardSwish")
def _hswish(n: Node, i: list) -> Tensor: return i[0].hardswish()
@op("Softplus")
def _softplus(n: Node, i: list) -> Tensor: return i[0].softplus()
@op("Softsign")
def _softsign(n: Node, i: list) -> Tensor: return i[0].softsign()
@op("Mish")
def _mish(n: Node, i: list) -> Tensor: return i[0].mish()
@op("Gelu", since=20)
def _gelu(n: Node, i: list) -> Tensor:
  _float_only(n, i[0])
  return i[0].gelu("tanh" if n.attr("approximate", "none") == "tanh" else "none")
@op("Swish", since=24)
def _swish(n: Node, i: list) -> Tensor:
  _float_only(n, i[0])
  return i[0].swish(n.attr("alpha", 1.0))
@op("Shrink")
def _shrink(n: Node, i: list) -> Tensor:
  x = i[0]; lam, bias = n.attr("lambd", 0.5), n.attr("bias", 0.0)
  z = x._const_like(0)
  return (x < -lam).where(x + bias, (x > lam).where(x - bias, z)).cast(x.dtype)
@op("Clip")
def _clip(n: Node, i: list) -> Tensor:
  x = i[0]
  if n.opset < 11: lo, hi = n.attr("min"), n.attr("max")
  else:
    lo = i[1] if len(i) > 1 else None
    hi = i[2] if len(i) > 2 else None
  if lo is not None: x = x.maximum(lo.cast(x.dtype) if isinstance(lo, Tensor) else const(x, lo))
  if hi is not None: x = x.minimum(hi.cast(x.dtype) if isinstance(hi, Tensor) else const(x, hi))
  return x

# ---- comparisons and logic -------------------------------------------------------------------------
def _cmp(n: Node, a: Tensor, b: Tensor, out: Tensor) -> Tensor:
  if a.dtype != b.dtype: raise unsupported(n, f"operands of dtypes {a.dtype.name} and {b.dtype.name}")
  return out
@op("Equal")
def _eq(n: Node, i: list) -> Tensor: return _cmp(n, i[0], i[1], i[0] == i[1])
@op("Less")
def _lt(n: Node, i: list) -> Tensor: return _cmp(n, i[0], i[1], i[0] < i[1])
@op("Greater")
def _gt(n: Node, i: list) -> Tensor: return _cmp(n, i[0], i[1], i[0] > i[1])
@op("LessOrEqual")
def _le(n: Node, i: list) -> Tensor: return _cmp(n, i[0], i[1], i[0] <= i[1])
@op("GreaterOrEqual")
def _ge(n: Node, i: list) -> Tensor: return _cmp(n, i[0], i[1], i[0] >= i[1])
@op("Not")
def _not(n: Node, i: list) -> Tensor: return i[0].logical_not()
@op("And", "BitwiseAnd")
def _and(n: Node, i: list) -> Tensor: return i[0] & i[1]
@op("Or", "BitwiseOr")
def _or(n: Node, i: list) -> Tensor: return i[0] | i[1]
@op("Xor", "BitwiseXor")
def _xor(n: Node, i: list) -> Tensor: return i[0] ^ i[1]
@op("BitwiseNot")
def _bnot(n: Node, i: list) -> Tensor: return ~i[0]
@op("BitShift")
def _bitshift(n: Node, i: list) -> Tensor:
  """Right shifts of signed values are arithmetic; a shift amount < 0 or >= the bit width gives what the
  sign extension alone gives (-1 for a right shift of a negative value, else 0). Left shifts run on the
  unsigned type of the same width (bits past the top are dropped, no signed overflow)."""
  x, y = i
  if not dtypes.is_int(x.dtype): raise unsupported(n, f"input of dtype {x.dtype.name}")
  bits = x.dtype.itemsize * 8
  xb, yb = x._broadcasted(y)
  yl = yb.cast(dtypes.int64)
  bad = (yl < 0) | (yl >= bits)
  ys = bad.where(yl._const_like(0), yl).cast(x.dtype)
  if n.attr("direction") == "LEFT":
    ut = {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}[x.dtype.itemsize]
    r = (xb.cast(ut) << ys.cast(ut)).cast(x.dtype)
    return bad.where(xb._const_like(0), r)
  r = xb >> ys
  fill = (xb < 0).where(xb._const_like(-1), xb._const_like(0)) if not dtypes.is_unsigned(x.dtype) else xb._const_like(0)
  return bad.where(fill, r)
@op("IsNaN")
def _isnan(n: Node, i: list) -> Tensor: return i[0].isnan()
@op("IsInf")
def _isinf(n: Node, i: list) -> Tensor:
  x = i[0]
  pos, neg = n.attr("detect_positive", 1), n.attr("detect_negative", 1)
  r = x._const_like(False, dtypes.bool)
  if pos: r = r | (x == math.inf)
  if neg: r = r | (x == -math.inf)
  return r
@op("Where")
def _where(n: Node, i: list) -> Tensor:
  c, x, y = i
  if x.dtype != y.dtype: raise unsupported(n, f"branches of dtypes {x.dtype.name} and {y.dtype.name}")
  return c.where(x, y).cast(x.dtype)

# ---- casts and identity ------------------------------------------------------------------------------
@op("Cast")
def _cast(n: Node, i: list) -> Tensor:
  to = onnx_dtype(n.attr("to"), n.describe())
  x = i[0]
  if is_float(x) and not dtypes.is_float(to) and to != dtypes.bool:
    # float -> int: truncation; values out of the target's range are undefined in ONNX, refuse nothing
    return x.cast(to)
  return x.cast(to)
@op("CastLike")
def _castlike(n: Node, i: list) -> Tensor: return i[0].cast(i[1].dtype)
@op("Identity")
def _identity(n: Node, i: list) -> Any: return i[0]
@op("Dropout")
def _dropout(n: Node, i: list) -> list:
  x = i[0]
  training = n.static(2) if n.opset >= 12 else None
  if (training is not None and bool(training)) or (n.opset < 7 and not n.attr("is_test", 0)):
    raise unsupported(n, "training mode (random)")
  return [x, Tensor.full(x.shape, True, dtypes.bool, x.device)]

# ---- variadic ----------------------------------------------------------------------------------------
def _fold(n: Node, ts: list, fn: Any) -> Tensor:
  ts = [t for t in ts if t is not None]
  dt = ts[0].dtype
  if any(t.dtype != dt for t in ts): raise unsupported(n, "operands of differing dtypes")
  out = ts[0]
  for t in ts[1:]: out = fn(out, t)
  if len(ts) == 1: out = out + out._const_like(0) if dt != dtypes.bool else out
  return out.cast(dt)
@op("Sum")
def _sum(n: Node, i: list) -> Tensor: return _fold(n, i, lambda a, b: a + b)
@op("Max")
def _max(n: Node, i: list) -> Tensor: return _fold(n, i, lambda a, b: a.maximum(b))
@op("Min")
def _min(n: Node, i: list) -> Tensor: return _fold(n, i, lambda a, b: a.minimum(b))
@op("Mean")
def _mean(n: Node, i: list) -> Tensor:
  ts = [t for t in i if t is not None]
  return (_fold(n, ts, lambda a, b: a + b) / len(ts)).cast(ts[0].dtype)
