"""The core Tensor ops against numpy (DESIGN §8) on CPU and OPENCL: elementwise math with broadcasting
and dtype promotion, NaN/inf, casts, reductions, movement ops, zero-size tensors through every op, on
odd, 1-size and 0-size shapes. The frontend's op families (nn, indexing, cumsum, numpy's division
and power rules) are checked in tests/frontend/, with the same helpers (tests/op_checks.py).

Where the frontend deliberately differs from numpy the expected dtype is given explicitly: values
that become floats (int / int, exp of an int32, mean of ints, a python float with an int tensor) are
`dtypes.default_float` (float32), not float64, and python ints default to int32."""
from __future__ import annotations
import math
from typing import Any
import numpy as np
import pytest
from tilecraft import Context, Tensor, dtypes
from op_checks import F32, check, check_many, np_conv2d, np_pool, _np_softmax, on_devices, randf, randi

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

def test_numpy_operand_on_the_left(device: str) -> None:
  """np.float32(0.5) * t and np.ones(2) + t gave numpy object arrays of 0-d Tensors: they are Tensors,
  with numpy's value and dtype, like 0.5 * t."""
  a = np.array([1.0, -2.5], F32)
  ai = np.array([1, 6], np.int32)
  cases = [(lambda t: np.float32(0.5) * t, lambda x: np.float32(0.5) * x), (lambda t: np.ones(2) + t, lambda x: np.ones(2) + x),
           (lambda t: np.ones(2, F32) - t, lambda x: np.ones(2, F32) - x), (lambda t: np.float32(3) / t, lambda x: np.float32(3) / x),
           (lambda t: np.float32(3) // t, lambda x: np.float32(3) // x), (lambda t: np.float32(3) % t, lambda x: np.float32(3) % x),
           (lambda t: np.float32(2) ** t, lambda x: np.float32(2) ** x), (lambda t: np.ones(2) < t, lambda x: np.ones(2) < x),
           (lambda t: np.ones(2, F32) == t, lambda x: np.ones(2, F32) == x), (lambda t: np.ones((3, 2), F32) @ t, lambda x: np.ones((3, 2), F32) @ x)]
  for f_t, f_np in cases: check(f_t, f_np, a, device=device)
  check(lambda t: np.int32(3) & t, lambda x: np.int32(3) & x, ai, device=device)
  check(lambda t: np.int64(7) - t, lambda x: np.int64(7) - x, ai, device=device)

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

_CHAINS = {"exp": lambda t: t.exp(), "softmax": lambda t: t.softmax(-1), "sigmoid": lambda t: t.sigmoid(), "log": lambda t: t.abs().log(),
           "tanh": lambda t: t.tanh(), "x*y+z": lambda t: t * 1.7 + t * t}

@pytest.mark.parametrize("device", ["CPU", "LLVM", "OPENCL", "PYTHON"])
def test_argmax_of_computed_values(device: str, rng: np.random.Generator) -> None:
  """argmax/argmin of a transcendental chain is always in [0, N) and picks the first extreme of the values
  computed: exp(x).argmax(-1) returned 8 (N) in ~7% of rows on CPU and LLVM, when the row max and the
  compare with it came from two kernels whose exp2 differ in the last bit."""
  rows = 40 if device == "PYTHON" else 1000
  x = rng.standard_normal((rows, 8)).astype(F32)
  for name, f in _CHAINS.items():
    vals = f(Tensor(x, device=device)).numpy()
    for op in ("argmax", "argmin"):
      got = getattr(f(Tensor(x, device=device)), op)(-1).numpy()
      assert ((got >= 0) & (got < 8)).all(), f"{name}.{op}: {int(((got < 0) | (got >= 8)).sum())} rows out of range"
      np.testing.assert_array_equal(got, getattr(np, op)(vals, -1), err_msg=f"{name}.{op}")

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

# ---- movement -----------------------------------------------------------------------------

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
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_each_all_devices(device: str, name: str, rng: np.random.Generator) -> None:
  f_t, f_np = UNARY[name]
  check(f_t, f_np, randf(rng, 5, 9, lo=0.1 if name in ("log", "log2", "sqrt") else -4, hi=4), device=device, atol=1e-5, rtol=2e-5)

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

def test_sum_of_a_constant_fused_with_another_sum():
  """A reduce of a term that doesn't vary along the reduce axis, in a kernel whose reduce axis became
  the vector axis (UNROLL): the constant counted once per vector ([2, 6] instead of [3, 7])."""
  x = Tensor(np.arange(4, dtype=np.float32))
  np.testing.assert_array_equal((x.reshape(2, 2).sum(1) + Tensor.full((2, 2), 1.0).sum(1)).numpy(), [3.0, 7.0])
  y = np.arange(12, dtype=np.float32).reshape(3, 4)
  np.testing.assert_array_equal((Tensor(y).sum(1) + Tensor(y[:, :1]).expand(3, 4).sum(1)).numpy(), y.sum(1) + 4 * y[:, 0])
