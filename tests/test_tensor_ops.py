"""Tensor ops against numpy (DESIGN §8) on CPU and OPENCL: elementwise math with broadcasting and
dtype promotion, NaN/inf, integer floor division, reductions, movement ops and indexing, matmul,
conv2d, pooling and layernorm, on odd, 1-size and 0-size shapes.

Compiling a kernel costs ~0.2 s on CPU and ~0.7 s on OPENCL (PoCL), so tables of elementwise cases
are checked in ONE kernel each (`check_many`: case i is row i, selected with `where`), CPU runs every
case of the long parametrizations and OPENCL a representative few (`on_devices`). Every op runs on
both devices.

Where the frontend deliberately differs from numpy the expected dtype is given explicitly: values
that become floats (int / int, exp of an int32, mean of ints, a python float with an int tensor) are
`dtypes.default_float` (float32), not float64, and python ints default to int32."""
from __future__ import annotations
import math, warnings
from typing import Any, Callable, Optional
import numpy as np
import pytest
from tilecraft import Context, Tensor, dtypes
from tilecraft.ops import BufferOps, MetaOps, ReduceOps

# ---- devices and the comparison helpers -------------------------------------------------------------

def on_devices(argnames: str, cases: list, opencl: Any = "all") -> Any:
  """Parametrize `device` and `argnames` over `cases`: every case on CPU, and on OPENCL the cases at
  the indices in `opencl` ("all" for every one)."""
  params = []
  for i, case in enumerate(cases):
    vals = case if len(argnames.split(",")) > 1 else (case,)
    cid = "-".join(v.__name__ if isinstance(v, type) else str(v).replace(" ", "") for v in vals)
    params.append(pytest.param("CPU", *vals, id=f"CPU-{cid}"))
    if opencl == "all" or i in opencl: params.append(pytest.param("OPENCL", *vals, id=f"OPENCL-{cid}", marks=pytest.mark.opencl))
  return pytest.mark.parametrize(f"device,{argnames}", params)

F32 = np.float32

def _np_dtype(dt: Any) -> np.dtype: return np.dtype(dt.np) if hasattr(dt, "np") else np.dtype(dt)

def _expected(f_np: Callable, arrays: tuple, dtype: Any) -> np.ndarray:
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    exp = np.asarray(f_np(*arrays))
    return exp.astype(_np_dtype(dtype)) if dtype is not None else exp

def _compare(got: np.ndarray, exp: np.ndarray, atol: float, rtol: float, what: str = "") -> None:
  assert got.shape == exp.shape, f"{what}shape {got.shape} != numpy {exp.shape}"
  if exp.dtype.kind in "fc": np.testing.assert_allclose(got, exp, atol=atol, rtol=rtol, equal_nan=True, err_msg=what)
  else: np.testing.assert_array_equal(got, exp, err_msg=what)

def check(f_t: Callable, f_np: Callable, *arrays: Any, device: str = "CPU", dtype: Any = None, atol: float = 1e-5, rtol: float = 1e-5) -> np.ndarray:
  """f_t on Tensors (made from `arrays` on `device`) matches f_np on the arrays: shape, dtype and values
  (NaN where numpy has NaN, inf with its sign). `dtype` overrides the expected numpy dtype."""
  ts = [Tensor(a, device=device) if isinstance(a, np.ndarray) else a for a in arrays]
  out = f_t(*ts)
  assert isinstance(out, Tensor), f"expected a Tensor, got {type(out).__name__}"
  assert out.device == device
  got = out.numpy()
  exp = _expected(f_np, arrays, dtype)
  assert got.dtype == exp.dtype, f"dtype {got.dtype} != numpy {exp.dtype}"
  _compare(got, exp, atol, rtol)
  return got

def check_many(cases: dict, *arrays: np.ndarray, device: str = "CPU", atol: float = 1e-5, rtol: float = 1e-5) -> None:
  """Every case, an elementwise function of the arrays given as (f_t, f_np) or (f_t, f_np, expected dtype),
  in ONE kernel: the inputs are expanded to (len(cases), ...) first, case i is computed everywhere and row i
  of the result selects it with `where`. Each case's dtype is checked (it is known before running), then
  its values against numpy (ints exactly)."""
  nd = max(a.ndim for a in arrays)
  k = len(cases)
  ts = [Tensor(a, device=device).reshape(1, *(1,) * (nd - a.ndim), *a.shape) for a in arrays]
  shape = (k,) + tuple(int(s) for s in np.broadcast_shapes(*(a.shape for a in arrays)))
  ts = [t.expand(k, *t.shape[1:]) for t in ts]
  outs, exps = [], []
  for name, case in cases.items():
    f_t, f_np, dt = case if len(case) == 3 else (*case, None)
    out, exp = f_t(*ts), _expected(f_np, arrays, dt)
    assert out.dtype.np is not None and np.dtype(out.dtype.np) == exp.dtype, f"{name}: dtype {out.dtype} != numpy {exp.dtype}"
    assert out.shape == (k, *(1,) * (nd - exp.ndim), *exp.shape), f"{name}: shape {out.shape[1:]} != numpy {exp.shape}"
    outs.append(out); exps.append(exp)
  # one dtype holds every case exactly: int64 for ints, else float64 (float32 where a device has no float64)
  common = dtypes.int64 if all(e.dtype.kind in "biu" and e.dtype != np.uint64 for e in exps) else dtypes.float64 if _has_f64(device) else dtypes.float32
  sel = Tensor(np.arange(k, dtype=np.int32).reshape(k, *(1,) * nd), device=device).expand(*shape)
  res = outs[-1].cast(common).expand(*shape)
  for i in range(k - 2, -1, -1): res = (sel == i).where(outs[i].cast(common).expand(*shape), res)
  got = res.numpy()
  for i, (name, exp) in enumerate(zip(cases, exps)):
    want = np.broadcast_to(exp, shape[1:])
    _compare(got[i].astype(exp.dtype) if exp.dtype.kind in "biu" else got[i], want.astype(got.dtype) if exp.dtype.kind == "f" else want,
             atol, rtol, f"case {name!r}: ")

def _has_f64(device: str) -> bool:
  try: Tensor([0.0], dtype=dtypes.float64, device=device)
  except TypeError: return False
  return True

def randf(rng: np.random.Generator, *shape: int, lo: float = -3, hi: float = 3) -> np.ndarray:
  return rng.uniform(lo, hi, shape).astype(F32)

def randi(rng: np.random.Generator, *shape: int, lo: int = -20, hi: int = 20, dt: Any = np.int32) -> np.ndarray:
  return rng.integers(lo, hi, shape).astype(dt)

# ---- elementwise --------------------------------------------------------------------------------------

def _gelu(x: np.ndarray) -> np.ndarray:
  return (0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x.astype(np.float64) ** 3)))).astype(x.dtype)

UNARY = {
  "neg": (lambda t: -t, np.negative), "abs": (lambda t: t.abs(), np.abs), "exp": (lambda t: t.exp(), np.exp),
  "exp2": (lambda t: t.exp2(), np.exp2), "log": (lambda t: t.log(), np.log), "log2": (lambda t: t.log2(), np.log2),
  "sqrt": (lambda t: t.sqrt(), np.sqrt), "reciprocal": (lambda t: t.reciprocal(), np.reciprocal), "sin": (lambda t: t.sin(), np.sin),
  "cos": (lambda t: t.cos(), np.cos), "tanh": (lambda t: t.tanh(), np.tanh), "sigmoid": (lambda t: t.sigmoid(), lambda x: 1 / (1 + np.exp(-x))),
  "relu": (lambda t: t.relu(), lambda x: np.maximum(x, F32(0))), "gelu": (lambda t: t.gelu(), _gelu),
}
NAN_INF = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e-30, -1e30, 88.0, -104.0], F32)

