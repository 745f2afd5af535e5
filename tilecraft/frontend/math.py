"""Elementwise math composed from the core ops (a mixin of Tensor): powers, exp/log through exp2/log2,
trig through sin, inverse trig and hyperbolic functions (numpy's names), sigmoid, tanh and erf (the
activations built on them are in activations.py), rounding, nan/inf tests, clip, floor division and modulo. numpy's special cases (nan, inf,
signed zeros, integer powers) are spelled out here rather than left to the target's libm."""
from __future__ import annotations
import math
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Optional
import numpy as np
from tilecraft.dtype import dtypes, truncate
from tilecraft.ops import BinaryOps
if TYPE_CHECKING: from tilecraft.tensor import Tensor

def _tanh_series(n: int) -> list[float]:
  """The first n coefficients of tanh's odd Taylor series (x, x^3, x^5, ...), from tanh' = 1 - tanh^2."""
  a = [Fraction(0)] * (2 * n + 1)
  for k in range(2 * n):
    a[k + 1] = (Fraction(int(k == 0)) - sum((a[i] * a[k - i] for i in range(k + 1)), Fraction(0))) / (k + 1)
  return [float(a[2 * k + 1]) for k in range(n)]

_TANH_SERIES = _tanh_series(12)
# terms below |x| = 0.3 for a truncation error under a quarter ulp
_TANH_TERMS = {dtypes.float16: 3, dtypes.bfloat16: 3, dtypes.float32: 6, dtypes.float64: 12}
_PIO2_HI, _PIO2_LO = 1.5707963267948966, 6.123233995736766e-17  # pi/2 as a double and its remainder

# erf for float32 (and narrower floats, computed in float32): below |x| = 1 x * P(x^2), from 1 to 4
# 1 - exp(-x^2) * Q(1/|x|), beyond 4 exactly 1 (erfc(4) = 1.5e-8 is under float32's half ulp of 1).
# P and Q were fitted for this project by weighted least squares on Chebyshev nodes against math.erf
# and math.erfc (relative error 1.4e-9 and 1.3e-8 in exact arithmetic): a few ulp in float32, one exp,
# no division, so it vectorizes at full width (a GELU epilogue of a matmul stays in its kernel).
_ERF_P = (1.1283791665, -0.37612628843, 0.11283612415, -0.026854807775, 0.0051900517667, -0.00080243353365, 7.8981392107e-05)
_ERF_Q = (0.00024699025556, 0.55941541935, 0.039473751451, -0.46206309004, 0.47497253835, -0.21060545811, -0.0032446363334,
          0.041466442535, -0.012078412044)
_ERF_SERIES = [(-1) ** k / (math.factorial(k) * (2 * k + 1)) for k in range(30)]

def _horner(x: "Tensor", coeffs: tuple[float, ...]) -> "Tensor":
  p = x._const_like(coeffs[-1])
  for c in reversed(coeffs[:-1]): p = p * x + c
  return p

def _erf64(x: "Tensor") -> "Tensor":
  """erf to float64 accuracy: the Maclaurin series below |x| = 2 (30 terms), at and above 2, 1 - erfc with
  erfc from its continued fraction (24 levels); truncation error 5e-13."""
  a = x.abs()
  s_in = (a < 2).where(x, 0.0)  # (odd in x: -0.0 stays -0.0)
  series = s_in * _horner(s_in * s_in, tuple(_ERF_SERIES)) * (2 / math.sqrt(math.pi))
  b = (a < 2).where(2.0, a)
  cf = b * 0
  for k in range(24, 0, -1): cf = (b + cf).reciprocal() * (k / 2)
  big = 1 - (-b * b).exp() * (b + cf).reciprocal() * (1 / math.sqrt(math.pi))
  return (a < 2).where(series, (x < 0).where(-big, big))

def _has_float64(device: str) -> bool:
  from tilecraft.device import dtype_unsupported
  return dtype_unsupported(device, dtypes.float64) is None

def computed_wide(x: "Tensor", fn: Any) -> "Tensor":
  """fn(x) for a function of several steps: float16/bfloat16 computed in float32 and rounded once at the
  end, other floats in their own dtype, ints and bools in the default float (as `_float` gives)."""
  x = x._float()
  if x.dtype in (dtypes.float16, dtypes.bfloat16): return fn(x.cast(dtypes.float32)).cast(x.dtype)
  return fn(x)

