"""A seeded differential fuzzer against numpy for the numerics issue 28 found wrong: transcendental
chains into argmax/argmin (the result must lie in [0, N) and be the first extreme of the values
computed), float % and // with large quotients (numpy's values bit for bit, signed zeros included),
cumsum with nan/inf anywhere in long rows (nothing before a nan or inf may change), and ** with
python-float exponents (C pow's special values exactly, the rest within a few ulp).

Each seed draws one batch of random cases and checks it in a few kernels. The default tier runs a
few seeds on CPU and one on each other device; `-m slow` runs many more seeds, bigger batches and
every device."""
from __future__ import annotations
import math
from typing import Any, Callable
import numpy as np
import pytest
from tilecraft import Tensor
from op_checks import _has_f64, select_rows

DEVICES = ["CPU", "LLVM", "OPENCL", "PYTHON"]

def _tiers(n_fast: int, n_slow: int) -> list:
  """(device, seed, size) cases: n_fast seeds on CPU and one on each other device by default, and
  n_slow seeds on every device (bigger batches) under -m slow."""
  fast = [pytest.param("CPU", s, 1, id=f"CPU-{s}") for s in range(n_fast)]
  fast += [pytest.param(d, 100, 1, id=f"{d}-100") for d in DEVICES[1:]]
  slow = [pytest.param(d, 1000 + s, 4, id=f"{d}-slow{s}", marks=[pytest.mark.slow, pytest.mark.timeout(900)]) for d in DEVICES for s in range(n_slow)]
  return fast + slow

def _exact(got: np.ndarray, want: np.ndarray, what: str) -> None:
  """Equal values, nan where numpy has nan, the same sign on zeros and infinities."""
  assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype}{got.shape} != numpy {want.dtype}{want.shape}"
  nan = np.isnan(want)
  bad = ~((got == want) | (nan & np.isnan(got))) | (~nan & (np.signbit(got) != np.signbit(want)))
  assert not bad.any(), f"{what}: {int(bad.sum())} of {bad.size} differ, e.g. got {got[bad][:4]} want {want[bad][:4]}"

# ---- transcendental chains into argmax / argmin ---------------------------------------------------

CHAIN_OPS: dict[str, Callable[[Tensor], Tensor]] = {
  "exp": lambda t: t.exp(), "sigmoid": lambda t: t.sigmoid(), "tanh": lambda t: t.tanh(), "log|x|": lambda t: (t.abs() + 1e-3).log(),
  "sin": lambda t: t.sin(), "cos": lambda t: t.cos(), "softmax": lambda t: t.softmax(-1), "log_softmax": lambda t: t.log_softmax(-1),
  "affine": lambda t: t * 1.7 - 0.3, "square": lambda t: t * t, "sqrt|x|": lambda t: t.abs().sqrt(), "x*e^x": lambda t: t * t.exp(),
}

@pytest.mark.parametrize("device,seed,size", _tiers(3, 6))
def test_transcendental_chains_into_argmax(device: str, seed: int, size: int) -> None:
  """exp(x).argmax(-1) returned N (one past the end) in 7% of rows when the max and the compare came
  from two kernels that evaluate exp differently. Any chain: indices in [0, N), and the first extreme
  of the values the chain computes (realized on their own), ties and nan (the first nan wins) included."""
  rng = np.random.default_rng(seed)
  for _ in range(size + 1):  # (each chain compiles ~12 kernels: 0.2 s each on CPU, 0.7 s on PoCL)
    rows, n = int(rng.integers(1, 40 if device == "PYTHON" else 300)), int(rng.integers(1, 70))
    x = (rng.standard_normal((rows, n)) * rng.choice([0.5, 3.0, 20.0])).astype(np.float32)
    if rng.random() < 0.3: x[rng.random(x.shape) < 0.02] = np.nan
    if rng.random() < 0.3: x = np.round(x)  # ties
    names = list(rng.choice(sorted(CHAIN_OPS), int(rng.integers(1, 4))))
    def chain(t: Tensor, names: list = names) -> Tensor:
      for nm in names: t = CHAIN_OPS[nm](t)
      return t
    ops = (("argmax", -1), ("argmin", -1), ("argmax", 0), ("argmin", 0))
    vals_t = chain(Tensor(x, device=device))
    outs = [getattr(chain(Tensor(x, device=device)), op)(axis) for op, axis in ops]
    vals_t.realize(*outs)  # (one schedule: its new kernels compile as batches)
    vals = vals_t.numpy()
    for (op, axis), out in zip(ops, outs):
      got = out.numpy()
      size_ax = x.shape[axis]
      assert ((got >= 0) & (got < size_ax)).all(), f"{'.'.join(names)}.{op}({axis}): index out of [0, {size_ax}) in {int(((got < 0) | (got >= size_ax)).sum())} places"
      np.testing.assert_array_equal(got, getattr(np, op)(vals, axis), err_msg=f"{'.'.join(names)}.{op}({axis}) on {device}, seed {seed}")

