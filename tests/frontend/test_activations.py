"""The activations of tilecraft/frontend/activations.py and the inverse trig and hyperbolic functions of
frontend/math.py against float64 numpy references: over the float range (tails included, where a
textbook formula overflows or cancels), nan in nan out, float16/bfloat16 computed in float32 and
rounded once, integer inputs in the default float; and each as a fused epilogue of a matmul."""
from __future__ import annotations
import math
import numpy as np
import pytest
from tilecraft import Tensor, dtypes
from op_checks import F32, check_many

def _softplus(x: np.ndarray) -> np.ndarray: return np.logaddexp(0.0, x)
def _sigmoid(x: np.ndarray) -> np.ndarray: return np.exp(-np.logaddexp(0.0, -x))
def _erf(x: np.ndarray) -> np.ndarray: return np.vectorize(math.erf)(x)
SELU = (1.6732632423543772848170429916717, 1.0507009873554804934193349852946)

# name -> (tilecraft, float64 numpy reference)
ACTIVATIONS = {
  "relu6": (lambda t: t.relu6(), lambda x: np.clip(x, 0, 6)),
  "hardtanh": (lambda t: t.hardtanh(-2.0, 0.5), lambda x: np.clip(x, -2, 0.5)),
  "leaky_relu": (lambda t: t.leaky_relu(), lambda x: np.where(x < 0, 0.01 * x, x)),
  "leaky_relu 0.2": (lambda t: t.leaky_relu(0.2), lambda x: np.where(x < 0, 0.2 * x, x)),
  "elu": (lambda t: t.elu(), lambda x: np.where(x < 0, np.expm1(x), x)),
  "elu 0.5": (lambda t: t.elu(0.5), lambda x: np.where(x < 0, 0.5 * np.expm1(x), x)),
  "celu 2": (lambda t: t.celu(2.0), lambda x: np.maximum(x, 0) + np.minimum(0, 2 * np.expm1(x / 2))),
  "selu": (lambda t: t.selu(), lambda x: SELU[1] * np.where(x <= 0, SELU[0] * np.expm1(x), x)),
  "silu": (lambda t: t.silu(), lambda x: x * _sigmoid(x)),
  "swish 2": (lambda t: t.swish(2.0), lambda x: x * _sigmoid(2 * x)),
  "quick_gelu": (lambda t: t.quick_gelu(), lambda x: x * _sigmoid(1.702 * x)),
  # 0.5 x (1 + tanh(u)) written as x sigmoid(2u): the same function, without tanh's rounding to -1 (then 0) far below 0
  "gelu": (lambda t: t.gelu(), lambda x: x * _sigmoid(2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
  "gelu none": (lambda t: t.gelu("none"), lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2)))),
  "hardsigmoid": (lambda t: t.hardsigmoid(), lambda x: np.clip(x / 6 + 0.5, 0, 1)),
  "hardsigmoid onnx": (lambda t: t.hardsigmoid(0.2, 0.5), lambda x: np.clip(0.2 * x + 0.5, 0, 1)),
  "hardswish": (lambda t: t.hardswish(), lambda x: x * np.clip(x / 6 + 0.5, 0, 1)),
  "softplus": (lambda t: t.softplus(), lambda x: np.where(x > 20, x, _softplus(x))),
  "softplus beta 2": (lambda t: t.softplus(2.0, 10.0), lambda x: np.where(2 * x > 10, x, _softplus(2 * x) / 2)),
  "softsign": (lambda t: t.softsign(), lambda x: x / (1 + np.abs(x))),
  "mish": (lambda t: t.mish(), lambda x: x * np.tanh(_softplus(x))),
  "log_sigmoid": (lambda t: t.log_sigmoid(), lambda x: -_softplus(-x)),
}

def _values() -> np.ndarray:
  """-100..100 densely near 0, the tails far out, and signed zeros."""
  core = np.linspace(-8, 8, 161)
  tails = np.array([-100.0, -88.0, -40.0, -30.0, -21.0, -20.0, -19.0, 19.0, 21.0, 30.0, 88.0, 100.0, 1e-7, -1e-7, 1e-30, -1e-30, 0.0, -0.0])
  return np.concatenate([core, tails])

@pytest.mark.parametrize("device", ["CPU", pytest.param("OPENCL", marks=pytest.mark.opencl)])
def test_activations_match_numpy_over_the_float_range(device: str) -> None:
  x = _values().astype(F32)
  cases = {name: (lambda a, f=f: f(a), lambda a, g=g: g(a.astype(np.float64)).astype(F32)) for name, (f, g) in ACTIVATIONS.items()}
  exact_gelu = {"gelu none": cases.pop("gelu none")}
  check_many(cases, x, device=device, rtol=2e-6, atol=1e-12)  # (the far tails: test_softplus_tail_keeps_its_digits)
  # 1 + erf(x / sqrt(2)) cancels below x ~ -5 (as torch's does): there the result is 0 within 1e-7
  check_many(exact_gelu, x, device=device, rtol=2e-6, atol=1e-7)

def test_softplus_tail_keeps_its_digits() -> None:
  """log(1 + exp(x)) for x far below 0 is exp(x) itself: log(1 + tiny) would round to 0 (100% off)."""
  x = np.array([-17.0, -25.0, -60.0, -80.0], F32)
  got = Tensor(x).softplus().numpy()
  np.testing.assert_allclose(got, np.exp(x.astype(np.float64)), rtol=F32_RTOL["expm1"])  # (exp's own error at |x| = 60)
  np.testing.assert_allclose(Tensor(-x).log_sigmoid().numpy(), -np.exp(x.astype(np.float64)), rtol=F32_RTOL["expm1"])  # -log1p(exp(x))