def _atan(x: "Tensor") -> "Tensor":
  """atan: |x| > 1 through pi/2 - atan(1/|x|); then two half-angle steps atan(t) = 2 atan(t / (1 + sqrt(1 + t^2)))
  bring |t| below tan(pi/16) ~ 0.2, where 11 terms of the odd series are below float64's ulp."""
  a = x.abs()
  big = a > 1
  t = big.where(a.reciprocal(), a)
  for _ in range(2): t = t / (1 + (1 + t * t).sqrt())
  t2, s, p = t * t, t * 0, t
  for k in range(11):
    s = s + p * ((-1) ** k / (2 * k + 1))
    p = p * t2
  r = s * 4
  r = big.where(math.pi / 2 - r, r)
  return (x < 0).where(-r, (x == 0).where(x, r))  # (-0.0 stays -0.0)

class MathOps:
  __slots__ = ()
  def pow(self, y: Any, reverse: bool = False) -> "Tensor":
    """numpy power: integer tensors to integer powers stay integers; floats follow C pow's special cases."""
    if not reverse and isinstance(y, (int, float)) and not isinstance(y, (bool, np.generic)):
      if isinstance(y, int) and not dtypes.is_float(self.dtype):
        if y < 0: raise ValueError(f"integers to negative integer powers are not allowed ({self.dtype.name} ** {y})")
        return (self if self.dtype != dtypes.bool else self.cast(dtypes.default_int))._ipow_const(y)
      if dtypes.is_float(self.dtype) and float(y).is_integer() and abs(y) <= 32:
        r = self._ipow_const(abs(int(y)))
        return r if y >= 0 else r.reciprocal()
      if dtypes.is_float(self.dtype) and y == 0.5: return self.sqrt()  # as numpy's fast path: (-0.0) ** 0.5 is -0.0, (-inf) ** 0.5 nan
    x, y = self._broadcasted(y, reverse)
    if not dtypes.is_float(x.dtype):
      if x.dtype == dtypes.bool: x, y = x.cast(dtypes.int8), y.cast(dtypes.int8)
      return x._ipow_tensor(y)
    # C's pow: |x| ** y (through log2 and exp2, which also give the zero and infinite bases and exponents
    # their magnitudes), negative for a negative base (-0.0 included) and an odd integer exponent, nan for
    # a finite negative base and a non-integer exponent; 1 for y == 0, x == 1 and (-1) ** +-inf
    mag = (y * x.abs().log2()).exp2()
    is_int = y.floor() == y  # (infinities count as even integers; nan fails)
    odd = is_int & (y.abs() < 2.0 ** 53) & (y.cast(dtypes.int64) & 1).cast(dtypes.bool)  # floats >= 2**53 are even integers
    res = ((x < 0) & (x > -math.inf) & ~is_int).where(math.nan, (x._signbit() & odd).where(-mag, mag))
    return ((y == 0) | (x == 1) | ((x == -1) & (y.abs() == math.inf))).where(1.0, res)
  def _ipow_const(self, n: int) -> "Tensor":
    """x ** n for an int n >= 0 by repeated squaring (exact for integers)."""
    if n == 0: return self._const_like(1)
    out: Optional[Tensor] = None
    base = self
    while n:
      if n & 1: out = base if out is None else out * base
      n >>= 1
      if n: base = base * base
    return out  # type: ignore[return-value]
  def _ipow_tensor(self, e: "Tensor") -> "Tensor":
    """Integer x ** e elementwise (wrapping like numpy). A negative e, which numpy refuses, gives 1 / x
    truncated: 1 for x == 1, +-1 for x == -1, else 0."""
    bits = 8 * e.dtype.itemsize - (0 if dtypes.is_unsigned(e.dtype) else 1)
    out, base = self._const_like(1), self
    for k in range(bits):
      out = ((e >> k) & 1).cast(dtypes.bool).where(out * base, out)
      if k + 1 < bits: base = base * base
    if dtypes.is_unsigned(e.dtype): return out
    odd = (e & 1).cast(dtypes.bool)
    one, zero = self._const_like(1), self._const_like(0)
    neg_e = (self == 1).where(one, (self == -1).where(odd.where(-one, one), zero))
    return (e < 0).where(neg_e, out)
  def exp(self) -> "Tensor":
    x = self._float()
    if x.dtype in (dtypes.float16, dtypes.bfloat16): return x.cast(dtypes.float32).exp().cast(x.dtype)  # 1/ln 2 as a float32: one rounding
    return (x * (1 / math.log(2))).exp2()
  def log(self) -> "Tensor":
    x = self._float()
    if x.dtype in (dtypes.float16, dtypes.bfloat16): return x.cast(dtypes.float32).log().cast(x.dtype)  # ln 2 as a float32: one rounding
    return x.log2() * math.log(2)
  def expm1(self) -> "Tensor":
    """exp(x) - 1 without its cancellation near 0: below |x| = 0.3 the Taylor series to x^13 (its
    remainder under float64's ulp there), exp(x) - 1 above (where it loses under 2 bits)."""
    def f(x: "Tensor") -> "Tensor":
      series, term = x, x
      for k in range(2, 14):
        term = term * x * (1 / k)
        series = series + term
      return (x.abs() < 0.3).where((x == 0).where(x, series), x.exp() - 1)  # (-0.0 stays -0.0)
    return computed_wide(self, f)
  def log1p(self) -> "Tensor":
    """log(1 + x) without losing x's digits near 0: log(u) * x / (u - 1) with u = 1 + x rounded (the
    rounding of u cancels out of the ratio; Goldberg 1991), and x where u rounds to 1."""
    def f(x: "Tensor") -> "Tensor":
      u = 1 + x
      d = u - 1
      return ((d == 0) | (x == math.inf)).where(x, u.log() * (x / (d == 0).where(1.0, d)))
    return computed_wide(self, f)
  def cos(self) -> "Tensor":
    """cos(x) = 1 - 2 sin(x/2)^2: x/2 is exact and sin reduces its argument exactly. The old sin(pi/2 - x)
    rounded pi/2 - x to x's precision, an error up to half an ulp of x (cos(1e6) in float32 was off by
    3e-3). Float32 and narrower compute it in float64 where the device has it (then the cancellation
    near cos(x) = 0 costs nothing at their precision); otherwise, and for float64, |x| < pi takes
    sin((pi/2 - |x|) + the rest of pi/2), whose subtraction is exact there (near the zero at pi/2)."""
    x = self._float()
    if x.dtype != dtypes.float64 and _has_float64(x.device):
      h = (x.cast(dtypes.float64) * 0.5).sin()
      return (1.0 - 2.0 * h * h).cast(x.dtype)
    hi = truncate(x.dtype)(_PIO2_HI)  # pi/2 in x's dtype, and the rest of it
    lo = _PIO2_LO if x.dtype == dtypes.float64 else _PIO2_HI - hi
    h, ax = (x * 0.5).sin(), x.abs()
    return (ax < 2 * hi).where(((hi - ax) + lo).sin(), 1.0 - 2.0 * h * h)  # (hi - |x| is exact for |x| in [pi/4, pi])
  def tan(self) -> "Tensor": return self.sin() / self.cos()
  # inverse trig and hyperbolic functions: float32 and narrower computed in float32 (rounded once), float64 in
  # float64; each formula avoids the cancellation of the textbook one where its argument makes it cancel
  def arctan(self) -> "Tensor": return computed_wide(self, _atan)
  def arcsin(self) -> "Tensor":
    # 2 atan(x / (1 + sqrt(1 - x^2))): no cancellation near |x| = 1, nan outside [-1, 1]
    return computed_wide(self, lambda x: _atan(x / (1 + (1 - x * x).sqrt())) * 2)
  def arccos(self) -> "Tensor": return computed_wide(self, lambda x: _atan(((1 - x) / (1 + x)).sqrt()) * 2)
  def sinh(self) -> "Tensor":
    def f(x: "Tensor") -> "Tensor":
      e = x.exp()
      series, term, x2 = x, x, x * x
      for k in range(3, 12, 2):  # |x| < 0.1, where e - 1/e cancels: the odd series to x^11
        term = term * x2 * (1 / ((k - 1) * k))
        series = series + term
      return (x.abs() < 0.1).where(series, (e - e.reciprocal()) * 0.5)
    return computed_wide(self, f)
  def cosh(self) -> "Tensor":
    def f(x: "Tensor") -> "Tensor":
      e = x.exp()
      return (e + e.reciprocal()) * 0.5
    return computed_wide(self, f)
  def arcsinh(self) -> "Tensor":
    """log1p(a + a^2 / (1 + sqrt(1 + a^2))) for a = |x| (log(a + sqrt(a^2 + 1)) cancels near 0), log(2a)
    above 1e8 (where a^2 would overflow float32 and the rest is below the ulp), signed."""
    def f(x: "Tensor") -> "Tensor":
      a = x.abs()
      small = a.minimum(1e8)
      r = (a > 1e8).where(a.log() + math.log(2), (small + small * small / (1 + (1 + small * small).sqrt())).log1p())
      return (x < 0).where(-r, (x == 0).where(x, r))  # (-0.0 stays -0.0)
    return computed_wide(self, f)
  def arccosh(self) -> "Tensor": return computed_wide(self, lambda x: (x + (x * x - 1).sqrt()).log())
  def arctanh(self) -> "Tensor":
    """log((1 + x) / (1 - x)) / 2, as log1p(2x / (1 - x)) / 2 below |x| = 0.5 (the ratio near 1 cancels
    there); above it the ratio is at least 3 and 1 - x is exact."""
    return computed_wide(self, lambda x: (x.abs() < 0.5).where((2 * x / (1 - x)).log1p(), ((1 + x) / (1 - x)).log()) * 0.5)
  def sigmoid(self) -> "Tensor": return (1 + (-self._float()).exp()).reciprocal()
  def tanh(self) -> "Tensor":
    """(1 - e) / (1 + e) with e = exp(-2|x|), signed; below |x| = 0.3, where 1 - e cancels (tanh(1e-8)
    was 0 and tanh(-1e-6) 4.6% off from 2 sigmoid(2x) - 1), tanh's odd Taylor series in x."""
    x = self._float()
    ax = x.abs()
    e = (ax * -2.0).exp()
    big = (1.0 - e) * (1.0 + e).reciprocal()
    x2 = x * x
    coeffs = _TANH_SERIES[:_TANH_TERMS.get(x.dtype, len(_TANH_SERIES))]
    poly = x._const_like(coeffs[-1])
    for c in reversed(coeffs[:-1]): poly = poly * x2 + c
    return (ax < 0.3).where(x * poly, (x < 0).where(-big, big))
  def erf(self) -> "Tensor":
    """The error function (float64 to float64 accuracy; float32 to a few ulp, vectorized; half and
    bfloat16 computed in float32 and rounded once)."""
    x = self._float()
    if x.dtype == dtypes.float64: return _erf64(x)
    w = x if x.dtype == dtypes.float32 else x.cast(dtypes.float32)
    a = w.abs().minimum(4.0)
    t = a * a
    small = w * _horner(t, _ERF_P)  # (odd in x: -0.0 stays -0.0)
    large = 1 - (-t).exp() * _horner(a.maximum(1.0).reciprocal(), _ERF_Q)
    r = (a < 1).where(small, (w < 0).where(-large, large))
    return r if x.dtype == dtypes.float32 else r.cast(x.dtype)
  def abs(self) -> "Tensor":
    if self.dtype == dtypes.bool or dtypes.is_unsigned(self.dtype): return self
    if dtypes.is_float(self.dtype): return (self <= 0).where(self.sub(0.0, True), self)  # 0 - (-0.0) is +0.0; -(-0.0) would do, -(+0.0) not
    return (self < 0).where(-self, self)
  def sign(self) -> "Tensor":
    s = (self > 0).cast(self.dtype) - (self < 0).cast(self.dtype)
    return self.isnan().where(self, s) if dtypes.is_float(self.dtype) else s  # numpy: sign(nan) is nan
  def _integral_above(self) -> float:
    """Floats of this dtype with magnitude at least this are all integers (and nan/inf fail `<` it)."""
    return 2.0 ** (7 if self.dtype == dtypes.bfloat16 else {2: 10, 4: 23}.get(self.dtype.itemsize, 52))
  def floor(self) -> "Tensor":
    if not dtypes.is_float(self.dtype): return self
    t = self.cast(dtypes.int64).cast(self.dtype)  # truncation, exact below the limit
    return (self.abs() < self._integral_above()).where(t - (t > self).cast(self.dtype), self)
  def ceil(self) -> "Tensor": return -((-self).floor())
  def trunc(self) -> "Tensor":
    if not dtypes.is_float(self.dtype): return self
    return (self.abs() < self._integral_above()).where(self.cast(dtypes.int64).cast(self.dtype), self)
  def round(self) -> "Tensor":
    """Half to even, like numpy (from the truncation, so that no value is used many times over)."""
    if not dtypes.is_float(self.dtype): return self
    ti = self.cast(dtypes.int64)
    t = ti.cast(self.dtype)
    frac, odd = self - t, (ti & 1).cast(dtypes.bool)
    up = (frac > 0.5) | ((frac == 0.5) & odd)
    down = (frac < -0.5) | ((frac == -0.5) & odd)
    lim = self._integral_above()
    return ((self < lim) & (self > -lim)).where(t + up.cast(self.dtype) - down.cast(self.dtype), self)
  def isnan(self) -> "Tensor": return self != self if dtypes.is_float(self.dtype) else self._const_like(False, dtypes.bool)
  def isinf(self) -> "Tensor": return self.abs() == math.inf if dtypes.is_float(self.dtype) else self._const_like(False, dtypes.bool)
  def isfinite(self) -> "Tensor": return (self - self) == 0 if dtypes.is_float(self.dtype) else self._const_like(True, dtypes.bool)
  def clip(self, lo: Any, hi: Any) -> "Tensor": return self.maximum(lo).minimum(hi)

  # numpy's floor division and modulo
  # Both follow numpy's npy_divmod: r = fmod(x, y) (exact: BinaryOps.MOD on floats is C's fmod) moved
  # into the divisor's sign by adding y once, and q = (x - r) / y rounded to the nearest integer. An
  # x // y from floor(x / y) and x % y as x - q * y instead are wrong once |x / y| passes 2**24: q * y
  # is rounded (3902246.2 % 0.1 gave -0.208, 1e30 % 0.1 gave 1.5e22).
  def floordiv(self, y: Any, reverse: bool = False) -> "Tensor":
    """numpy floor division: rounds toward -inf; integer division by zero gives 0."""
    x, y = self._broadcasted(y, reverse)
    if x.dtype in (dtypes.float16, dtypes.bfloat16): return x.cast(dtypes.float32).floordiv(y.cast(dtypes.float32)).cast(x.dtype)  # as numpy's half
    if dtypes.is_float(x.dtype):
      m = x._e(BinaryOps.MOD, y)
      div = (x - m) / y
      div = ((m != 0) & ((m < 0) != (y < 0))).where(div - 1, div)
      fl = div.floor()
      fl = (div - fl > 0.5).where(fl + 1, fl)
      zero = (x._signbit() != y._signbit()).where(x._const_like(-0.0), x._const_like(0.0))  # copysign(0, x / y)
      return (y == 0).where(x / y, (div == 0).where(zero, fl))
    if x.dtype == dtypes.bool: x, y = x.cast(dtypes.int8), y.cast(dtypes.int8)
    return x._e(BinaryOps.IDIV, y)  # the code generator gives numpy's floor, 0 for // 0, and MIN // -1 == MIN
  def mod(self, y: Any, reverse: bool = False) -> "Tensor":
    """numpy modulo: the result takes the divisor's sign (a zero result too); integer modulo by zero gives 0."""
    x, y = self._broadcasted(y, reverse)
    if dtypes.is_float(x.dtype):
      m = x._e(BinaryOps.MOD, y)
      zero = (y < 0).where(x._const_like(-0.0), x._const_like(0.0))
      return ((m != 0) & ((m < 0) != (y < 0))).where(m + y, (m == 0).where(zero, m))
    if x.dtype == dtypes.bool: x, y = x.cast(dtypes.int8), y.cast(dtypes.int8)
    return x._e(BinaryOps.MOD, y)
  def _signbit(self) -> "Tensor":
    """Whether a float's sign is negative, -0.0 included (1 / -0.0 is -inf); false for nan. (Not from a
    bitcast: OpenCL without cl_khr_fp16 keeps half values in floats.)"""
    return (self < 0) | ((self == 0) & (self.reciprocal() < 0))
