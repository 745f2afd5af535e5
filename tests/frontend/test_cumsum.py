"""Tensor.cumsum (tilecraft/frontend/cumsum.py) against numpy: short rows as one windowed reduce,
long rows blocked one or more levels deep, and never quadratic work."""
from __future__ import annotations
import numpy as np
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