@pytest.mark.parametrize("name", list(UNARY))
def test_unary(rng: np.random.Generator, name: str) -> None:
  """One kernel per op (CPU); the all-ops kernel below runs on both devices."""
  f_t, f_np = UNARY[name]
  x = randf(rng, 3, 5, lo=0.05 if name in ("log", "log2", "sqrt") else -4, hi=4)
  x[0, :3] = [0.5, 1.0, 2.0] if name in ("log", "log2", "sqrt") else [0.0, -1.0, 1.0]
  check(f_t, f_np, x, atol=1e-5, rtol=2e-5)
  check(f_t, f_np, NAN_INF if name not in ("sin", "cos") else NAN_INF[[0, 1, 2, 3, 6, 9]], atol=1e-6, rtol=1e-4)

def test_unary_all(device: str, rng: np.random.Generator) -> None:
  x = randf(rng, 2, 7, lo=-4, hi=4)
  x[0, :4] = [0.0, -1.0, 1.0, 0.5]
  check_many(UNARY, x, device=device, atol=1e-5, rtol=2e-5)
  check_many({k: v for k, v in UNARY.items() if k not in ("sin", "cos")}, NAN_INF, device=device, atol=1e-6, rtol=1e-4)

@on_devices("shape", [(3, 5), (1, 7), (2, 1, 3), (), (0, 3), (4, 0)], opencl=[2, 4])
def test_unary_shapes(device: str, rng: np.random.Generator, shape: tuple) -> None:
  x = randf(rng, *shape)
  check(lambda t: (t.exp() * t.abs()).sqrt() - t.sigmoid(), lambda a: np.sqrt(np.exp(a) * np.abs(a)) - 1 / (1 + np.exp(-a)), x, device=device, atol=1e-5)

def test_unary_on_ints(device: str, rng: np.random.Generator) -> None:
  """Float-valued ops of ints: bool/int8/uint8 -> float16 and int16 -> float32 as numpy; int32 -> default_float."""
  i = randi(rng, 3, 4, lo=0, hi=9)
  check_many({"sqrt i32": (lambda t: t.sqrt(), np.sqrt, dtypes.default_float), "log i16": (lambda t: t.cast(dtypes.int16).log(), lambda a: np.log(a.astype(np.int16))),
              "exp i8": (lambda t: t.cast(dtypes.int8).exp(), lambda a: np.exp(a.astype(np.int8))),
              "sqrt bool": (lambda t: (t > 3).sqrt(), lambda a: np.sqrt(a > 3)), "abs i32": (lambda t: (t - 4).abs(), lambda a: np.abs(a - 4)),
              "neg i16": (lambda t: -t.cast(dtypes.int16), lambda a: -a.astype(np.int16)), "recip u8": (lambda t: t.cast(dtypes.uint8).reciprocal(), lambda a: np.reciprocal(a.astype(np.uint8).astype(np.float16)))},
             i, device=device, rtol=5e-3)