def test_nan_in_nan_out() -> None:
  x = np.array([np.nan, 1.0, -1.0], F32)
  for name, (f, _) in ACTIVATIONS.items():
    got = f(Tensor(x)).numpy()
    assert np.isnan(got[0]) and not np.isnan(got[1:]).any(), f"{name}: {got}"

@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16], ids=lambda d: d.name)
def test_half_and_bfloat16_are_computed_in_float32_and_rounded_once(dt) -> None:
  x32 = np.linspace(-6, 6, 97).astype(F32)
  t = Tensor(x32).cast(dt)
  held = t.cast(dtypes.float32).numpy().astype(np.float64)  # the input values a dt buffer holds
  for name, (f, g) in ACTIVATIONS.items():
    out = f(t)
    assert out.dtype == dt, name
    got = out.cast(dtypes.float32).numpy()
    want = Tensor(g(held).astype(F32)).cast(dt).cast(dtypes.float32).numpy()  # the float64 value, rounded once to dt
    ulp = 2.0 ** -10 if dt == dtypes.float16 else 2.0 ** -7
    np.testing.assert_allclose(got, want, rtol=ulp, atol=1e-6, err_msg=name)

def test_integer_inputs_compute_in_the_default_float() -> None:
  x = np.arange(-5, 6, dtype=np.int32)
  out = Tensor(x).silu()
  assert out.dtype == dtypes.float32
  np.testing.assert_allclose(out.numpy(), x * _sigmoid(x.astype(np.float64)), rtol=1e-6)
  with pytest.raises(ValueError, match="approximate must be 'tanh' or 'none'"): Tensor(x).gelu("erf")

INVERSE = {
  "arctan": (lambda t: t.arctan(), np.arctan, np.linspace(-50, 50, 201)),
  "arcsin": (lambda t: t.arcsin(), np.arcsin, np.concatenate([np.linspace(-1, 1, 101), [0.999999, -0.999999, 1e-8]])),
  "arccos": (lambda t: t.arccos(), np.arccos, np.concatenate([np.linspace(-1, 1, 101), [0.999999, -0.999999]])),
  "sinh": (lambda t: t.sinh(), np.sinh, np.concatenate([np.linspace(-20, 20, 161), [1e-6, -1e-6, 0.05, 0.099, 0.101]])),
  "cosh": (lambda t: t.cosh(), np.cosh, np.linspace(-20, 20, 161)),
  "arcsinh": (lambda t: t.arcsinh(), np.arcsinh, np.concatenate([np.linspace(-1000, 1000, 161), [1e-6, -1e-6, 0.049, 0.051, 1e9, -3e12]])),
  "arccosh": (lambda t: t.arccosh(), np.arccosh, np.linspace(1, 1000, 161)),
  "arctanh": (lambda t: t.arctanh(), np.arctanh, np.concatenate([np.linspace(-0.9999, 0.9999, 401), [1e-6, -1e-6, 0.49, 0.51]])),
  "expm1": (lambda t: t.expm1(), np.expm1, np.concatenate([np.linspace(-30, 30, 301), [1e-8, -1e-8, 0.29, 0.31, -0.29, -0.31]])),
  "log1p": (lambda t: t.log1p(), np.log1p, np.concatenate([np.linspace(-0.999, 30, 301), [1e-8, -1e-8, 1e-30, 0.29, 0.31]])),
}
# float32: a few ulp; exp's own error grows with |x| (|x| * 2^-24: sinh, cosh and expm1 at |x| ~ 20-30)
F32_RTOL = {"sinh": 2e-6, "cosh": 2e-6, "expm1": 3e-6}

@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_inverse_trig_hyperbolic_expm1_log1p_match_numpy(dt) -> None:
  for name, (f, g, xs) in INVERSE.items():
    x = xs.astype(dt)
    got = f(Tensor(x)).numpy()
    assert got.dtype == dt, name
    want = g(x.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=F32_RTOL.get(name, 5e-7) if dt == np.float32 else 1e-14, atol=0, err_msg=name)

def test_special_values_match_numpy() -> None:
  """Signed zeros keep their sign, infinities and the edges of each domain as numpy gives them."""
  v = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, 1.0, -1.5, 1e-30], F32)
  for name, (f, g, _) in INVERSE.items():
    with np.errstate(all="ignore"): want = g(v)
    got = f(Tensor(v)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True, err_msg=name)
    assert np.array_equal(np.signbit(got[:2]), np.signbit(want[:2])), f"{name}: {got[:2]}"

@pytest.mark.parametrize("name", ["silu", "gelu none", "mish", "hardswish", "selu"])
def test_activation_fuses_into_a_matmuls_epilogue(name: str, rng) -> None:
  """x @ w + b, then the activation: one kernel, the activation computed from the accumulators."""
  x, w, b = rng.standard_normal((48, 64)).astype(F32), rng.standard_normal((64, 80)).astype(F32) / 8, rng.standard_normal(80).astype(F32)
  f, g = ACTIVATIONS[name]
  out = f(Tensor(x) @ Tensor(w) + Tensor(b))
  assert len(out.schedule()) == 1, name
  np.testing.assert_allclose(out.numpy(), g(x.astype(np.float64) @ w + b), rtol=2e-5, atol=2e-5)