# ---- float % and // with large quotients ---------------------------------------------------------

def _divmod_operands(rng: np.random.Generator, dt: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
  top = {np.float16: 4.5, np.float32: 37, np.float64: 300}[dt]
  x = 10.0 ** rng.uniform(-6, top, n) * rng.choice([-1, 1], n)
  y = 10.0 ** rng.uniform(-6, min(top, 8), n) * rng.choice([-1, 1], n)
  special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, 0.1, 2.3])
  pick = rng.random(n) < 0.06
  x[pick] = rng.choice(special, int(pick.sum()))
  pick = rng.random(n) < 0.06
  y[pick] = rng.choice(special, int(pick.sum()))
  exact = rng.random(n) < 0.15  # exact multiples: x = k * y
  x[exact] = (rng.integers(-1000, 1000, int(exact.sum())) * y[exact])
  with np.errstate(over="ignore", invalid="ignore"): return x.astype(dt), y.astype(dt)

@pytest.mark.parametrize("device,seed,size", _tiers(3, 6))
def test_mod_and_floordiv_large_quotients(device: str, seed: int, size: int) -> None:
  """x % y is numpy's bit for bit (the divisor's sign, |r| < |y|, signed zeros; 3902246.2 % 0.1 was
  -0.208 and float64 1e20 % 0.1 was -5551); x // y too where the quotient is below 2**22 (above, x // y
  is within an ulp: the division is x * (1/y)). Tensor and python-float divisors."""
  rng = np.random.default_rng(seed)
  n = (200 if device == "PYTHON" else 2000) * size
  for dt in (np.float32, np.float64, np.float16):
    if dt == np.float64 and not _has_f64(device): continue
    x, y = _divmod_operands(rng, dt, n)
    with np.errstate(all="ignore"): wm, wd = np.mod(x, y), np.floor_divide(x, y)
    tx, ty = Tensor(x, device=device), Tensor(y, device=device)
    scalars = (float(rng.choice([0.1, -2.3, 7.0, 1e-3])), float(dt(10.0 ** rng.uniform(-3, 3))))
    mod, div, mods = tx % ty, tx // ty, [tx % s for s in scalars]
    mod.realize(div, *mods)  # (one schedule: its new kernels compile as batches)
    _exact(mod.numpy(), wm, f"{device} {dt.__name__} %, seed {seed}")
    gd = div.numpy()
    with np.errstate(over="ignore"): small = ~(np.abs(wd.astype(np.float64)) >= 2.0 ** 22) | np.isinf(wd)
    _exact(gd[small], wd[small], f"{device} {dt.__name__} //, seed {seed}")
    np.testing.assert_allclose(gd[~small], wd[~small], rtol=4 * np.finfo(dt).eps)
    for s, m in zip(scalars, mods):
      with np.errstate(all="ignore"): want = np.mod(x, dt(s))
      _exact(m.numpy(), want, f"{device} {dt.__name__} % {s}, seed {seed}")