BINARY = {
  "add": (lambda a, b: a + b, np.add), "sub": (lambda a, b: a - b, np.subtract), "mul": (lambda a, b: a * b, np.multiply),
  "div": (lambda a, b: a / b, np.divide), "maximum": (lambda a, b: a.maximum(b), np.maximum),
  "minimum": (lambda a, b: a.minimum(b), np.minimum), "lt": (lambda a, b: a < b, np.less), "le": (lambda a, b: a <= b, np.less_equal),
  "gt": (lambda a, b: a > b, np.greater), "ge": (lambda a, b: a >= b, np.greater_equal), "eq": (lambda a, b: a == b, np.equal),
  "ne": (lambda a, b: a != b, np.not_equal), "floordiv": (lambda a, b: a // b, np.floor_divide), "mod": (lambda a, b: a % b, np.mod),
}

@pytest.mark.parametrize("name", list(BINARY))
def test_binary(rng: np.random.Generator, name: str) -> None:
  """One kernel per op (CPU), with broadcasting from a lower-rank operand."""
  f_t, f_np = BINARY[name]
  a, b = randf(rng, 3, 5), randf(rng, 5)
  b[1] = a[0, 1]  # a tie for the comparisons
  check(f_t, f_np, a, b, rtol=1e-5, atol=1e-5)

def test_binary_all(device: str, rng: np.random.Generator) -> None:
  a, b = randf(rng, 3, 5), randf(rng, 1, 5)
  b[0, 1] = a[0, 1]
  check_many(BINARY, a, b, device=device, atol=1e-5)
  ia, ib = randi(rng, 3, 5), randi(rng, 5, lo=1, hi=9)
  ib[2] = ia[1, 2]
  int_cases = {k: v if k != "div" else (*v, dtypes.default_float) for k, v in BINARY.items()}
  check_many(int_cases, ia, ib, device=device)

def test_nan_inf_arithmetic(device: str) -> None:
  a = np.array([np.nan, np.inf, -np.inf, np.inf, 1.0, 0.0, -0.0, 1e6, 3.0, -2.0], F32)
  b = np.array([1.0, np.inf, np.inf, 0.0, 0.0, 0.0, 1.0, 10.0, np.nan, -np.inf], F32)
  check_many(BINARY, a, b, device=device)

# pairs of shapes that broadcast (numpy rules), including 1-size and 0-size dims
BCAST = [((3, 5), (3, 5)), ((3, 5), (5,)), ((4, 1, 3), (2, 1)), ((1,), (2, 3)), ((), (3,)), ((0, 3), (1, 3)), ((2, 0), (2, 1)), ((2, 1, 0), (3, 1))]

@on_devices("sa,sb", BCAST, opencl=[2, 5])
def test_broadcasting(device: str, rng: np.random.Generator, sa: tuple, sb: tuple) -> None:
  a, b = randf(rng, *sa), randf(rng, *sb)
  check(lambda x, y: (x * y + x).maximum(y) - (x < y).where(x, y), lambda x, y: np.maximum(x * y + x, y) - np.where(x < y, x, y), a, b, device=device)

def test_broadcast_errors() -> None:
  with pytest.raises(ValueError, match=r"\(2, 3\) and \(4,\)"): Tensor.ones(2, 3) + Tensor.ones(4)
  with pytest.raises(ValueError, match=r"\(2, 3, 1\) and \(2, 4\)"): Tensor.ones(2, 3, 1) * Tensor.ones(2, 4)
  with pytest.raises(ValueError, match=r"\(3,\).*\(2, 1, 2\)"): Tensor.ones(3).where(Tensor.ones(2, 1, 2), 0)
  with pytest.raises(ValueError, match=r"expand shape \(2, 3\) to \(4, 3\)"): Tensor.ones(2, 3).expand(4, 3)
  with pytest.raises(ValueError, match=r"expand"): Tensor.ones(2, 3).expand(3)

PROMOTE = [(np.int8, np.int64), (np.uint8, np.int8), (np.int32, np.float16), (np.int16, np.float32), (np.uint32, np.int32),
           (np.bool_, np.int16), (np.bool_, np.bool_), (np.float16, np.float32), (np.uint16, np.uint32), (np.int32, np.float64),
           (np.uint8, np.uint16), (np.int8, np.float16)]

def test_dtype_promotion_tensors(device: str, rng: np.random.Generator) -> None:
  """Two tensors promote like numpy 2 arrays (every pair in one kernel)."""
  arrays, cases = [], {}
  for da, db in (PROMOTE if device == "CPU" else PROMOTE[1:4]):
    arrays += [randi(rng, 2, 3, lo=0, hi=5).astype(da), randi(rng, 3, lo=0, hi=5).astype(db)]
    i, j, tag = len(arrays) - 2, len(arrays) - 1, f"{np.dtype(da).name}+{np.dtype(db).name}"
    cases[f"{tag} add"] = (lambda *ts, i=i, j=j: ts[i] + ts[j], lambda *a, i=i, j=j: a[i] + a[j])
    cases[f"{tag} mul"] = (lambda *ts, i=i, j=j: ts[i] * ts[j], lambda *a, i=i, j=j: a[i] * a[j])
    cases[f"{tag} max"] = (lambda *ts, i=i, j=j: ts[j].maximum(ts[i]), lambda *a, i=i, j=j: np.maximum(a[j], a[i]))
    ints = all(np.dtype(d).kind in "biu" for d in (da, db))  # numpy divides ints in float64, tilecraft in default_float
    cases[f"{tag} div"] = (lambda *ts, i=i, j=j: ts[i] / (ts[j] + 1), lambda *a, i=i, j=j: a[i] / (a[j] + 1), dtypes.default_float if ints else None)
  check_many(cases, *arrays, device=device, rtol=1e-3)

SCALARS = [(np.int8, 3), (np.uint8, 7), (np.int32, -2), (np.int64, 2**40), (np.float16, 1.5), (np.float32, 2), (np.bool_, True),
           (np.float32, True), (np.int16, 2.5), (np.bool_, 4), (np.bool_, 0.5), (np.uint32, 2**31), (np.float64, 3)]

def test_dtype_promotion_python_scalars(device: str, rng: np.random.Generator) -> None:
  """Python scalars are weak (NEP 50): they take the tensor's dtype when their kind fits it; otherwise the
  result is default_int/default_float (numpy: int64/float64)."""
  arrays, cases = [], {}
  for dt, scalar in SCALARS:
    arrays.append(randi(rng, 2, 3, lo=0, hi=4).astype(dt))
    i, a = len(arrays) - 1, arrays[-1]
    want = np.result_type(a, scalar)
    if want == np.float64 and dt != np.float64: want = np.dtype(np.float32)
    if want == np.int64 and dt != np.int64: want = np.dtype(np.int32)
    tag = f"{np.dtype(dt).name}~{scalar!r}"
    cases[f"{tag} add"] = (lambda *ts, i=i, s=scalar: ts[i] + s, lambda *a, i=i, s=scalar: a[i] + s, want)
    cases[f"{tag} rmul"] = (lambda *ts, i=i, s=scalar: s * ts[i], lambda *a, i=i, s=scalar: s * a[i], want)
    cases[f"{tag} lt"] = (lambda *ts, i=i, s=scalar: ts[i] < s, lambda *a, i=i, s=scalar: a[i] < s)
  check_many(cases, *arrays, device=device, rtol=1e-3)

def test_python_int_out_of_range(device: str) -> None:
  a = np.array([0, 7, 255], np.uint8)
  t = Tensor(a, device=device)
  with pytest.raises(OverflowError, match="300"): t + 300
  with pytest.raises(OverflowError, match="-1"): t * -1
  with pytest.raises(OverflowError, match="128"): Tensor(np.array([1], np.int8)) + 128
  # comparisons widen instead, like numpy
  check_many({"lt300": (lambda x: x < 300, lambda x: x < 300), "ne-1": (lambda x: x != -1, lambda x: x != -1),
              "gt-5": (lambda x: x > -5, lambda x: x > -5), "eq256": (lambda x: x == 256, lambda x: x == 256),
              "ge-1": (lambda x: x >= -1, lambda x: x >= -1)}, a, device=device)

def test_reverse_ops_with_scalars(device: str, rng: np.random.Generator) -> None:
  a = randf(rng, 4, 3, lo=0.5, hi=3)
  check_many({"rsub": (lambda x: 2 - x, lambda x: 2 - x), "rdiv": (lambda x: 3 / x, lambda x: 3 / x), "rpow": (lambda x: 2.0 ** x, lambda x: 2.0 ** x),
              "rfloordiv": (lambda x: 7 // x, lambda x: 7 // x), "rmod": (lambda x: 5.5 % x, lambda x: 5.5 % x),
              "radd_int": (lambda x: 3 + x, lambda x: 3 + x)}, a, device=device, atol=1e-5)

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

def test_where(device: str, rng: np.random.Generator) -> None:
  c, a, b, i = rng.random((3, 1)) > 0.5, randf(rng, 3, 4), randf(rng, 4), randi(rng, 3, 4)
  check_many({
    "tensors": (lambda p, x, y, n: p.where(x, y), lambda p, x, y, n: np.where(p, x, y)),
    "scalar y": (lambda p, x, y, n: p.where(x, 0.5), lambda p, x, y, n: np.where(p, x, F32(0.5))),
    "scalar x": (lambda p, x, y, n: p.where(2, y), lambda p, x, y, n: np.where(p, F32(2), y)),
    "int, -1": (lambda p, x, y, n: p.where(n, -1), lambda p, x, y, n: np.where(p, n, np.int32(-1))),
    "1, 2.5": (lambda p, x, y, n: p.where(1, 2.5), lambda p, x, y, n: np.where(p, 1, 2.5), dtypes.default_float),
    "1, 2": (lambda p, x, y, n: p.where(1, 2), lambda p, x, y, n: np.where(p, 1, 2), dtypes.default_int),
    "int cond": (lambda p, x, y, n: n.where(y, 7.0), lambda p, x, y, n: np.where(n != 0, y, F32(7))),
    "int|float": (lambda p, x, y, n: p.where(n, x), lambda p, x, y, n: np.where(p, n, x)),  # int32 and float32 promote to float64
  }, c, a, b, i, device=device)

def test_maximum_minimum_extremes(device: str) -> None:
  imin, imax = -2**31, 2**31 - 1
  a = np.array([imin, imax, 0, -1, imin, 5], np.int32)
  b = np.array([0, imin, imax, imin, imin, -5], np.int32)
  f = np.array([np.nan, 1.0, -np.inf, np.inf, 0.0, 2.0], F32)
  g = np.array([1.0, np.nan, 0.0, np.nan, -np.inf, 2.0], F32)
  u = np.array([0, 255, 3, 7, 0, 1], np.uint8)
  check_many({"imax": (lambda a, b, f, g, u: a.maximum(b), lambda a, b, f, g, u: np.maximum(a, b)),
              "imin": (lambda a, b, f, g, u: a.minimum(b), lambda a, b, f, g, u: np.minimum(a, b)),
              "fmax": (lambda a, b, f, g, u: f.maximum(g), lambda a, b, f, g, u: np.maximum(f, g)),
              "fmin": (lambda a, b, f, g, u: f.minimum(g), lambda a, b, f, g, u: np.minimum(f, g)),
              "umin": (lambda a, b, f, g, u: u.minimum(u.flip(1)), lambda a, b, f, g, u: np.minimum(u, u[::-1])),
              "clip": (lambda a, b, f, g, u: f.clip(-1, 1.5), lambda a, b, f, g, u: np.clip(f, F32(-1), F32(1.5)))}, a, b, f, g, u, device=device)

CASTS = [(np.float32, np.int32), (np.float32, np.uint8), (np.int32, np.float32), (np.int32, np.int8), (np.float32, np.bool_),
         (np.int64, np.float16), (np.uint8, np.int64), (np.float32, np.float64), (np.float64, np.float16), (np.int32, np.bool_),
         (np.int32, np.uint16), (np.float16, np.int16), (np.bool_, np.float32)]

def test_cast(device: str, rng: np.random.Generator) -> None:
  arrays, cases = [], {}
  for src, dst in CASTS:
    x = rng.uniform(-100, 100, (3, 7)).astype(src) if src not in (np.uint8, np.bool_) else rng.integers(0, 2 if src == np.bool_ else 255, (3, 7)).astype(src)
    x.flat[:2] = 0
    if np.dtype(dst).kind == "u" and x.dtype.kind == "f": x = np.abs(x)  # numpy leaves negative float -> unsigned undefined
    arrays.append(x)
    i = len(arrays) - 1
    cases[f"{np.dtype(src).name}->{np.dtype(dst).name}"] = (lambda *ts, i=i, d=dst: ts[i].cast(dtypes.from_np(np.dtype(d))), lambda *a, i=i, d=dst: a[i].astype(d))
  check_many(cases, *arrays, device=device)

def test_bfloat16(device: str, rng: np.random.Generator) -> None:
  """numpy has no bfloat16: the reference rounds float32 to bfloat16 (to nearest even) with tilecraft.dtype's helpers."""
  from tilecraft.dtype import bf16_bits_from_f32, f32_from_bf16_bits
  def bf16(a: np.ndarray) -> np.ndarray: return np.asarray(f32_from_bf16_bits(bf16_bits_from_f32(np.asarray(a, np.float32))))
  x, y = randf(rng, 3, 5, lo=-50, hi=50), randf(rng, 5)
  t, u = Tensor(x, dtype=dtypes.bfloat16, device=device), Tensor(y, dtype=dtypes.bfloat16, device=device)
  np.testing.assert_array_equal(t.numpy(), bf16(x))  # the round trip (no kernel)
  got = (t * u + 1).numpy()  # computed in float32 (maybe fused), stored as bfloat16: within one bfloat16 step
  np.testing.assert_allclose(got, bf16(bf16(x) * bf16(y) + 1), rtol=2 ** -7, atol=0)

def test_bitwise_and_shifts(device: str, rng: np.random.Generator) -> None:
  a, b, p, q = randi(rng, 3, 4, lo=-100, hi=100), randi(rng, 4, lo=0, hi=100), rng.random((3, 4)) > 0.5, rng.random((3, 4)) > 0.3
  check_many({"and": (lambda a, b, p, q: a & b, lambda a, b, p, q: a & b), "or": (lambda a, b, p, q: a | b, lambda a, b, p, q: a | b),
              "xor": (lambda a, b, p, q: a ^ b, lambda a, b, p, q: a ^ b), "invert": (lambda a, b, p, q: ~a, lambda a, b, p, q: ~a),
              "shl": (lambda a, b, p, q: a << 3, lambda a, b, p, q: a << 3), "shr": (lambda a, b, p, q: a >> 2, lambda a, b, p, q: a >> 2),
              "bool ops": (lambda a, b, p, q: (~p) ^ (p & q) | q, lambda a, b, p, q: (~p) ^ (p & q) | q)}, a, b, p, q, device=device)

@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.float64, dtypes.bfloat16], ids=str)
def test_float_dtypes_are_kept(dt: Any) -> None:
  """Every float op of a float16/float64/bfloat16 tensor stays in that dtype (python scalars are weak); no kernels run."""
  a, b = Tensor([2.0, -3.0, 0.0], dtype=dt), Tensor([0.5, 2.0, -1.0], dtype=dt)
  for name, r in {"pow": a ** b, "floordiv": a // b, "mod": a % b, "div": a / b, "sq": a ** 2, "pow2.5": a ** 2.5, "//2": a // 2, "%2.5": a % 2.5,
                  "round": a.round(), "floor": a.floor(), "ceil": a.ceil(), "where": (a > 0).where(a, 1), "clip": a.clip(-1, 1.5), "relu": a.relu(),
                  "sigmoid": a.sigmoid(), "gelu": a.gelu(), "tanh": a.tanh(), "softmax": a.softmax(), "logsumexp": a.logsumexp(), "layernorm": a.layernorm(),
                  "var": a.var(), "mean": a.mean(), "cumsum": a.cumsum(), "max": a.maximum(1), "min": a.minimum(1), "rsub": 1 - a, "rdiv": 1 / a,
                  "exp": a.exp(), "log": a.log(), "sqrt": a.sqrt(), "sin": a.sin(), "cos": a.cos(), "abs": a.abs(), "neg": -a, "sum": a.sum(),
                  "matmul": a @ b, "argmax": a.argmax().cast(dt)}.items():
    assert r.dtype == dt, f"{name}: {r.dtype} != {dt}"

