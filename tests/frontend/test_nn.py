"""The nn-style frontend (tilecraft/frontend/nn.py) against numpy: softmax family, matmul (every
broadcasting form, dtypes, errors), conv2d (stride, padding, dilation, groups), pooling, layernorm, rmsnorm."""
from __future__ import annotations
from typing import Any
import numpy as np
import pytest
from tilecraft import Tensor
from op_checks import F32, check, np_conv2d, np_pool, _np_softmax, on_devices, randf, randi

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

CONVS = [  # (x shape, w shape, stride, padding, dilation, groups)
  ((1, 1, 5, 5), (1, 1, 3, 3), 1, 0, 1, 1), ((2, 3, 7, 6), (4, 3, 3, 2), 1, 0, 1, 1), ((2, 3, 7, 7), (4, 3, 3, 3), 2, 1, 1, 1),
  ((1, 2, 9, 8), (3, 2, 3, 3), 1, 2, 2, 1), ((2, 4, 6, 6), (6, 2, 3, 3), 1, 1, 1, 2), ((1, 4, 5, 5), (4, 1, 3, 3), (2, 1), (1, 0), 1, 4),
  ((1, 3, 4, 5), (2, 3, 1, 1), 1, 0, 1, 1), ((1, 1, 3, 3), (1, 1, 3, 3), 1, 0, 1, 1), ((2, 2, 8, 5), (2, 2, 2, 3), (3, 2), (0, 1), (2, 1), 1)]

@on_devices("xs,ws,stride,padding,dilation,groups", CONVS, opencl=[8, 4])
def test_conv2d(device: str, rng: np.random.Generator, xs: tuple, ws: tuple, stride: Any, padding: Any, dilation: Any, groups: int) -> None:
  x, w, b = randf(rng, *xs), randf(rng, *ws), randf(rng, ws[0])
  check(lambda p, q, r: p.conv2d(q, r, stride=stride, padding=padding, dilation=dilation, groups=groups),
        lambda p, q, r: np_conv2d(p, q, r, stride, padding, dilation, groups), x, w, b, device=device, atol=1e-4, rtol=1e-5)

STRIDED_POINTWISE = [((1, 8, 14, 14), (16, 8, 1, 1), 2, 0, 1), ((2, 6, 9, 7), (5, 6, 1, 1), (2, 3), 0, 1),
                     ((1, 4, 7, 8), (6, 2, 1, 1), 3, 1, 2), ((1, 3, 5, 5), (4, 3, 1, 1), (1, 2), (2, 1), 1)]

@pytest.mark.parametrize("device", ["CPU", "LLVM"])
@pytest.mark.parametrize("xs,ws,stride,padding,groups", STRIDED_POINTWISE)
def test_strided_pointwise_conv_compacts_its_pixels(device: str, rng: np.random.Generator, xs: tuple, ws: tuple, stride: Any, padding: Any, groups: int) -> None:
  """A strided 1x1 conv on a CPU copies its kept pixels together, then runs as a plain 1x1 conv (frontend/
  nn.py): right against numpy for odd sizes, unequal strides, padding and groups, and the conv's
  kernel reads the copy at stride 1 (no gather)."""
  from tilecraft.ops import MetaOps
  x, w, b = randf(rng, *xs), randf(rng, *ws), randf(rng, ws[0])
  check(lambda p, q, r: p.conv2d(q, r, stride=stride, padding=padding, groups=groups),
        lambda p, q, r: np_conv2d(p, q, r, stride, padding, 1, groups), x, w, b, device=device, atol=1e-5, rtol=1e-5)
  out = Tensor(x, device=device).conv2d(Tensor(w, device=device), stride=stride, padding=padding, groups=groups)
  kernels = [si for si in out.schedule() if si.ast.op is MetaOps.KERNEL]
  copy, conv = kernels  # the copy holds exactly the kept pixels, and the conv reads it
  assert copy.bufs[0].size == xs[0] * xs[1] * out.shape[2] * out.shape[3] and copy.bufs[0] in conv.bufs

def test_conv2d_errors() -> None:
  x, w = Tensor.ones(1, 3, 5, 5), Tensor.ones(2, 2, 3, 3)
  with pytest.raises(ValueError, match="channels"): x.conv2d(w)
  with pytest.raises(ValueError, match="4-D"): Tensor.ones(3, 5, 5).conv2d(w)
  with pytest.raises(ValueError, match="larger"): Tensor.ones(1, 2, 2, 2).conv2d(w)

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

