"""numpy's special cases spelled out in tilecraft/frontend/math.py, against numpy: floor division
and modulo (ints and floats, by zero, exact quotients), powers (integer and float)."""
from __future__ import annotations
import math, warnings
from typing import Callable
import numpy as np
import pytest
from tilecraft import Tensor, dtypes
from op_checks import F32, _has_f64, check, check_many, randf, randi, select_rows

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

# ---- exact numpy results: large quotients, signed zeros, tiny divisors, Python-float exponents --------

ALL_DEVICES = ["CPU", "LLVM", "OPENCL", "PYTHON"]

def same_bits(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
  """Equal values, nan where numpy has nan, and the same sign on zeros (a nan's sign is not compared)."""
  got, want = np.asarray(got), np.asarray(want)
  assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype}{got.shape} != numpy {want.dtype}{want.shape}"
  nan = np.isnan(want)
  bad = ~((got == want) | (nan & np.isnan(got))) | (~nan & (np.signbit(got) != np.signbit(want)))
  assert not bad.any(), f"{what}: {int(bad.sum())} differ, e.g. got {got[bad][:4]} want {want[bad][:4]}"

def _mod_operands(rng: np.random.Generator, dt: type, n: int) -> tuple[np.ndarray, np.ndarray]:
  """Dividends up to 1e30 (float16: its range) over divisors of every size, plus the special values."""
  top = 4 if dt == np.float16 else 30
  x = (10.0 ** rng.uniform(-3, top, n) * rng.choice([-1, 1], n)).astype(dt)
  y = (10.0 ** rng.uniform(-3, 2, n) * rng.choice([-1, 1], n)).astype(dt)
  sx = np.array([3902246.2, 47319576, 1e30, 1e20, -0.0, 0.0, 5.0, -5.0, np.inf, 3.0, -3.0, 0.0, 1.0, np.nan, 2.0, -0.0], np.float64)
  sy = np.array([0.1, -2.3, 0.1, 0.1, 2.0, -2.0, 2.5, 2.5, 2.0, np.inf, np.inf, 0.0, 0.0, 1.0, np.nan, -np.inf], np.float64)
  with np.errstate(over="ignore"): return np.concatenate([x, sx.astype(dt)]), np.concatenate([y, sy.astype(dt)])

@pytest.mark.parametrize("device", ALL_DEVICES)
def test_float_mod_large_quotients(device: str, rng: np.random.Generator) -> None:
  """x % y is numpy's exactly (fmod-based: the divisor's sign, |r| < |y|, a zero takes y's sign) however
  large x / y is: 3902246.2 % 0.1 was -0.208 (numpy 0.0919), float64 1e20 % 0.1 was -5551."""
  for dt in (np.float32, np.float64, np.float16):
    if dt == np.float64 and not _has_f64(device): continue
    x, y = _mod_operands(rng, dt, 300)
    with np.errstate(all="ignore"): want = np.mod(x, y)
    same_bits((Tensor(x, device=device) % Tensor(y, device=device)).numpy(), want, f"{device} {dt.__name__} %")
    # a python-scalar divisor (a constant in the kernel) and a python-scalar dividend
    with np.errstate(all="ignore"): w1, w2 = np.mod(x, dt(0.1)), np.mod(dt(1e4 if dt == np.float16 else 1e20), y)
    same_bits((Tensor(x, device=device) % 0.1).numpy(), w1, f"{device} {dt.__name__} % 0.1")
    same_bits(((1e4 if dt == np.float16 else 1e20) % Tensor(y, device=device)).numpy(), w2, f"{device} {dt.__name__} 1e20 %")