# ---- reductions --------------------------------------------------------------------------------------

@on_devices("axis", [None, 1, -1, (0, 2), (2, 0, 1)], opencl=[3])
def test_sum_max_min_mean(device: str, rng: np.random.Generator, axis: Any) -> None:
  x = randf(rng, 3, 4, 5)
  for keepdim in (False, True):
    check(lambda t: t.sum(axis, keepdim=keepdim), lambda a: a.sum(axis, keepdims=keepdim), x, device=device, atol=1e-5)
    check(lambda t: t.max(axis, keepdim=keepdim), lambda a: a.max(axis, keepdims=keepdim), x, device=device)
    check(lambda t: t.min(axis, keepdim=keepdim), lambda a: a.min(axis, keepdims=keepdim), x, device=device)
    check(lambda t: t.mean(axis, keepdim=keepdim), lambda a: a.mean(axis, keepdims=keepdim), x, device=device, atol=1e-6)

@on_devices("axis", [None, 1], opencl=[1])
def test_var_std(device: str, rng: np.random.Generator, axis: Any) -> None:
  x = randf(rng, 4, 7)
  check(lambda t: t.var(axis), lambda a: a.var(axis), x, device=device, atol=1e-5)
  check(lambda t: t.std(axis, keepdim=True), lambda a: a.std(axis, keepdims=True), x, device=device, atol=1e-5)
  if device == "CPU": check(lambda t: t.var(axis, correction=1), lambda a: a.var(axis, ddof=1), x, device=device, atol=1e-5)

