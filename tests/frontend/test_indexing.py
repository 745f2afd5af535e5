"""Indexing and joining (tilecraft/frontend/indexing.py) against numpy: __getitem__ with ints,
slices of any step, None and Ellipsis; cat and stack."""
from __future__ import annotations
from typing import Any
import numpy as np
import pytest
from tilecraft import Tensor
from op_checks import F32, check, on_devices, randf, randi

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

def test_cat_and_stack_called_on_a_tensor_keep_it(rng: np.random.Generator) -> None:
  """`a.cat(b)` joins a and b, as `Tensor.cat(a, b)` does (a staticmethod took it as `cat(b)`: a was dropped)."""
  a, b, c = randf(rng, 2, 3), randf(rng, 2, 2), randf(rng, 2, 3)
  check(lambda x, y: x.cat(y, axis=1), lambda x, y: np.concatenate([x, y], 1), a, b)
  check(lambda x, y, z: x.cat(y, z, axis=-1), lambda x, y, z: np.concatenate([x, y, z], -1), a, b, c)
  check(lambda x, y: x.stack(y, axis=1), lambda x, y: np.stack([x, y], 1), a, c)
  assert Tensor.cat.__doc__ and Tensor(a).cat.__doc__  # (help() shows it either way)

@pytest.mark.slow
@pytest.mark.parametrize("idx", INDICES, ids=str)
@pytest.mark.opencl
def test_getitem_opencl_all(idx: Any) -> None:
  check(lambda t: t[idx], lambda a: a[idx], np.arange(120, dtype=F32).reshape(5, 4, 6), device="OPENCL")