@pytest.mark.parametrize("device", ["CPU", "OPENCL"])
def test_float_floordiv_signs_and_special_values(device: str, rng: np.random.Generator) -> None:
  """x // y: numpy's value and sign of zero (-0.0 // 2 and 1 // -inf are -0.0 and -1), nan and inf
  where numpy has them; exact for quotients below 2**22 (above, within an ulp: x * (1/y) is not a
  correctly rounded division)."""
  x, y = _mod_operands(rng, np.float32, 300)
  with np.errstate(all="ignore"): want = np.floor_divide(x, y)
  got = (Tensor(x, device=device) // Tensor(y, device=device)).numpy()
  small = ~(np.abs(want) >= 2 ** 22)
  same_bits(got[small], want[small], f"{device} //")
  np.testing.assert_allclose(got[~small], want[~small], rtol=2.5e-7)

@pytest.mark.parametrize("device", ALL_DEVICES)
def test_division_by_tiny_divisors(device: str) -> None:
  """A divisor whose reciprocal overflows (float32 below 2**-126, float16 below 2**-14) is scaled first:
  1e-39 / 1e-39 was inf."""
  for dt in (np.float32, np.float16):
    x = np.array([1e-39, 3.0, -2e-39, 1.0, 0.0, 1e-38, 5e-7, 1e-5], dt)
    y = np.array([1e-39, 1e-41, 1e-39, 3.0, 1e-40, 1e-45, -6e-8, 1e-5], dt)
    with np.errstate(all="ignore"): want = x / y
    np.testing.assert_allclose((Tensor(x, device=device) / Tensor(y, device=device)).numpy(), want, rtol=2e-7 if dt == np.float32 else 1e-3)
    with np.errstate(all="ignore"): w2 = x // y
    same_bits((Tensor(x, device=device) // Tensor(y, device=device)).numpy(), w2, f"{device} {dt.__name__} //")
  np.testing.assert_allclose((Tensor(np.array([2.0, 1e-38], np.float32), device=device) / 1e-39).numpy(), np.array([np.inf, 10.0], np.float32), rtol=1e-6)

def test_abs_of_negative_zero(device: str) -> None:
  x = np.array([-0.0, 0.0, -1.5, 2.0, np.nan, -np.inf], np.float32)
  same_bits(Tensor(x, device=device).abs().numpy(), np.abs(x), "abs")

POW_BASES = np.array([-2.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.0, np.inf, -np.inf, np.nan, -3.0, 1.0001, -1.0001], np.float32)
POW_EXPONENTS = [math.inf, -math.inf, math.nan, 1e20, -1e20, 16777217.0, 16777215.0, -16777215.0, 1e10 + 1, 3.0, -3.0, 33.0, -33.0,
                 0.0, -0.0, 0.5, 2.5, -2.5, 1.5, -3.7, 1e-45, 7.0]

@pytest.mark.parametrize("device", ["CPU", "LLVM", "OPENCL", "PYTHON"])
def test_pow_python_float_exponents(device: str) -> None:
  """x ** e for python floats e: inf and nan crashed the constant folder (OverflowError/ValueError); 1e20
  and 16777217.0 (even integers in float32) gave nan for negative bases; (-1) ** inf is 1; zero bases keep
  their sign for odd exponents. Special values and signs are exact, the rest within a few ulp."""
  x = Tensor(POW_BASES, device=device).reshape(1, -1).expand(len(POW_EXPONENTS), len(POW_BASES))
  rows = select_rows([x ** e for e in POW_EXPONENTS]).numpy()  # (row i: x ** POW_EXPONENTS[i], one kernel)
  for e, got in zip(POW_EXPONENTS, rows):
    with np.errstate(all="ignore"): want = POW_BASES ** np.float32(e)
    fin = np.isfinite(want) & (want != 0)
    same_bits(got[~fin], want[~fin], f"{device} x ** {e}")
    np.testing.assert_allclose(got[fin], want[fin], rtol=5e-6, err_msg=f"{device} x ** {e}")
    assert (np.signbit(got[fin]) == np.signbit(want[fin])).all()

def test_pow_tensor_exponents_special_values(device: str) -> None:
  """The same table with the exponents as a tensor (no fast paths): C pow's special cases, with nan
  for a finite negative base to a non-integer power, (-inf) ** 2.5 = inf and 0 ** nan = nan."""
  e = np.array([v for v in POW_EXPONENTS if v != 0.5], np.float32)
  X, E = np.meshgrid(POW_BASES, e)
  with np.errstate(all="ignore"): want = X ** E
  got = (Tensor(X.copy(), device=device) ** Tensor(E.copy(), device=device)).numpy()
  fin = np.isfinite(want) & (want != 0)
  same_bits(got[~fin], want[~fin], f"{device} x ** y")
  np.testing.assert_allclose(got[fin], want[fin], rtol=5e-6)
  assert (np.signbit(got[fin]) == np.signbit(want[fin])).all()

@pytest.mark.parametrize("device", ["CPU", "LLVM", "OPENCL", "PYTHON"])
def test_constant_folding_follows_the_runtime(device: str) -> None:
  """A cast or floor of a constant is folded when the kernel is built: inf.floor() and nan.cast(int32)
  crashed there, and a float -> int32 cast out of range wrapped where the runtime gives INT_MIN."""
  vals = [math.inf, -math.inf, math.nan, 3e9, -3e9, 1e10, 300.0, -1.0, 1e20, 2.5e9, -129.7, 70000.5]
  # (OpenCL C leaves out-of-range conversions to narrow ints undefined: PoCL's differ between its scalar and vector code)
  for dt in (dtypes.int32, dtypes.int64) + ((dtypes.int8, dtypes.int16, dtypes.uint8) if device != "OPENCL" else ()):
    runtime = Tensor(np.array(vals, np.float32), device=device).cast(dt)
    folded = _of_constants(vals, device, lambda c: c.cast(dt))
    runtime.realize(folded)
    np.testing.assert_array_equal(folded.numpy(), runtime.numpy(), err_msg=f"{device} {dt.name}")
    with np.errstate(all="ignore"): np.testing.assert_array_equal(folded.numpy(), np.array(vals, np.float32).astype(dt.np), err_msg=dt.name)
  specials = [math.inf, -math.inf, math.nan, 1e20, -2.5]
  floors, rounds = _of_constants(specials, device, Tensor.floor), _of_constants(specials, device, Tensor.round)
  floors.realize(rounds)
  same_bits(floors.numpy(), np.floor(np.float32(specials)), f"{device} floor")
  same_bits(rounds.numpy(), np.round(np.float32(specials)), f"{device} round")

def _of_constants(vals: list[float], device: str, fn: Callable[[Tensor], Tensor]) -> Tensor:
  """[fn(vals[0]), fn(vals[1]), ...], each fn applied to a float32 constant, in one kernel (op_checks.select_rows)."""
  return select_rows([fn(Tensor.full((len(vals), 1), v, dtype=dtypes.float32, device=device)) for v in vals]).reshape(len(vals))

@pytest.mark.parametrize("device", ["CPU", "LLVM", "OPENCL", "PYTHON"])
def test_tanh_and_cos_accuracy(device: str, rng: np.random.Generator) -> None:
  """tanh within 4 ulp everywhere (tanh(1e-8) was 0 and tanh(-1e-6) 4.6% off: 2 sigmoid(2x) - 1
  cancels near 0); float32 cos within an ulp for arguments up to 1e7 and beyond (cos(1e6) was off by
  3e-3: pi/2 - x rounded to float32), float64 cos within 2e-15 absolute."""
  n = 300 if device == "PYTHON" else 5000
  for dt in (np.float32, np.float64, np.float16):
    x = (10.0 ** rng.uniform(-10, 1.5, n) * rng.choice([-1, 1], n)).astype(dt)
    x = np.concatenate([x, np.array([1e-8, -1e-6, 0.3, -0.3, np.inf, -np.inf, np.nan, -0.0], dt)])
    want = np.tanh(x.astype(np.float64))
    got = Tensor(x, device=device).tanh().numpy()
    same_bits(got[~np.isfinite(want) | (want == 0)], want.astype(dt)[~np.isfinite(want) | (want == 0)], f"{device} tanh {dt.__name__}")
    ok = np.isfinite(want) & (want != 0)
    ulps = np.abs(got[ok].astype(np.float64) - want[ok]) / np.spacing(np.abs(want[ok]).astype(dt)).astype(np.float64)
    assert ulps.max() <= 4, f"{device} tanh {dt.__name__}: {ulps.max():.1f} ulp at x = {x[ok][ulps.argmax()]}"
    top = 4.5 if dt == np.float16 else 7
    c = (10.0 ** rng.uniform(-5, top, n) * rng.choice([-1, 1], n)).astype(dt)
    c = np.concatenate([c, np.array([1e6 if dt != np.float16 else 6e4, 1.5707964, 1.5707963267948966, 0.0, -0.0, np.inf, np.nan], dt)])
    with np.errstate(invalid="ignore"): want = np.cos(c.astype(np.float64))
    got = Tensor(c, device=device).cos().numpy().astype(np.float64)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    err = np.abs(got - want)[~np.isnan(want)]
    bound = 2e-15 if dt == np.float64 else np.spacing(np.abs(want[~np.isnan(want)]).astype(dt)).astype(np.float64)
    assert (err <= bound).all(), f"{device} cos {dt.__name__}: error {err.max()} at x = {c[~np.isnan(want)][np.argmax(err - bound)]}"

def test_erf() -> None:
  """Tensor.erf: float32 within a few ulp of math.erf everywhere (a dense grid, the branch edges at 1 and
  4, tiny values), odd (-0.0 stays -0.0), saturating at +-1, nan through; float64 to 1e-12; half rounded
  from float32. The float32 kernel is vector code (no scalar libm call per lane)."""
  xs = np.concatenate([np.linspace(-6, 6, 20001), np.nextafter(np.float32([1, 4]), 0), np.float32([1, 4]), [1e-30, -1e-8, 0.0, -0.0]]).astype(np.float32)
  ref = np.array([math.erf(float(v)) for v in xs])
  got = Tensor(xs).erf().numpy()
  ulp = np.abs(got.astype(np.float64) - ref) / np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
  assert ulp.max() <= 4, (xs[ulp.argmax()], got[ulp.argmax()], ref[ulp.argmax()])
  assert list(np.signbit(got[-2:])) == [False, True]
  special = Tensor(np.float32([np.inf, -np.inf, np.nan])).erf().numpy()
  assert special[0] == 1 and special[1] == -1 and np.isnan(special[2])
  if _has_f64("CPU"):
    np.testing.assert_allclose(Tensor(xs.astype(np.float64)).erf().numpy(), ref, rtol=0, atol=1e-12)
  h = xs[::50].astype(np.float16)
  np.testing.assert_allclose(Tensor(h).erf().numpy().astype(np.float64), [math.erf(float(v)) for v in h], atol=1e-3)
  src = Tensor(xs[:4096]).erf().schedule()[-1]
  from tilecraft.codegen.kernel import Kernel
  from tilecraft.device import Device
  code = Kernel(src.ast, Device["CPU"].renderer).hand_coded_optimizations().to_program().src
  assert "float8" in code or "float16" in code or "float4" in code