def test_reduce_dtypes(device: str, rng: np.random.Generator) -> None:
  i = randi(rng, 3, 6)
  check(lambda t: t.sum(1), lambda a: a.sum(1), i, device=device)  # int32 sums in int64
  check(lambda t: t.min(1), lambda a: a.min(1), np.array([[-2**31, 5], [2**31 - 1, -1]], np.int32), device=device)
  if device == "CPU":
    check(lambda t: t.mean(1), lambda a: a.mean(1), i, device=device, dtype=dtypes.default_float)
    check(lambda t: t.sum(), lambda a: a.sum(), i.astype(np.uint8), device=device)  # uint64
    check(lambda t: t.sum(0), lambda a: a.sum(0), i > 0, device=device)  # bool counts
    check(lambda t: t.max(0), lambda a: a.max(0), i.astype(np.int8), device=device)
    check(lambda t: t.min(1), lambda a: a.min(1), i.astype(np.uint16), device=device)
    check(lambda t: t.max(1), lambda a: a.max(1), i > 3, device=device)
    check(lambda t: t.min(1), lambda a: a.min(1), i > 3, device=device)
    check(lambda t: t.sum(1, dtype=dtypes.float32), lambda a: a.sum(1, dtype=np.float32), i, device=device)

def test_reduce_nan_inf(device: str) -> None:
  x = np.array([[1.0, np.nan, 3.0], [np.inf, -np.inf, 0.0], [-np.inf, -np.inf, -np.inf], [2.0, 2.0, 1.0]], F32)
  check(lambda t: t.max(1), lambda a: a.max(1), x, device=device)
  if device == "CPU":
    check(lambda t: t.argmax(1), lambda a: a.argmax(1), x, device=device)
    check(lambda t: t.sum(1), lambda a: a.sum(1), x, device=device)
    check(lambda t: t.min(0), lambda a: a.min(0), x, device=device)
    check(lambda t: t.argmin(1), lambda a: a.argmin(1), x, device=device)

@on_devices("shape,axis", [((3, 5), 1), ((4,), 0), ((2, 3, 4), 1)], opencl=[0])
def test_argmax_argmin(device: str, rng: np.random.Generator, shape: tuple, axis: int) -> None:
  x = randi(rng, *shape, lo=-3, hi=3)  # small ints: many ties, the first index wins
  check(lambda t: t.argmax(axis), lambda a: a.argmax(axis), x, device=device)
  if device == "CPU": check(lambda t: t.argmin(axis, keepdim=True), lambda a: a.argmin(axis, keepdims=True), x.astype(F32), device=device)
  if device == "CPU" and len(shape) == 3: check(lambda t: t.argmax(), lambda a: a.argmax(), x, device=device)

def _np_softmax(x: np.ndarray, axis: int) -> np.ndarray:
  e = np.exp(x - x.max(axis, keepdims=True))
  return e / e.sum(axis, keepdims=True)

@on_devices("axis", [-1, 0], opencl=[0])
def test_softmax_family(device: str, rng: np.random.Generator, axis: int) -> None:
  x = randf(rng, 4, 7, lo=-20, hi=20)
  check(lambda t: t.softmax(axis), lambda a: _np_softmax(a, axis), x, device=device, atol=1e-6)
  if axis == 0: return
  check(lambda t: t.logsumexp(axis, keepdim=True), lambda a: np.log(np.exp(a.astype(np.float64)).sum(axis, keepdims=True)).astype(F32), x, device=device, atol=1e-5)
  if device == "CPU":
    check(lambda t: t.log_softmax(axis), lambda a: np.log(_np_softmax(a.astype(np.float64), axis)).astype(F32), x, device=device, atol=1e-5)
    check(lambda t: t.logsumexp(), lambda a: np.log(np.exp(a.astype(np.float64)).sum()).astype(F32), x, device=device, atol=1e-5)

def test_softmax_extremes() -> None:
  x = np.array([[1000.0, 0.0, -1000.0], [-np.inf, 0.0, 1.0], [-np.inf, -np.inf, -np.inf], [5.0, 5.0, 5.0]], F32)
  check(lambda t: t.softmax(), lambda a: _np_softmax(a, -1), x, atol=1e-6)
  check(lambda t: t.logsumexp(1), lambda a: np.array([1000.0, np.log(np.e + 1), -np.inf, 5 + np.log(3)], F32), x, atol=1e-5)

@on_devices("shape,axis", [((7,), 0), ((3, 5), 1), ((2, 3, 4), 0), ((1, 1), 0), ((0, 3), 1), ((3, 0), 1)], opencl=[1, 4])
def test_cumsum(device: str, rng: np.random.Generator, shape: tuple, axis: int) -> None:
  check(lambda t: t.cumsum(axis), lambda a: a.cumsum(axis), randf(rng, *shape), device=device, atol=1e-5)
  if device == "CPU" and shape == (3, 5): check(lambda t: t.cumsum(axis), lambda a: a.cumsum(axis), randi(rng, *shape), device=device)

@on_devices("shape,axis", [((33,), 0), ((1025,), 0), ((3, 100), 1), ((70, 2), 0), ((40000,), 0)], opencl=[1, 2])
def test_cumsum_long_rows_are_blocked(device: str, rng: np.random.Generator, shape: tuple, axis: int) -> None:
  """Rows longer than one block (32) run blocked, one or more levels deep (1025: 2 levels, 40000: 3)."""
  x = randf(rng, *shape)
  got = Tensor(x, device=device).cumsum(axis).numpy()
  want = np.cumsum(x.astype(np.float64), axis)
  np.testing.assert_allclose(got, want, atol=1e-5 * np.abs(x).sum(axis, keepdims=True).max(), rtol=1e-5)
  xi = randi(rng, *shape, dt=np.int64) * (1 << 40)  # exact in int64, and past 32 bits
  np.testing.assert_array_equal(Tensor(xi, device=device).cumsum(axis).numpy(), np.cumsum(xi, axis))

def test_cumsum_long_row_is_not_quadratic() -> None:
  """A million-element running sum: O(n^2) work would take minutes; blocked it is a few kernels."""
  x = np.ones(1 << 20, dtype=np.int32)
  t = Tensor(x).cumsum()
  kernels = [si for si in t.schedule() if si.ast.op is MetaOps.KERNEL]
  assert len(kernels) <= 16
  # no kernel sums a window longer than one block
  for si in kernels:
    for r in (x for x in si.ast.lazyops if x.op in ReduceOps):
      src = r.src[0]
      shape = next(y.arg.st.shape for y in src.lazyops if y.op is BufferOps.LOAD or y.op is BufferOps.CONST)
      assert max(shape[a] for a in r.arg) <= 32, (si.ast, r.arg)
  np.testing.assert_array_equal(t.numpy(), np.arange(1, (1 << 20) + 1))

@pytest.mark.parametrize("shape", [(0, 4), (4, 0), (0,), (2, 0, 3)], ids=str)
def test_reduce_zero_size(shape: tuple) -> None:
  """Reductions over empty axes give numpy's identities (0, nan for mean); max/min of one can't."""
  device, x = "CPU", np.zeros(shape, F32)
  for axis in [None] + list(range(len(shape))):
    check(lambda t: t.sum(axis), lambda a: a.sum(axis), x, device=device)
    check(lambda t: t.mean(axis, keepdim=True), lambda a: a.mean(axis, keepdims=True), x, device=device)
    if all(shape[a] != 0 for a in ([axis] if axis is not None else range(len(shape)))):
      check(lambda t: t.max(axis), lambda a: a.max(axis), x, device=device)
    else:
      with pytest.raises(ValueError, match="empty"): Tensor(x, device=device).max(axis)

