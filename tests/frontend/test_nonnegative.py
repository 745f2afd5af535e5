"""frontend/nonnegative.py (which lazy values are known >= 0) and its use in max-pooling: over a value known
>= 0 the windows are padded with 0, a mask on the pool's loads, instead of -inf, which the scheduler
realizes as a padded copy first; the maxima are numpy's with -inf padding, NaN and inf included, and a
window that reaches only padding keeps -inf."""
from __future__ import annotations
from typing import Callable
import numpy as np
import pytest
from tilecraft import Tensor, dtypes
from tilecraft.frontend.nonnegative import known_nonnegative
from tilecraft.ops import MetaOps
from op_checks import check, np_pool, randf, randi

def _kernels(t: Tensor) -> int: return sum(si.ast.op is not MetaOps.COPY for si in t.schedule())

X = Tensor(np.linspace(-2, 2, 24, dtype=np.float32).reshape(2, 3, 4)).realize()
I = Tensor(np.arange(-12, 12, dtype=np.int32).reshape(2, 3, 4)).realize()
KNOWN: dict[str, Callable[[], Tensor]] = {
  "relu": lambda: X.relu(), "int relu": lambda: I.relu(), "relu of a conv-like sum": lambda: (X * 3 + 1).sum(-1).relu(),
  "clip from 0": lambda: X.clip(0, 6), "exp": lambda: X.exp(), "sqrt": lambda: X.sqrt(), "square root of a sum of squares": lambda: (X * X).sum(-1).sqrt(),
  "relu + relu": lambda: X.relu() + X.exp(), "relu * exp": lambda: X.relu() * X.exp(), "max with a relu": lambda: X.maximum(X.relu()),
  "concatenated relus": lambda: Tensor.cat(X.relu(), X.exp(), axis=1), "padded relu": lambda: X.relu().pad(((0, 0), (1, 1), (2, 0))),
  "relu's sum and max": lambda: X.relu().sum(1).max(-1), "relu cast to float16": lambda: X.relu().cast(dtypes.float16),
  "an int32 relu cast to int64": lambda: I.relu().cast(dtypes.int64), "uint8 cast to int16": lambda: Tensor(np.arange(6, dtype=np.uint8)).cast(dtypes.int16),
  "unsigned": lambda: Tensor(np.arange(6, dtype=np.uint8)) - 3, "bool": lambda: X < 0, "arange": lambda: Tensor.arange(5),
}
NOT_KNOWN: dict[str, Callable[[], Tensor]] = {
  "realized data": lambda: X, "relu - 1": lambda: X.relu() - 1, "where with a negative branch": lambda: (X < 0).where(-1.0, X),
  "relu from -1": lambda: (X < -1).where(0.0, X), "relu of one value, kept another": lambda: (X < 0).where(0.0, X + 1),
  "neg of a relu": lambda: -X.relu(), "log of a relu": lambda: X.relu().log(), "a float relu cast to int (NaN is any int)": lambda: X.relu().cast(dtypes.int32),
  "clip from -1": lambda: X.clip(-1, 6), "concatenation with a negative piece": lambda: Tensor.cat(X.relu(), X, axis=1),
  "an int64 relu cast to int32 (wraps)": lambda: Tensor(np.array([3 << 31, 1], np.int64)).relu().cast(dtypes.int32),
  "a uint32 cast to int32 (wraps)": lambda: Tensor(np.array([3 << 30, 1], np.uint32)).cast(dtypes.int32),
}

@pytest.mark.parametrize("name", list(KNOWN))
def test_known_nonnegative(name: str) -> None:
  t = KNOWN[name]()
  assert known_nonnegative(t.lazydata), name
  assert not (t.numpy().astype(np.float64) < 0).any()  # (what it claims holds here: >= 0 or NaN)

@pytest.mark.parametrize("name", list(NOT_KNOWN))
def test_not_known_nonnegative(name: str) -> None:
  assert not known_nonnegative(NOT_KNOWN[name]().lazydata), name

def _relu_data(rng: np.random.Generator, *shape: int) -> np.ndarray:
  x = randf(rng, *shape, lo=-3, hi=3)
  x.flat[::7] = -0.0; x.flat[3::11] = np.nan; x.flat[5::13] = np.inf; x.flat[1::17] = -np.inf
  return x

@pytest.mark.parametrize("k,stride,padding,dilation", [(3, 2, 1, 1), (3, 1, 1, 1), (2, 2, 1, 1), (3, 2, 2, 2), ((3, 2), (2, 1), (1, 1), 1)])
def test_max_pool_over_relu_pads_with_zero(rng: np.random.Generator, k, stride, padding, dilation) -> None:
  x = _relu_data(rng, 2, 3, 9, 8)
  relu = lambda a: np.where(a < 0, np.float32(0), a)  # noqa: E731 (nan stays nan)
  got = check(lambda t: t.relu().max_pool2d(k, stride, padding, dilation), lambda a: np_pool(relu(a), k, stride, padding, dilation, "max"), x)
  assert np.isnan(got).any() and np.isinf(got).any()  # (the data reached the windows it should)
  assert _kernels(Tensor(x).realize().relu().max_pool2d(k, stride, padding, dilation)) == 2  # relu, then the pool over its padded view

def test_max_pool_over_relu_takes_no_padded_copy() -> None:
  # ResNet-50's stem pool (3x3, stride 2, padding 1): padded with -inf, an input not known >= 0 is first
  # copied into a padded buffer by a kernel of its own (here after the kernel computing x - 1)
  xt = Tensor(np.random.default_rng(0).standard_normal((1, 4, 12, 12)).astype(np.float32)).realize()
  assert _kernels(xt.relu().max_pool2d(3, 2, 1)) == 2 and _kernels((xt - 1).max_pool2d(3, 2, 1)) == 3

def test_max_pool_window_of_padding_alone_keeps_minus_inf(rng: np.random.Generator) -> None:
  # kernel 2, padding 2: the first and last windows of each row lie in the padding, so their max is -inf
  x = randf(rng, 1, 2, 5, 5)
  got = check(lambda t: t.relu().max_pool2d(2, 1, 2), lambda a: np_pool(np.maximum(a, 0), 2, 1, 2, 1, "max"), x)
  assert np.isneginf(got[..., 0, :]).all() and np.isneginf(got[..., :, -1]).all()

def test_int_max_pool_over_relu(rng: np.random.Generator) -> None:
  x = randi(rng, 1, 2, 6, 6)
  check(lambda t: t.relu().max_pool2d(3, 2, 1), lambda a: np_pool(np.maximum(a, 0).astype(np.float64), 3, 2, 1, 1, "max").astype(np.int32), x)
