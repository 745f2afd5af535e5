"""Tensor.cumsum, Tensor.cumprod and Tensor.prod (tilecraft/frontend/scan.py) against numpy: short rows as one
windowed reduce, long rows blocked one or more levels deep, never quadratic work; products as trees of multiplies
with numpy's dtypes (ints as int64, wrapping as numpy does; half in float32, rounded once; an empty axis gives 1)."""
from __future__ import annotations
import numpy as np
import pytest
from tilecraft import Tensor
from tilecraft.ops import BufferOps, MetaOps, ReduceOps
from op_checks import check, on_devices, randf, randi

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

@on_devices("n,pos", [(64, 1), (100, 40), (1100, 500), (40, 39)], opencl=[1])
def test_cumsum_nan_inf_only_spread_forward(device: str, rng: np.random.Generator, n: int, pos: int) -> None:
  """A nan or inf at `pos` changes only the sums from `pos` on, as in numpy: [1, nan, 1, ...] gave nan
  from the start of its 32-element block, and an inf at 40 made 32..39 nan (the block offset was the
  inclusive running sum of block totals minus the block's own total)."""
  for bad in (np.nan, np.inf, -np.inf):
    x = randf(rng, 2, n)
    x[:, pos] = bad
    got, want = Tensor(x, device=device).cumsum(1).numpy(), np.cumsum(x.astype(np.float64), 1)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 * n)

@on_devices("shape,axis", [((7,), 0), ((3, 5), 1), ((2, 33, 4), 1), ((1, 1), 0), ((0, 3), 1), ((1100,), 0)], opencl=[1, 2])
def test_cumprod(device: str, rng: np.random.Generator, shape: tuple, axis: int) -> None:
  """Short rows (one windowed product tree) and long ones (33, 1100: blocked, the block totals' exclusive running
  product before each block), to float64's result within float32 rounding."""
  x = rng.uniform(0.9, 1.1, shape).astype(np.float32)
  got = Tensor(x, device=device).cumprod(axis).numpy()
  np.testing.assert_allclose(got, np.cumprod(x.astype(np.float64), axis), rtol=2e-5 if max(shape, default=0) > 100 else 2e-6)
  xi = rng.integers(-3, 4, shape).astype(np.int32)
  gi = Tensor(xi, device=device).cumprod(axis)
  assert gi.dtype.name == "long"  # (numpy: int64)
  np.testing.assert_array_equal(gi.numpy(), np.cumprod(xi, axis))  # exact, wrapping past 2^63 as numpy does

def test_cumprod_zero_nan_inf_only_spread_forward(rng: np.random.Generator) -> None:
  """A 0, nan or inf at `pos` changes only the products from `pos` on (no division undoes a block's total)."""
  for n, pos in ((64, 1), (100, 40), (1100, 500)):
    for bad in (0.0, np.nan, np.inf):
      x = rng.uniform(0.99, 1.01, (2, n)).astype(np.float32)
      x[:, pos] = bad
      got, want = Tensor(x).cumprod(1).numpy(), np.cumprod(x.astype(np.float64), 1)
      np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
      np.testing.assert_allclose(got, want, rtol=1e-5)

def test_cumprod_long_row_is_not_quadratic() -> None:
  t = Tensor(np.ones(1 << 18, dtype=np.float32)).cumprod()
  assert len([si for si in t.schedule() if si.ast.op is MetaOps.KERNEL]) <= 24
  np.testing.assert_array_equal(t.numpy(), np.ones(1 << 18, np.float32))

@pytest.mark.parametrize("axis,keepdim", [(None, False), (0, False), (1, True), (2, False), ((0, 2), False), (-1, True)])
def test_prod_matches_numpy(rng: np.random.Generator, axis, keepdim) -> None:
  x = rng.uniform(0.5, 1.5, (3, 37, 5)).astype(np.float32)
  got = Tensor(x).prod(axis, keepdim)
  want = np.prod(x.astype(np.float64), axis=axis, keepdims=keepdim)
  assert got.shape == want.shape
  np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)

def test_prod_dtypes_and_empty_axes(rng: np.random.Generator) -> None:
  """numpy's result dtypes: ints and bools as (u)int64 (int64 wrapping past 2^63 as numpy does), float16 computed in
  float32 and rounded once (1000 values: rounding every step drifts by tens of ulps); an empty axis gives 1."""
  big = np.array([3**39, 3**5, 7, -11], np.int64)
  assert int(Tensor(big).prod().numpy()) == int(np.prod(big))
  for x in (np.array([200, 200, 3], np.uint8), rng.integers(-4, 5, (6, 9)).astype(np.int16), np.array([[True, False], [True, True]])):
    got, want = Tensor(x).prod(-1), np.prod(x, -1)
    assert np.dtype(got.numpy().dtype) == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got.numpy(), want)
  h = rng.uniform(0.9, 1.1, 1000).astype(np.float16)
  want = np.float16(np.prod(h.astype(np.float64)))
  got = Tensor(h).prod().numpy()
  assert got.dtype == np.float16 and abs(float(got) - float(want)) <= float(np.spacing(want))
  np.testing.assert_array_equal(Tensor(np.zeros((0, 3), np.float32)).prod(0).numpy(), np.ones(3, np.float32))
  assert Tensor(np.zeros((2, 0), np.float32)).prod(1, keepdim=True).shape == (2, 1)
  np.testing.assert_allclose(Tensor(np.full(10, 2.0, np.float32)).prod(dtype="float64").numpy(), 1024.0)
