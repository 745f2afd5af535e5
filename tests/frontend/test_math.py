"""numpy's special cases spelled out in tilecraft/frontend/math.py, against numpy: floor division
and modulo (ints and floats, by zero, exact quotients), powers (integer and float)."""
from __future__ import annotations
import warnings
import numpy as np
import pytest
from tilecraft import Tensor, dtypes
from op_checks import F32, check, check_many, randf, randi

INT_A = np.array([7, -7, 7, -7, 0, 5, -5, 1, -1, 13, -13, 2**31 - 1, -2**31, -2**31, 9, 100], np.int32)

INT_B = np.array([2, 2, -2, -2, 3, 0, 0, -1, 5, -4, 4, -1, -1, 3, 1, 7], np.int32)

def _np_div(x: np.ndarray, y: np.ndarray) -> np.ndarray: return np.where(y == 0, 0, x // np.where(y == 0, 1, y)).astype(x.dtype)

def _np_mod(x: np.ndarray, y: np.ndarray) -> np.ndarray: return np.where(y == 0, 0, x % np.where(y == 0, 1, y)).astype(x.dtype)

def test_integer_floor_div_mod(device: str) -> None:
  """numpy floor semantics for negative operands; x // 0 and x % 0 are 0 for integers; MIN // -1 wraps to MIN."""
  check_many({"//": (lambda x, y: x // y, _np_div), "%": (lambda x, y: x % y, _np_mod), "// -3": (lambda x, y: x // -3, lambda x, y: x // -3),
              "% 4": (lambda x, y: x % 4, lambda x, y: x % 4), "% -4": (lambda x, y: x % -4, lambda x, y: x % -4),
              "-7 //": (lambda x, y: -7 // y, lambda x, y: _np_div(np.full_like(y, -7), y))}, INT_A, INT_B, device=device)
  cases = {}
  for dt in (dtypes.int8, dtypes.int16, dtypes.int64, dtypes.uint8, dtypes.uint32):
    cases[f"{dt.name} //"] = (lambda x, y, dt=dt: x.cast(dt) // y.cast(dt), lambda x, y, dt=dt: _np_div(x.astype(dt.np), y.astype(dt.np)))
    cases[f"{dt.name} %"] = (lambda x, y, dt=dt: x.cast(dt) % y.cast(dt), lambda x, y, dt=dt: _np_mod(x.astype(dt.np), y.astype(dt.np)))
  check_many(cases, INT_A[:11], INT_B[:11], device=device)

def test_float_floor_div_mod(device: str, rng: np.random.Generator) -> None:
  a, b = randf(rng, 5, 6, lo=-10, hi=10), randf(rng, 6, lo=-4, hi=4)
  if device == "CPU": check_many({"//": (lambda x, y: x // y, np.floor_divide), "%": (lambda x, y: x % y, np.mod)}, a, b, device=device, atol=1e-4)
  sp = np.array([np.inf, -np.inf, np.nan, 3.0, -3.0, 0.0, 3.0, -3.0, 0.0], F32)
  sq = np.array([2.0, 2.0, 2.0, np.inf, np.inf, 0.0, 0.0, -np.inf, -np.inf], F32)
  check_many({"//": (lambda x, y: x // y, np.floor_divide), "%": (lambda x, y: x % y, np.mod)}, sp, sq, device=device)

def test_float_floor_div_exact_quotients(device: str, rng: np.random.Generator) -> None:
  """a // b and a % b when a is an exact multiple of b: x * (1/b) can land one ulp under the integer
  quotient (49 * (1/49) < 1), which floor turned into an off-by-one (hundreds of 20,000 pairs wrong)."""
  for dt in (np.float32, np.float64, np.float16):
    b = (rng.integers(1, 50, 4000) * rng.choice([-1, 1], 4000)).astype(dt)
    a = (rng.integers(-50, 50, 4000).astype(dt) * b).astype(dt)
    q, m = (Tensor(a, device=device) // Tensor(b, device=device)).numpy(), (Tensor(a, device=device) % Tensor(b, device=device)).numpy()
    assert np.array_equal(q, a // b), f"{dt.__name__} //: {int((q != a // b).sum())} wrong, e.g. {a[q != a // b][:3]} // {b[q != a // b][:3]}"
    assert np.array_equal(m, np.mod(a, b)), f"{dt.__name__} %: {int((m != np.mod(a, b)).sum())} wrong"

def test_pow(device: str, rng: np.random.Generator) -> None:
  a, b = randf(rng, 3, 4, lo=-3, hi=3), randf(rng, 4, lo=-2, hi=2)
  cases = {f"x**{e}": (lambda x, y, e=e: (x.abs() if isinstance(e, float) else x) ** e, lambda x, y, e=e: (np.abs(x) if isinstance(e, float) else x) ** e)
           for e in ((0, 1, 2, 3, 7, -1, -2, 0.5, 2.5, -0.5, 2.0) if device == "CPU" else (3, -1, 2.5))}
  check_many(cases, a, b, device=device, rtol=2e-5, atol=1e-6)
  tensor_cases = {"x**y": (lambda x, y: x ** y, np.power),  # negative bases: nan unless the power is an integer
                  "x**round(y)": (lambda x, y: x ** y.round(), lambda x, y: x ** np.round(y)), "2**y": (lambda x, y: 2 ** y, lambda x, y: F32(2) ** y)}
  check_many(tensor_cases if device == "CPU" else {"x**y": tensor_cases["x**y"]}, a, b, device=device, rtol=2e-5, atol=1e-6)
  edge = np.array([0.0, 0.0, 0.0, np.nan, 1.0, np.inf, -np.inf, -2.0, -0.5, 0.0], F32)
  expo = np.array([0.0, -1.0, 2.0, 0.0, np.nan, -1.0, 3.0, 3.0, np.inf, -np.inf], F32)
  if device == "CPU": check_many({"edge": (lambda x, y: x ** y, np.power)}, edge, expo, device=device)
  i = randi(rng, 3, 4, lo=-6, hi=6)
  check_many({"i**3": (lambda x: x ** 3, lambda x: x ** 3), "i**0": (lambda x: x ** 0, lambda x: x ** 0), "i**5": (lambda x: x ** 5, lambda x: x ** 5)}, i, device=device)
  with pytest.raises(ValueError, match="negative"): Tensor(i, device=device) ** -1

def test_pow_int_tensors(rng: np.random.Generator) -> None:
  """Integer ** integer tensor stays an integer (wrapping like numpy)."""
  x, e = randi(rng, 3, 5, lo=-5, hi=6, dt=np.int8), randi(rng, 5, lo=0, hi=9, dt=np.int8)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    check(lambda p, q: p ** q, np.power, x, e)