def test_reduce_axis_errors() -> None:
  t = Tensor.ones(2, 3)
  with pytest.raises(IndexError, match="axis 2 is out of range"): t.sum(2)
  with pytest.raises(IndexError, match="axis -3"): t.max(-3)
  with pytest.raises(ValueError, match="repeated axis"): t.sum((0, 0))
  with pytest.raises(IndexError, match="axis 5"): t.softmax(5)
  with pytest.raises(IndexError, match="axis 2"): t.argmax(2)
  with pytest.raises(IndexError, match="axis 3"): t.cumsum(3)

# ---- movement and indexing -----------------------------------------------------------------------------

def test_reshape_permute_transpose_expand(device: str, rng: np.random.Generator) -> None:
  x = randf(rng, 2, 3, 4)
  check(lambda t: t.reshape(4, 6).permute(1, 0)[1::2], lambda a: a.reshape(4, 6).T[1::2], x, device=device)
  check(lambda t: t.permute(2, 0, 1).reshape(-1, 3).transpose()[:, 3:7] + t.reshape(2, 1, 3, 4).expand(2, 5, 3, 4)[1, 2],
        lambda a: a.transpose(2, 0, 1).reshape(-1, 3).T[:, 3:7] + np.broadcast_to(a.reshape(2, 1, 3, 4), (2, 5, 3, 4))[1, 2], x, device=device)
  if device == "CPU":
    check(lambda t: t.reshape(24), lambda a: a.reshape(24), x, device=device)
    check(lambda t: t.transpose(0, 2), lambda a: a.swapaxes(0, 2), x, device=device)
    check(lambda t: t.T, lambda a: a.T, x, device=device)
    check(lambda t: t[:, :1].expand(-1, 3, -1), lambda a: np.broadcast_to(a[:, :1], (2, 3, 4)), x, device=device)
    check(lambda t: t[0, 0].expand(3, 4), lambda a: np.broadcast_to(a[0, 0], (3, 4)), x, device=device)
    check(lambda t: t.flatten(1), lambda a: a.reshape(2, 12), x, device=device)
    check(lambda t: t[:1].squeeze(0).unsqueeze(-1), lambda a: a[0][..., None], x, device=device)

def test_movement_errors() -> None:
  t = Tensor.ones(2, 3)
  with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 2\)"): t.reshape(4, 2)
  with pytest.raises(ValueError, match=r"-1"): t.reshape(-1, -1)
  with pytest.raises(ValueError, match="permutation"): t.permute(0, 0)
  with pytest.raises(IndexError, match="axis 5"): t.transpose(0, 5)
  with pytest.raises(ValueError, match="pairs"): t.pad(((1, 1),))
  with pytest.raises(ValueError, match="out of range"): t.shrink(((0, 3), (0, 3)))
  with pytest.raises(IndexError, match="axis 2"): t.flip(2)

def test_pad_shrink_flip(device: str, rng: np.random.Generator) -> None:
  x = randf(rng, 3, 5)
  check(lambda t: t.pad(((2, 0), (1, 1)), value=-1.5), lambda a: np.pad(a, ((2, 0), (1, 1)), constant_values=-1.5), x, device=device)
  check(lambda t: t.flip(-1).pad(((0, 0), (1, 0))).shrink(((1, 3), (0, 3))), lambda a: np.pad(a[:, ::-1], ((0, 0), (1, 0)))[1:3, 0:3], x, device=device)
  check(lambda t: t.pad(((1, 0), (0, 0))), lambda a: np.pad(a, ((1, 0), (0, 0))), np.zeros((0, 2), F32), device=device)
  if device == "CPU":
    check(lambda t: t.pad(((1, 2), (0, 3))), lambda a: np.pad(a, ((1, 2), (0, 3))), x, device=device)
    check(lambda t: t.pad(((-1, 1), (2, -2))), lambda a: np.pad(a[1:, :-2], ((0, 1), (2, 0))), x, device=device)
    check(lambda t: t.shrink(((1, 3), (0, 4))), lambda a: a[1:3, 0:4], x, device=device)
    check(lambda t: t.shrink((None, (2, 5))), lambda a: a[:, 2:5], x, device=device)
    check(lambda t: t.flip((0, 1)), lambda a: a[::-1, ::-1], x, device=device)
    check(lambda t: t.pad(((1, 1), (1, 1)), value=7), lambda a: np.pad(a, 1, constant_values=7), randi(rng, 3, 5), device=device)

INDICES = [1, -1, (1, 2), (slice(None), 3), slice(None, None, 2), slice(None, None, -1), (slice(4, 0, -2), slice(None, None, 3)),
           (Ellipsis, 1), (None, 0), (1, None, slice(2, 4)), (slice(-3, -1), Ellipsis, slice(None, None, -3)), (slice(10, 20),),
           (slice(2, 2),), (-2, Ellipsis, -1), (None, Ellipsis, None), (slice(None), slice(None), slice(1, None, 2))]

@on_devices("idx", INDICES, opencl=[6, 10])
def test_getitem(device: str, rng: np.random.Generator, idx: Any) -> None:
  check(lambda t: t[idx], lambda a: a[idx], randf(rng, 5, 4, 6), device=device)

def test_getitem_errors() -> None:
  t = Tensor(np.zeros((3, 4), F32))
  with pytest.raises(IndexError, match="out of bounds"): t[3]
  with pytest.raises(IndexError, match="out of bounds"): t[0, -5]
  with pytest.raises(IndexError, match="too many"): t[0, 0, 0]
  with pytest.raises(IndexError, match="ellipsis"): t[..., 0, ...]
  with pytest.raises(TypeError): t["a"]

@on_devices("axis", [0, 1, -1], opencl=[1])
def test_cat_stack(device: str, rng: np.random.Generator, axis: int) -> None:
  a, b, c = randf(rng, 2, 3), randf(rng, 2, 3), randf(rng, 2, 3)
  check(lambda x, y, z: Tensor.cat(x, y, z, axis=axis), lambda x, y, z: np.concatenate([x, y, z], axis), a, b, c, device=device)
  check(lambda x, y: Tensor.stack(x, y, axis=axis), lambda x, y: np.stack([x, y], axis), a, b, device=device)

def test_cat_odd_sizes_and_dtypes(rng: np.random.Generator) -> None:
  a, b, e = randf(rng, 1, 4), randi(rng, 3, 4), np.zeros((0, 4), F32)
  check(lambda x, y, z: Tensor.cat(x, y, z), lambda x, y, z: np.concatenate([x, y, z]), a, b, e, dtype=np.float64)
  check(lambda x, y: x.cat_(y, axis=1), lambda x, y: np.concatenate([x, y], 1), b[:1], a, dtype=np.float64)
  check(lambda x: Tensor.stack(x), lambda x: np.stack([x]), a)
  with pytest.raises(ValueError, match="differ"): Tensor.cat(Tensor(a), Tensor(randf(rng, 2, 3)))

# ---- matmul, conv, pooling, layernorm ---------------------------------------------------------------------

MATMUL = [((3, 5), (5, 4)), ((5,), (5, 4)), ((3, 5), (5,)), ((7,), (7,)), ((2, 3, 5), (2, 5, 4)), ((2, 3, 5), (5, 4)), ((3, 5), (2, 5, 4)),
          ((2, 1, 3, 5), (4, 5, 2)), ((5,), (2, 5, 3)), ((1, 1), (1, 1)), ((3, 0), (0, 2)), ((0, 3), (3, 2))]

