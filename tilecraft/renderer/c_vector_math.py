"""Whole-vector exp2 and log2 for the C renderer, in GCC/Clang vector extensions without library
calls, so elementwise kernels with transcendentals stay vectorized."""
from __future__ import annotations
import math
from tilecraft.dtype import DType, dtypes

# 2^f on [-1/2, 1/2] to degree 6: the least-squares fit of the relative error at 4000 Chebyshev nodes
# (numpy lstsq, coefficients rounded to float32; max relative error 1.6e-8, below float32 rounding)
EXP2_POLY = (1.0, 0.6931471824645996, 0.24022646248340607, 0.05550329014658928, 0.009618519805371761, 0.0013399859890341759,
             0.00015337577497120947)

def vector_exp2(vt: str, it: str, scalar: DType) -> list[str]:
  """exp2 on a whole vector without library calls (so it stays vectorized): 2^x = 2^n * 2^f with
  n = round(x) (adding 1.5*2^23 leaves n in the low mantissa bits), |f| <= 1/2, 2^f by EXP2_POLY, and
  2^n built in the exponent bits of two factors (exact into subnormals and up to inf). NaN stays NaN
  (it passes the clamps and every step after them). About 25 vector instructions."""
  if scalar != dtypes.float32: return _vector_lanewise(vt, "exp2", scalar)
  poly = _horner(EXP2_POLY, "f")
  return [f"static inline {vt} tc_exp2_{vt}({vt} x) {{",
          f"  {vt} zero = ({vt}){{}};",
          f"  {vt} xc = tc_sel_{vt}(x < -150.0f, zero - 150.0f, tc_sel_{vt}(x > 129.0f, zero + 129.0f, x));",
          f"  {vt} t = xc + 12582912.0f;  /* 1.5*2^23: t is an integer of unit spacing, round(xc) in its low bits */",
          f"  {vt} f = xc - (t - 12582912.0f);",
          f"  {it} n = ({it})t - 1262485504;  /* minus the bits of 1.5*2^23 */",
          f"  {vt} p = {poly};",
          f"  {it} n2 = n >> 1, n1 = n - n2;  /* 2^n as two normal powers of two: exact into subnormals and up to inf */",
          f"  return (p * ({vt})((n1 + 127) << 23)) * ({vt})((n2 + 127) << 23);",
          "}"]

def _horner(coeffs: list, var: str) -> str:
  """The C expression of sum(coeffs[k] * var^k) in Horner form, float32 literals."""
  poly = f"{coeffs[-1]!r}f"
  for c in reversed(coeffs[:-1]): poly = f"({poly}*{var}+{c!r}f)"
  return poly

def vector_log2(vt: str, it: str, scalar: DType) -> list[str]:
  """log2 on a whole vector without library calls: x = m * 2^e with m in [sqrt(1/2), sqrt(2)),
  log2(m) = 2/ln(2) * atanh(t), t = (m-1)/(m+1), |t| <= 0.172, by its odd series to t^9 (error
  below float32 rounding). Subnormals are scaled up first; 0 -> -inf, x < 0 -> NaN, inf and NaN stay."""
  if scalar != dtypes.float32: return _vector_lanewise(vt, "log2", scalar)
  poly = _horner([2 / math.log(2) / k for k in (1, 3, 5, 7, 9)], "t2")
  return [f"static inline {vt} tc_log2_{vt}({vt} x) {{",
          f"  {vt} zero = ({vt}){{}};",
          f"  {it} sub = x < 1.17549435e-38f;",
          f"  {it} bits = ({it})tc_sel_{vt}(sub, x * 8388608.0f, x);",
          f"  {it} e = ((bits >> 23) & 255) - 127 - (sub & 23);",
          f"  {vt} m = ({vt})((bits & 8388607) | 1065353216);  /* mantissa in [1, 2) */",
          f"  {it} big = m > 1.41421356f;",
          f"  m = tc_sel_{vt}(big, m * 0.5f, m);",
          "  e = e + (big & 1);",
          f"  {vt} t = (m - 1.0f) / (m + 1.0f), t2 = t * t;",
          f"  {vt} r = __builtin_convertvector(e, {vt}) + t * {poly};",
          f"  r = tc_sel_{vt}(x == 0.0f, zero - INFINITY, r);",
          f"  r = tc_sel_{vt}(x < 0.0f, zero + NAN, r);",
          f"  r = tc_sel_{vt}(x == INFINITY, x, r);",
          f"  return tc_sel_{vt}(x != x, x, r);",
          "}"]

def _vector_lanewise(vt: str, fn: str, scalar: DType) -> list[str]:
  """A math function on a non-float32 vector, lane by lane through the C library."""
  lanes = int(vt[len(scalar.name):]) if vt.startswith(scalar.name) else 0
  call = fn if scalar == dtypes.float64 else fn + "f"
  return [f"static inline {vt} tc_{fn}_{vt}({vt} x) {{ {vt} r; for (int i = 0; i < {lanes}; i++) r[i] = {call}(x[i]); return r; }}"]