# ---- cumsum with nan and inf ---------------------------------------------------------------------

@pytest.mark.parametrize("device,seed,size", _tiers(3, 6))
def test_cumsum_with_nan_and_inf(device: str, seed: int, size: int) -> None:
  """A nan or +-inf changes only the running sums from its position on (rows longer than a block were
  corrupted from the block's start). Long rows, one or several specials per row, along either axis."""
  rng = np.random.default_rng(seed)
  for _ in range(size):
    rows, n = int(rng.integers(1, 5)), int(rng.integers(1, 300 if device == "PYTHON" else 3000))
    x = rng.uniform(-2, 2, (rows, n)).astype(np.float32)
    for _ in range(int(rng.integers(1, 4))):
      x[int(rng.integers(0, rows)), int(rng.integers(0, n))] = rng.choice([np.nan, np.inf, -np.inf])
    axis = int(rng.integers(0, 2))
    xs = x if axis == 1 else x.T.copy()
    got, want = Tensor(xs, device=device).cumsum(axis).numpy(), np.cumsum(xs.astype(np.float64), axis)
    assert np.array_equal(np.isnan(got), np.isnan(want)), f"{device} seed {seed}: nan in {int((np.isnan(got) != np.isnan(want)).sum())} wrong places"
    assert np.array_equal(np.isposinf(got), np.isposinf(want)) and np.array_equal(np.isneginf(got), np.isneginf(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-5, atol=2e-6 * n)

# ---- ** with python-float exponents --------------------------------------------------------------

def _exponents(rng: np.random.Generator, k: int) -> list[float]:
  special = [math.inf, -math.inf, math.nan, 0.0, -0.0, 0.5, 1e20, -1e20, 16777217.0, 16777215.0, 2.0 ** 53 + 2, 1e300]
  out = [float(v) for v in rng.choice(special, k // 3)]  # (python floats: weak, they take x's dtype)
  out += [float(v) for v in rng.integers(-60, 60, k // 3)]  # integers: odd ones keep a negative base's sign
  out += [float(v) for v in rng.uniform(-8, 8, k - len(out))]
  return out

@pytest.mark.parametrize("device,seed,size", _tiers(3, 6))
def test_pow_python_float_exponents(device: str, seed: int, size: int) -> None:
  """x ** e for python floats e against numpy: nan, inf, zero and sign exactly (inf and nan crashed
  the constant folder; 1e20 gave nan for negative bases), finite values within a few ulp per unit of
  |e * log2|x||, the error exp2(e * log2|x|) carries."""
  rng = np.random.default_rng(seed)
  base = np.concatenate([rng.uniform(-3, 3, 40), np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 0.5, -0.5, 2.0, -2.0])])
  for dt in (np.float32, np.float64):
    if dt == np.float64 and not _has_f64(device): continue
    x = base.astype(dt)
    exps = _exponents(rng, 6 * size if device == "PYTHON" else 12 * size)
    t = Tensor(x, device=device).reshape(1, -1).expand(len(exps), len(x))
    rows = select_rows([t ** e for e in exps]).numpy()  # (row i: x ** exps[i], all in one kernel)
    for e, got in zip(exps, rows):
      with np.errstate(all="ignore"): want = x ** dt(e)
      fin = np.isfinite(want) & (want != 0)
      _exact(got[~fin], want[~fin], f"{device} {dt.__name__} x ** {e}")
      assert (np.signbit(got[fin]) == np.signbit(want[fin])).all(), f"{device} x ** {e}: sign"
      with np.errstate(all="ignore"): mag = np.abs(float(dt(e)) * np.log2(np.abs(x[fin].astype(np.float64))))
      rel = np.abs(got[fin].astype(np.float64) / want[fin].astype(np.float64) - 1)
      bad = rel > np.finfo(dt).eps * (8 + 4 * mag)
      assert not bad.any(), f"{device} {dt.__name__} x ** {e}: relative error {rel[bad].max():.3g} at x = {x[fin][bad][:3]}"