@on_devices("sa,sb", MATMUL, opencl=[0, 7, 10])
def test_matmul(device: str, rng: np.random.Generator, sa: tuple, sb: tuple) -> None:
  a, b = randf(rng, *sa), randf(rng, *sb)
  check(lambda x, y: x @ y, np.matmul, a, b, device=device, atol=1e-5, rtol=1e-5)
  if len(sa) <= 2 and len(sb) <= 2 and device == "CPU": check(lambda x, y: x.dot(y), np.dot, a, b, device=device, atol=1e-5)

def test_matmul_dtypes(rng: np.random.Generator) -> None:
  a, b = randi(rng, 3, 4), randi(rng, 4, 2)
  check(lambda x, y: x @ y, np.matmul, a, b)
  check(lambda x, y: x @ y, np.matmul, a.astype(np.int16), b.astype(np.int8))
  check(lambda x, y: x @ y, np.matmul, a, b.astype(F32), dtype=np.float64)
  check(lambda x, y: x.matmul(y), np.matmul, a.astype(np.float16), b.astype(np.float16), rtol=1e-2, atol=1e-1)

def test_matmul_errors() -> None:
  with pytest.raises(ValueError, match=r"\(2, 3\) and \(4, 2\)"): Tensor.ones(2, 3) @ Tensor.ones(4, 2)
  with pytest.raises(ValueError, match=r"\(2, 2, 3\) and \(3, 3, 2\)"): Tensor.ones(2, 2, 3) @ Tensor.ones(3, 3, 2)
  with pytest.raises(ValueError, match="at least 1 dimension"): Tensor.ones(3) @ Tensor(2.0)
  with pytest.raises(ValueError, match=r"\(4,\)"): Tensor.ones(3).dot(Tensor.ones(4))

def _pair(x: Any) -> tuple[int, int]: return (x, x) if isinstance(x, int) else tuple(x)

def np_conv2d(x: np.ndarray, w: np.ndarray, b: Optional[np.ndarray] = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1) -> np.ndarray:
  """Direct convolution (cross-correlation, NCHW), written out window by window."""
  (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
  x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
  n, cin, h, wd = x.shape
  cout, cpg, kh, kw = w.shape
  oh, ow = (h - dh * (kh - 1) - 1) // sh + 1, (wd - dw * (kw - 1) - 1) // sw + 1
  out = np.zeros((n, cout, oh, ow))
  opg = cout // groups
  for oc in range(cout):
    g = oc // opg
    for i in range(oh):
      for j in range(ow):
        patch = x[:, g * cpg:(g + 1) * cpg, i * sh:i * sh + dh * (kh - 1) + 1:dh, j * sw:j * sw + dw * (kw - 1) + 1:dw]
        out[:, oc, i, j] = (patch * w[oc]).sum((1, 2, 3))
  if b is not None: out += b.reshape(1, -1, 1, 1)
  return out.astype(F32)

CONVS = [  # (x shape, w shape, stride, padding, dilation, groups)
  ((1, 1, 5, 5), (1, 1, 3, 3), 1, 0, 1, 1), ((2, 3, 7, 6), (4, 3, 3, 2), 1, 0, 1, 1), ((2, 3, 7, 7), (4, 3, 3, 3), 2, 1, 1, 1),
  ((1, 2, 9, 8), (3, 2, 3, 3), 1, 2, 2, 1), ((2, 4, 6, 6), (6, 2, 3, 3), 1, 1, 1, 2), ((1, 4, 5, 5), (4, 1, 3, 3), (2, 1), (1, 0), 1, 4),
  ((1, 3, 4, 5), (2, 3, 1, 1), 1, 0, 1, 1), ((1, 1, 3, 3), (1, 1, 3, 3), 1, 0, 1, 1), ((2, 2, 8, 5), (2, 2, 2, 3), (3, 2), (0, 1), (2, 1), 1)]

@on_devices("xs,ws,stride,padding,dilation,groups", CONVS, opencl=[8, 4])
def test_conv2d(device: str, rng: np.random.Generator, xs: tuple, ws: tuple, stride: Any, padding: Any, dilation: Any, groups: int) -> None:
  x, w, b = randf(rng, *xs), randf(rng, *ws), randf(rng, ws[0])
  check(lambda p, q, r: p.conv2d(q, r, stride=stride, padding=padding, dilation=dilation, groups=groups),
        lambda p, q, r: np_conv2d(p, q, r, stride, padding, dilation, groups), x, w, b, device=device, atol=1e-4, rtol=1e-5)

def test_conv2d_errors() -> None:
  x, w = Tensor.ones(1, 3, 5, 5), Tensor.ones(2, 2, 3, 3)
  with pytest.raises(ValueError, match="channels"): x.conv2d(w)
  with pytest.raises(ValueError, match="4-D"): Tensor.ones(3, 5, 5).conv2d(w)
  with pytest.raises(ValueError, match="larger"): Tensor.ones(1, 2, 2, 2).conv2d(w)

def np_pool(x: np.ndarray, k: Any, stride: Any, padding: Any, dilation: Any, op: str) -> np.ndarray:
  (kh, kw), (sh, sw), (ph, pw), (dh, dw) = _pair(k), _pair(stride), _pair(padding), _pair(dilation)
  fill = -np.inf if op == "max" else 0.0
  x = np.pad(x, ((0, 0),) * (x.ndim - 2) + ((ph, ph), (pw, pw)), constant_values=fill)
  h, w = x.shape[-2:]
  oh, ow = (h - dh * (kh - 1) - 1) // sh + 1, (w - dw * (kw - 1) - 1) // sw + 1
  out = np.zeros(x.shape[:-2] + (oh, ow), x.dtype)
  for i in range(oh):
    for j in range(ow):
      win = x[..., i * sh:i * sh + dh * (kh - 1) + 1:dh, j * sw:j * sw + dw * (kw - 1) + 1:dw]
      out[..., i, j] = win.max((-2, -1)) if op == "max" else win.mean((-2, -1))  # avg counts the padding (count_include_pad)
  return out

POOLS = [((1, 1, 4, 4), 2, None, 0, 1), ((2, 3, 7, 5), 3, 2, 1, 1), ((1, 2, 6, 6), (2, 3), (1, 2), 0, 1), ((1, 1, 9, 9), 3, 1, 1, 2),
         ((3, 5, 5), 2, 1, 0, 1), ((1, 1, 3, 3), 3, None, 0, 1)]

@on_devices("xs,k,stride,padding,dilation", POOLS, opencl=[1])
def test_pools(device: str, rng: np.random.Generator, xs: tuple, k: Any, stride: Any, padding: Any, dilation: Any) -> None:
  x = randf(rng, *xs)
  st = stride if stride is not None else k
  check(lambda t: t.max_pool2d(k, stride, padding, dilation), lambda a: np_pool(a, k, st, padding, dilation, "max"), x, device=device)
  if dilation == 1:
    check(lambda t: t.avg_pool2d(k, stride, padding), lambda a: np_pool(a, k, st, padding, 1, "avg"), x, device=device, atol=1e-6)

def test_max_pool_ints(rng: np.random.Generator) -> None:
  x = randi(rng, 1, 2, 5, 5)
  check(lambda t: t.max_pool2d(2, 1, 1), lambda a: np_pool(a.astype(np.float64), 2, 1, 1, 1, "max").astype(np.int32), x)

@on_devices("shape,axis", [((4, 7), -1), ((2, 3, 5), (1, 2)), ((1, 9), 1), ((3, 1), -1)], opencl=[1])
def test_layernorm(device: str, rng: np.random.Generator, shape: tuple, axis: Any) -> None:
  x = randf(rng, *shape, lo=-5, hi=5) + 3
  eps = 1e-5 if shape != (1, 9) else 1e-2
  def ref(a: np.ndarray) -> np.ndarray:
    a64 = a.astype(np.float64)
    return ((a64 - a64.mean(axis, keepdims=True)) / np.sqrt(a64.var(axis, keepdims=True) + eps)).astype(F32)
  check(lambda t: t.layernorm(axis, eps=eps), ref, x, device=device, atol=1e-4)

# ---- zero-size tensors through everything -----------------------------------------------------------------

def test_zero_size_through_every_op(device: str) -> None:
  """Zero-element tensors come out with numpy's shapes (and identities), without kernels."""
  z, x4 = np.zeros((0, 5), F32), np.zeros((0, 2, 5, 5), F32)
  w = np.ones((3, 2, 3, 3), F32)
  for f_t, f_np in [(lambda t: t.softmax(1), lambda a: a), (lambda t: t.layernorm(), lambda a: a), (lambda t: t.argmax(1), lambda a: a.argmax(1)),
                    (lambda t: t.logsumexp(1), lambda a: a.sum(1)), (lambda t: t.var(1), lambda a: a.var(1)), (lambda t: t.cumsum(1), lambda a: a.cumsum(1)),
                    (lambda t: t[::-1, 1:3], lambda a: a[::-1, 1:3]), (lambda t: t.flip(0).T, lambda a: a[::-1].T), (lambda t: t.expand(2, 0, 5), lambda a: np.broadcast_to(a, (2, 0, 5))),
                    (lambda t: Tensor.stack(t, t, axis=1), lambda a: np.stack([a, a], 1)), (lambda t: (t < 1).where(t, 2.0), lambda a: np.where(a < 1, a, F32(2))),
                    (lambda t: t.sum(0), lambda a: a.sum(0)), (lambda t: t.max(1), lambda a: a.max(1)), (lambda t: t.reshape(5, 0, 3), lambda a: a.reshape(5, 0, 3)),
                    (lambda t: t @ Tensor.ones(5, 2, device=t.device), lambda a: a @ np.ones((5, 2), F32)), (lambda t: t.pad(((1, 1), (0, 0)), value=2.0), lambda a: np.pad(a, ((1, 1), (0, 0)), constant_values=2))]:
    check(f_t, f_np, z, device=device)
  check(lambda t, q: t.conv2d(q, padding=1), lambda a, q: np_conv2d(a, q, None, 1, 1), x4, w, device=device)
  check(lambda t: t.max_pool2d(2), lambda a: np_pool(a, 2, 2, 0, 1, "max"), x4, device=device)
  check(lambda t: t.avg_pool2d(3, 1, 1), lambda a: np_pool(a, 3, 1, 1, 1, "avg"), x4, device=device)

# ---- optimizations off: the same answers ---------------------------------------------------------------

def test_noopt_gives_the_same_results(device: str, rng: np.random.Generator) -> None:
  x, w = randf(rng, 6, 9), randf(rng, 9, 5)
  def f(p: Tensor, q: Tensor) -> Tensor: return (p @ q).relu().sum(0)
  with Context(NOOPT=1): a = check(f, lambda p, q: np.maximum(p @ q, 0).sum(0), x, w, device=device, atol=1e-4)
  b = check(f, lambda p, q: np.maximum(p @ q, 0).sum(0), x, w, device=device, atol=1e-4)
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)

