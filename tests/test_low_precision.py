"""float16 and bfloat16 results against numpy, on every device (issue 27 item 1, DESIGN 12).

- Reductions of half/bfloat16 values (sum, mean, matmul, conv, the sums inside softmax, layernorm,
  var) accumulate in float32 and round once at the end; an explicit `acc_dtype` keeps the user's
  accumulator.
- bfloat16 arithmetic is float32 arithmetic rounded to nearest even (the lowering promotes every
  bfloat16 ALU op, codegen/rewrite.py: bf16_promote), so C, OpenCL, LLVM and the emulator agree.

The reference is numpy on float32 (float64 for the matmul) data rounded the way the dtype rounds:
`bf16()` below is round-to-nearest-even of the float32 bits, written here independently of
tilecraft.dtype's helpers.
"""
import numpy as np
import pytest
from tilecraft import Tensor
from tilecraft.dtype import dtypes

DEVICES = ["CPU", "LLVM", "OPENCL", "PYTHON"]

def bf16(a) -> np.ndarray:
  """float32 values rounded to the nearest bfloat16 (ties to even), as float32; NaN stays NaN."""
  f = np.asarray(a, dtype=np.float32)
  bits = f.view(np.uint32).astype(np.uint64)
  rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
  out = (rounded & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
  return np.where(np.isnan(f), f, out)

def test_bf16_helper_rounds_to_nearest_even():
  one = np.float32(1.0)
  step = np.float32(2.0 ** -7)  # bfloat16's spacing at 1
  assert bf16(one + step / 2) == one  # a tie goes to the even neighbour (1.0)
  assert bf16(one + step + step / 2) == one + 2 * step  # (1 + step is odd: up to 1 + 2 step)
  assert bf16(one + step / 2 + np.float32(2.0 ** -20)) == one + step
  assert bf16(np.float32(0.1)) == np.float32(0.10009765625)

ROUND = {dtypes.bfloat16: bf16, dtypes.float16: lambda a: np.asarray(a, np.float32).astype(np.float16).astype(np.float32)}
# one rounding's relative error at most (half a step at 1); a value one step off at the bottom of its binade is 2 of these
ULP = {dtypes.bfloat16: 2.0 ** -8, dtypes.float16: 2.0 ** -11}

def _t(x: np.ndarray, dt, device: str) -> Tensor:
  return Tensor(x.astype(np.float32), dtype=dt, device=device)

def _close(got, want, dt, ulps: float, scale=None, name: str = "") -> None:
  """got within `ulps` roundings of want, relative to |want| (or to `scale`, for sums that cancel)."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  tol = ulps * ULP[dt] * (np.abs(want) if scale is None else scale)
  with np.errstate(invalid="ignore"): bad = ~(np.abs(got - want) <= tol + 1e-30) & ~(np.isnan(got) & np.isnan(want)) & ~(got == want)
  assert not bad.any(), f"{name}: {bad.sum()} of {bad.size} off: got {got[bad][:5]}, want {want[bad][:5]}"

# name: (tilecraft fn, numpy fn on float32 values and the rounding `r` of the dtype, roundings allowed).
# Every op rounds its result to the dtype (as numpy's float16 does): the references round where the op does.
UNARY = {"neg": (lambda t: -t, lambda a, r: -a, 0), "abs": (lambda t: t.abs(), lambda a, r: np.abs(a), 0),
         "relu": (lambda t: t.relu(), lambda a, r: np.maximum(a, 0), 0), "exp": (lambda t: t.exp(), lambda a, r: np.exp(a), 2.01),
         "sqrt_abs": (lambda t: t.abs().sqrt(), lambda a, r: np.sqrt(np.abs(a)), 1.01),
         "log_abs": (lambda t: t.abs().log(), lambda a, r: np.log(np.abs(a)), 2.01),
         "recip": (lambda t: t.reciprocal(), lambda a, r: 1 / a, 1.01),
         "sigmoid": (lambda t: t.sigmoid(), lambda a, r: 1 / r(1 + r(np.exp(-a))), 3),
         "sin": (lambda t: t.sin(), lambda a, r: np.sin(a), 2.01)}
BINARY = {"add": (lambda t, u: t + u, lambda a, b, r: a + b, 1.01), "sub": (lambda t, u: t - u, lambda a, b, r: a - b, 1.01),
          "mul": (lambda t, u: t * u, lambda a, b, r: a * b, 1.01), "div": (lambda t, u: t / u, lambda a, b, r: a * r(1 / b), 2),
          "maximum": (lambda t, u: t.maximum(u), lambda a, b, r: np.maximum(a, b), 0),
          "minimum": (lambda t, u: t.minimum(u), lambda a, b, r: np.minimum(a, b), 0),
          "muladd": (lambda t, u: t * u + t, lambda a, b, r: r(a * b) + a, 2.01)}
# (float16 on CPU and OPENCL may skip the rounding of an intermediate half result: C's excess precision,
# PoCL's half held in float. The references' intermediate roundings only matter where there is one.)
SCALE = {"muladd": lambda a, b: np.abs(a * b) + np.abs(a)}
COMPARE = {"lt": (lambda t, u: t < u, np.less), "gt": (lambda t, u: t > u, np.greater), "eq": (lambda t, u: t == u, np.equal),
           "ne": (lambda t, u: t != u, np.not_equal), "le": (lambda t, u: t <= u, np.less_equal)}

def _data(rng: np.random.Generator, dt, *shape) -> np.ndarray:
  """Values of both signs and a few magnitudes, already representable in dt (ties and repeats included)."""
  x = rng.standard_normal(shape).astype(np.float32) * rng.choice([0.01, 1.0, 30.0], size=shape).astype(np.float32)
  x.flat[::7] = np.round(x.flat[::7])  # some equal values, for == and argmax's first-hit rule
  return ROUND[dt](x)

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt", [dtypes.bfloat16, dtypes.float16], ids=str)
def test_elementwise_ops_against_numpy(device: str, dt, rng: np.random.Generator):
  a, b = _data(rng, dt, 6, 11), _data(rng, dt, 6, 11)
  b[b == 0] = 1.5
  t, u = _t(a, dt, device), _t(b, dt, device)
  r = ROUND[dt]
  # every result is built first and realized in one schedule (its new kernels compile as batches)
  unary = {name: f(t) for name, (f, _, _) in UNARY.items()}
  binary = {name: f(t, u) for name, (f, _, _) in BINARY.items()}
  compare = {name: (f(t, u), f(t, 0.0)) for name, (f, _) in COMPARE.items()}
  where, cast = (t < u).where(t, u), t.cast(dtypes.float32)
  where.realize(cast, *unary.values(), *binary.values(), *[c for pair in compare.values() for c in pair])
  for name, (_, ref, ulps) in UNARY.items():
    assert unary[name].dtype == dt, name
    _close(unary[name].numpy(), r(ref(a, r)), dt, ulps, name=name)
  for name, (_, ref, ulps) in BINARY.items():
    _close(binary[name].numpy(), r(ref(a, b, r)), dt, ulps, SCALE[name](a, b) if name in SCALE else None, name=name)
  for name, (_, ref) in COMPARE.items():
    np.testing.assert_array_equal(compare[name][0].numpy(), ref(a, b), err_msg=name)
    np.testing.assert_array_equal(compare[name][1].numpy(), ref(a, np.float32(0)), err_msg=name + " 0")
  np.testing.assert_array_equal(where.numpy().astype(np.float32), np.where(a < b, a, b))
  np.testing.assert_array_equal(cast.numpy(), a)

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt", [dtypes.bfloat16, dtypes.float16], ids=str)
def test_reductions_against_numpy(device: str, dt, rng: np.random.Generator):
  a = _data(rng, dt, 5, 40)
  t = _t(a, dt, device)
  scale = np.abs(a).sum(1)  # a sum's result rounds once: tolerance relative to what it adds up
  # every result is built first and realized in one schedule (its new kernels compile as batches)
  per_axis = {axis: (t.sum(axis), t.mean(axis), t.max(axis), t.min(axis), t.argmax(axis), t.argmin(axis)) for axis in (1, None)}
  var, std, softmax, cumsum, layernorm = t.var(1), t.std(1), t.softmax(1), t.cumsum(1), t.layernorm(1)
  var.realize(std, softmax, cumsum, layernorm, *[r for rs in per_axis.values() for r in rs])
  for axis, (s, mean, mx, mn, amax, amin) in per_axis.items():
    sc = scale if axis == 1 else scale.sum()
    _close(s.numpy(), ROUND[dt](a.sum(axis, dtype=np.float64)), dt, 1.01, sc)
    _close(mean.numpy(), ROUND[dt](a.mean(axis, dtype=np.float64)), dt, 1.01, sc / a.shape[1] if axis == 1 else sc / a.size)
    np.testing.assert_array_equal(mx.numpy().astype(np.float32), a.max(axis))
    np.testing.assert_array_equal(mn.numpy().astype(np.float32), a.min(axis))
    np.testing.assert_array_equal(amax.numpy(), a.argmax(axis))
    np.testing.assert_array_equal(amin.numpy(), a.argmin(axis))
  want_var = a.astype(np.float64).var(1)
  _close(var.numpy(), ROUND[dt](want_var), dt, 2, want_var)
  _close(std.numpy(), ROUND[dt](np.sqrt(want_var)), dt, 2, np.sqrt(want_var))
  sm = np.exp(a - a.max(1, keepdims=True))
  sm = sm / sm.sum(1, keepdims=True)
  _close(softmax.numpy(), ROUND[dt](sm), dt, 2, 1e-3 / ULP[dt])  # (absolute: float32 exp, one rounding)
  cs = np.cumsum(a.astype(np.float64), 1)
  _close(cumsum.numpy(), ROUND[dt](cs), dt, 1.01, np.abs(a).cumsum(1))
  ln = (a - a.mean(1, keepdims=True, dtype=np.float64)) / np.sqrt(want_var[:, None] + 1e-5)
  _close(layernorm.numpy(), ROUND[dt](ln), dt, 2, np.abs(ln).max())

@pytest.mark.parametrize("device", DEVICES)
def test_half_matmul_accumulates_in_float32(device: str, rng: np.random.Generator):
  """(64, 4096) x (4096, 64) half: within 1e-3 of the float64 product (half accumulation: ~1e-2)."""
  K = 4096 if device != "PYTHON" else 1024
  a, b = rng.standard_normal((64, K)).astype(np.float16), rng.standard_normal((K, 64)).astype(np.float16)
  exact = a.astype(np.float64) @ b.astype(np.float64)
  got = (Tensor(a, device=device) @ Tensor(b, device=device)).numpy()
  assert got.dtype == np.float16
  assert np.abs(got - exact).max() / np.abs(exact).max() < 1e-3

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt", [dtypes.bfloat16, dtypes.float16], ids=str)
def test_matmul_and_conv_round_once(device: str, dt, rng: np.random.Generator):
  a, b = _data(rng, dt, 9, 70), _data(rng, dt, 70, 12)
  want = ROUND[dt](a.astype(np.float64) @ b.astype(np.float64))
  _close((_t(a, dt, device) @ _t(b, dt, device)).numpy(), want, dt, 1.01, np.abs(a) @ np.abs(b))
  x, w = _data(rng, dt, 1, 3, 6, 6), _data(rng, dt, 4, 3, 3, 3)
  got = _t(x, dt, device).conv2d(_t(w, dt, device), padding=1).numpy()
  xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
  win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))  # 1, 3, 6, 6, 3, 3
  want = np.einsum("nchwij,ocij->nohw", win, w.astype(np.float64))
  _close(got, ROUND[dt](want), dt, 1.01, np.einsum("nchwij,ocij->nohw", np.abs(win), np.abs(w.astype(np.float64))))

@pytest.mark.parametrize("device", DEVICES)
def test_half_sums_do_not_stall_or_overflow(device: str):
  x = np.full(20000, 0.1, np.float16)
  assert abs(float(Tensor(x, device=device).sum().numpy()) - 20000 * float(x[0])) <= 1.0  # half accumulation stops at 2048
  assert float(Tensor(np.full(100, 1000.0, np.float16), device=device).mean().numpy()) == 1000.0  # the sum 1e5 > half's max
  r = np.random.default_rng(1).standard_normal((16, 2048)).astype(np.float16)
  want = r.astype(np.float64).sum(1)
  assert np.abs(Tensor(r, device=device).sum(1).numpy() - want).max() / np.abs(want).max() < 1e-3

def test_bf16_sum_is_arithmetic_not_bits():
  for device in DEVICES:
    got = Tensor([0.1] * 4, dtype=dtypes.bfloat16, device=device).sum().numpy()
    assert float(got) == float(bf16(4 * bf16(np.float32(0.1)))), device

def test_acc_dtype_keeps_the_users_choice():
  x = Tensor(np.full(20000, 0.1, np.float16))
  assert float(x.sum().numpy()) == pytest.approx(2000, abs=1)
  assert x.sum(acc_dtype=dtypes.float16).dtype == dtypes.float16  # (accumulated in half: the kernels' SUMs are checked below)
  a, b = np.full((1, 20000), 0.1, np.float16), np.ones((20000, 1), np.float16)
  exact = 20000 * float(a[0, 0])
  assert abs(float((Tensor(a) @ Tensor(b)).numpy()[0, 0]) - exact) <= 1  # (half's step there is 1)
  assert Tensor(a).matmul(Tensor(b), acc_dtype="half").dtype == dtypes.float16
  s = Tensor(np.ones((4, 5), np.float32)).sum(1, acc_dtype=dtypes.float64)
  assert s.dtype == dtypes.float32 and s.tolist() == [5.0] * 4
  # the kernels' reduces accumulate in float32 (one cast stores half), or in half when asked
  from tilecraft.ops import ReduceOps
  def sum_dtypes(t: Tensor) -> set:
    return {op.dtype for si in t.schedule() for op in si.ast.lazyops if op.op is ReduceOps.SUM}
  h = Tensor(np.ones((8, 8), np.float16))
  assert sum_dtypes(h.sum(1)) == sum_dtypes(h @ h) == sum_dtypes(h.mean(0)) == sum_dtypes(h.softmax(1)) == {dtypes.float32}
  assert sum_dtypes(h.sum(1, acc_dtype="half")) == sum_dtypes(h.matmul(h, acc_dtype=dtypes.float16)) == {dtypes.float16}

# ---- float32 summation accuracy (issue 28 item 4) -------------------------------------------------
# One accumulator over n iterations loses about n roundings; the lowering adds blocks of about sqrt(n)
# iterations in an accumulator of their own (codegen/lower_state.py: LoweringState._blocked_sum_axis), and var/std/
# layernorm take two passes over data shifted by its first element.

@pytest.mark.parametrize("device", ["CPU", "LLVM", "OPENCL"])
def test_float32_mean_of_many_equal_values(device: str):
  n = 1 << 22
  got = float(Tensor(np.full(n, 0.1, np.float32), device=device).mean().numpy())
  # (one long chain per lane: 3e-4 off. OPENCL's grouped reduces combine a group's partials in one
  # thread, a chain of 256, not blocked)
  assert abs(got - float(np.float32(0.1))) / 0.1 < (1e-6 if device != "OPENCL" else 1e-5), got

@pytest.mark.parametrize("device", ["CPU", "LLVM", "OPENCL"])
def test_float32_long_row_sums(device: str, rng: np.random.Generator):
  x = np.full((32, 1 << 17), 0.1, np.float32) * rng.integers(1, 4, (32, 1)).astype(np.float32)  # (32 rows: one kernel)
  want = x.astype(np.float64).sum(1)
  got = Tensor(x, device=device).sum(1).numpy()
  assert np.abs(got - want).max() / want.max() < 2e-6

@pytest.mark.parametrize("device", ["CPU", "LLVM", "OPENCL", "PYTHON"])
def test_std_and_layernorm_do_not_cancel(device: str, rng: np.random.Generator):
  """1e6 + 0.01 N(0, 1) in float32: the std was 41.7 (true 0.0027, numpy's float32 0.063)."""
  n = 100_000 if device != "PYTHON" else 4096
  y = (1e6 + 0.01 * rng.standard_normal(n)).astype(np.float32)
  y[0] = np.float32(1e6 + 0.0625)  # (the shift's element is not the mean)
  yd = y.astype(np.float64)
  got = float(Tensor(y, device=device).std().numpy())
  assert abs(got - yd.std()) / yd.std() < 1e-3, got
  assert abs(float(Tensor(y, device=device).var(correction=1).numpy()) - yd.var(ddof=1)) / yd.var(ddof=1) < 1e-3
  rows = np.stack([y, y[::-1] - np.float32(5e5)])
  want = (rows.astype(np.float64) - rows.astype(np.float64).mean(1, keepdims=True)) / np.sqrt(rows.astype(np.float64).var(1, keepdims=True) + 1e-5)
  assert np.abs(Tensor(rows, device=device).layernorm(-1).numpy() - want).max() < 1e-3

def test_blocked_sum_kernel_shape():
  """The long reduce loop of a float sum runs as blocks with an accumulator each; a max keeps one loop."""
  from tilecraft.codegen.kernel import Kernel
  from tilecraft.codegen.uops import UOps
  from tilecraft.device import Device
  from tilecraft.engine.realize import optimize
  def accs(t: Tensor) -> tuple[int, int]:
    k = optimize(Kernel(t.schedule()[-1].ast, opts=Device["CPU"].renderer))
    k.linearize()
    return sum(u.op is UOps.DEFINE_ACC for u in k.uops), sum(u.op is UOps.RANGE for u in k.uops)
  x = Tensor(np.ones((32, 1 << 14), np.float32))  # (more than 16 rows: not split into two kernels)
  assert accs(x.sum(1)) == (8, 3)  # (4 rows x (block + total); the row loop, the outer and the block loop)
  assert accs(x.max(1)) == (4, 2)
  assert accs(Tensor(np.ones((4, 64), np.float32)).sum(1))[1] <= 2  # short loops: no blocks

@pytest.mark.parametrize("device", DEVICES)
def test_bf16_constants_and_identities(device: str):
  """bfloat16 constants are rendered as their bits (C/OpenCL rendered (ushort)1.5f == 1: 9e-41), MAX's
  -inf identity included: a max of all-negative values."""
  np.testing.assert_array_equal(Tensor.full((3,), 1.5, dtype=dtypes.bfloat16, device=device).contiguous().numpy(), [1.5] * 3)
  np.testing.assert_array_equal(Tensor.full((2,), -np.inf, dtype=dtypes.bfloat16, device=device).contiguous().numpy(), [-np.inf] * 2)
  x = -bf16(np.arange(1, 241, dtype=np.float32).reshape(6, 40) * np.float32(0.37))
  t = Tensor(x, dtype=dtypes.bfloat16, device=device)
  np.testing.assert_array_equal(t.max(1).numpy().astype(np.float32), x.max(1))
  np.testing.assert_array_equal(t.max().numpy().astype(np.float32), x.max())
  np.testing.assert_array_equal((-t).min(1).numpy().astype(np.float32), (-x).min(1))