@pytest.mark.slow
def test_larger_matmul_conv(device: str, rng: np.random.Generator) -> None:
  a, b = randf(rng, 65, 130), randf(rng, 130, 33)
  check(lambda x, y: x @ y, np.matmul, a, b, device=device, atol=1e-3, rtol=1e-4)
  x, w = randf(rng, 2, 8, 17, 15), randf(rng, 16, 4, 3, 3)
  check(lambda p, q: p.conv2d(q, stride=2, padding=1, groups=2), lambda p, q: np_conv2d(p, q, None, 2, 1, 1, 2), x, w, device=device, atol=1e-3)

def test_pool_windows_are_memoized_per_view_and_arguments(rng: np.random.Generator) -> None:
  """conv2d/pooling windows (NNOps._pool, memo_views): a repeated call is one lookup, the view is of
  the caller's own base, and different views or arguments never share a cached view."""
  from tilecraft.frontend.nn import NNOps
  cache = NNOps._pool.cache
  a, b, w = randf(rng, 1, 2, 6, 7), randf(rng, 1, 2, 6, 7), randf(rng, 3, 2, 3, 3)
  ta, tb, tw = Tensor(a).realize(), Tensor(b).realize(), Tensor(w).realize()
  cache.clear()
  first = ta.conv2d(tw, padding=1).numpy()
  n = len(cache)
  assert n >= 1
  again = ta.conv2d(tw, padding=1)  # a hit
  assert len(cache) == n
  np.testing.assert_allclose(again.numpy(), first, rtol=1e-6)
  np.testing.assert_allclose(tb.conv2d(tw, padding=1).numpy(), np_conv2d(b, w, None, 1, 1, 1, 1), rtol=1e-5, atol=1e-5)  # b's own base
  # other arguments, other views of the same base: each its own entry, each right
  np.testing.assert_allclose(ta.conv2d(tw, padding=1, stride=2).numpy(), np_conv2d(a, w, None, 2, 1, 1, 1), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ta.conv2d(tw, padding=0, dilation=(2, 1)).numpy(), np_conv2d(a, w, None, 1, 0, (2, 1), 1), rtol=1e-5, atol=1e-5)
  flipped = ta.flip(3)
  np.testing.assert_allclose(flipped.conv2d(tw, padding=1).numpy(), np_conv2d(a[..., ::-1].copy(), w, None, 1, 1, 1, 1), rtol=1e-5, atol=1e-5)
  assert len(cache) >= n + 3
  # arguments that are not plain ints are never looked up: a float window still fails, after a hit on the int one
  with pytest.raises(ValueError, match="kernel size"): ta._pool((3.0, 3), (1, 1), (1, 1))
  m = len(cache)
  ta._pool((True, 3), (1, 1), (1, 1))  # (a bool is an int to the checks, but never a key: True == 1)
  assert len(cache) == m

def test_views_of_symbolic_shapes_are_not_memoized(rng: np.random.Generator) -> None:
  from tilecraft import Variable
  from tilecraft.frontend.shapes import memo_views
  @memo_views
  def swap(t: Tensor, a: int) -> Tensor: return t.permute(1, 0).shrink(((a, 5), None))
  x = Tensor(randf(rng, 8, 5)).realize()
  v = x.shrink(((0, Variable("n", 1, 8).bind(6)), (0, 5)))
  assert swap(v, 1).shape[0] == 4 and len(swap.cache) == 0
  np.testing.assert_array_equal(swap(x, 2).numpy(), x.numpy().T[2:])
  np.testing.assert_array_equal(swap(x, 2).numpy(), x.numpy().T[2:])
  assert len(swap.cache) == 1

@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_rmsnorm(dt, rng) -> None:
  x = (rng.standard_normal((6, 40)) * 3).astype(dt)
  out = Tensor(x).rmsnorm(-1, eps=1e-6)
  assert out.dtype.np == dt
  w = x.astype(np.float64)
  np.testing.assert_allclose(out.numpy().astype(np.float64), w / np.sqrt((w * w).mean(-1, keepdims=True) + 1e-6), rtol=1e-6 if dt == np.float32 else 1e-3)