# ---- bigger sweeps (slow tier) ---------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("shape", [(17, 33), (64, 129), (3, 1000), (257,)], ids=str)
def test_larger_shapes(device: str, rng: np.random.Generator, shape: tuple) -> None:
  x = randf(rng, *shape)
  check(lambda t: (t * 2 + 1).relu().sum(-1), lambda a: np.maximum(a * 2 + 1, 0).sum(-1), x, device=device, atol=1e-3, rtol=1e-5)
  check(lambda t: t.softmax(-1), lambda a: _np_softmax(a, -1), x, device=device, atol=1e-6)
  check(lambda t: t.flip(-1).cumsum(-1), lambda a: a[..., ::-1].cumsum(-1), x[..., :40], device=device, atol=1e-4)

@pytest.mark.slow
def test_larger_matmul_conv(device: str, rng: np.random.Generator) -> None:
  a, b = randf(rng, 65, 130), randf(rng, 130, 33)
  check(lambda x, y: x @ y, np.matmul, a, b, device=device, atol=1e-3, rtol=1e-4)
  x, w = randf(rng, 2, 8, 17, 15), randf(rng, 16, 4, 3, 3)
  check(lambda p, q: p.conv2d(q, stride=2, padding=1, groups=2), lambda p, q: np_conv2d(p, q, None, 2, 1, 1, 2), x, w, device=device, atol=1e-3)

@pytest.mark.slow
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_each_all_devices(device: str, name: str, rng: np.random.Generator) -> None:
  f_t, f_np = UNARY[name]
  check(f_t, f_np, randf(rng, 5, 9, lo=0.1 if name in ("log", "log2", "sqrt") else -4, hi=4), device=device, atol=1e-5, rtol=2e-5)

@pytest.mark.slow
@pytest.mark.parametrize("idx", INDICES, ids=str)
@pytest.mark.opencl
def test_getitem_opencl_all(idx: Any) -> None:
  check(lambda t: t[idx], lambda a: a[idx], np.arange(120, dtype=F32).reshape(5, 4, 6), device="OPENCL")

# ---- integer division by -1 in a kernel, alone (a trap would kill the process) ------------------------------

_INT_MIN_DIV = """
import numpy as np
from tilecraft.dtype import dtypes
from tilecraft.device import Buffer
from tilecraft.ops import BinaryOps, BufferOps, LazyOp, MemBuffer, MetaOps
from tilecraft.shape.shapetracker import ShapeTracker
from tilecraft.engine.schedule import ScheduleItem
from tilecraft.engine.realize import run_schedule
st = ShapeTracker.from_shape((2,))
ld = lambda i: LazyOp(BufferOps.LOAD, (), MemBuffer(i, dtypes.int32, st))
ast = LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (LazyOp(BinaryOps.{op}, (ld(1), ld(2))),), MemBuffer(0, dtypes.int32, st)),))
out, a, b = Buffer("CPU", 2, dtypes.int32), Buffer("CPU", 2, dtypes.int32), Buffer("CPU", 2, dtypes.int32)
a.copyin(np.array([-2**31, 7], np.int32)); b.copyin(np.array([-1, 2], np.int32))
run_schedule([ScheduleItem(ast, (out, a, b))])
print(out.numpy().tolist())
"""

@pytest.mark.parametrize("op,want", [("IDIV", [-2**31, 3]), ("MOD", [0, 1])])
def test_kernel_int_min_div_by_minus_one(op: str, want: list) -> None:
  """MIN // -1 is C signed overflow, which traps (SIGFPE) on x86: the kernel must wrap like numpy instead.
  Run in a child process so that a regression fails this test rather than killing the test worker."""
  import subprocess, sys
  r = subprocess.run([sys.executable, "-c", _INT_MIN_DIV.format(op=op)], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, f"kernel process died with return code {r.returncode}: {r.stderr[-300:]}"
  assert r.stdout.split("\n")[-2] == str(want)
