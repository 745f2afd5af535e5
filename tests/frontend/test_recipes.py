"""frontend/recipes.py: composite methods replayed from a recorded graph build exactly the graph the
method builds, for the inputs and arguments they were recorded with, and never share otherwise."""
from __future__ import annotations
from typing import Any, Callable
import numpy as np
import pytest
from tilecraft import Context, Tensor, dtypes
from tilecraft.ops import BufferOps
from op_checks import np_conv2d, randf

def _asts(t: Tensor) -> list:
  return [si.ast for si in t.schedule()]

def _real(a: np.ndarray) -> Tensor: return Tensor(a).realize()

CASES: list[tuple[str, Callable, Callable]] = [  # (name, make inputs, the call)
  ("softmax", lambda r: [randf(r, 6, 10)], lambda x: x.softmax(-1)),
  ("log_softmax", lambda r: [randf(r, 6, 10)], lambda x: x.log_softmax(0)),
  ("layernorm", lambda r: [randf(r, 6, 10)], lambda x: x.layernorm(-1)),
  ("matmul", lambda r: [randf(r, 5, 7), randf(r, 7, 3)], lambda a, b: a @ b),
  ("conv2d", lambda r: [randf(r, 1, 2, 6, 6), randf(r, 3, 2, 3, 3), randf(r, 3)], lambda x, w, b: x.conv2d(w, b, padding=1)),
  ("max_pool2d", lambda r: [randf(r, 1, 2, 6, 6)], lambda x: x.max_pool2d(2)),
  ("sum", lambda r: [randf(r, 1 << 16)], lambda x: x.sum()),
  ("mean", lambda r: [randf(r, 6, 10)], lambda x: x.mean(1, keepdim=True)),
]

@pytest.mark.parametrize("name,make,call", CASES, ids=[c[0] for c in CASES])
def test_a_replayed_graph_is_the_built_one(name: str, make: Callable, call: Callable, rng: np.random.Generator) -> None:
  first = [_real(a) for a in make(rng)]
  ref = call(*first).numpy()
  arrays = make(rng)
  again = [_real(a) for a in arrays]  # other realized inputs of the same kind: a replay
  replayed = call(*again)
  with Context(RECIPES=0):  # a fresh build through the ordinary path
    built = call(*[_real(a) for a in arrays])
  assert _asts(replayed) == _asts(built)
  np.testing.assert_allclose(replayed.numpy(), built.numpy(), rtol=1e-6, atol=1e-6)
  assert ref.shape == replayed.numpy().shape
  # the first result is its own buffer: the replay didn't write into it
  np.testing.assert_allclose(call(*first).numpy(), ref, rtol=1e-6, atol=1e-6)

def test_recipes_never_share_between_different_calls(rng: np.random.Generator) -> None:
  a, b = randf(rng, 6, 6), randf(rng, 6, 6)
  ta, tb = _real(a), _real(b)
  for _ in range(2):  # the second round replays each
    np.testing.assert_allclose((ta @ ta).numpy(), a @ a, rtol=1e-5)
    np.testing.assert_allclose((ta @ tb).numpy(), a @ b, rtol=1e-5)
    np.testing.assert_allclose((ta.T @ tb).numpy(), a.T @ b, rtol=1e-5)  # a view of an input
    np.testing.assert_allclose(ta.softmax(0).numpy(), np.exp(a) / np.exp(a).sum(0), rtol=1e-5)
    np.testing.assert_allclose(ta.softmax(1).numpy(), np.exp(a) / np.exp(a).sum(1, keepdims=True), rtol=1e-5)
    z = np.zeros((2, 3), np.float32)
    for eps in (0.0, -0.0, 1e-5):  # floats are keyed by their bits
      got = _real(z).layernorm(-1, eps=eps).numpy()
      assert np.isnan(got).all() if eps == 0.0 else np.isfinite(got).all()
    h = rng.standard_normal((6, 6)).astype(np.float16)
    np.testing.assert_allclose(_real(h).sum(1).numpy(), h.astype(np.float32).sum(1), rtol=1e-2)  # another dtype, another recipe
    np.testing.assert_allclose(ta.sum(1, dtype=dtypes.float64).numpy(), a.astype(np.float64).sum(1), rtol=1e-6)

def test_unrealized_or_odd_inputs_take_the_ordinary_path(rng: np.random.Generator) -> None:
  from tilecraft.frontend.nn import NNOps
  cache: dict = NNOps.softmax.cache
  cache.clear()
  x = randf(rng, 4, 5)
  (Tensor(x) + 1).softmax(-1).numpy()  # an unrealized input: no recipe
  assert len(cache) == 0
  t = _real(x)
  t.softmax(np.int64(-1))  # a numpy int argument: not a plain value
  assert len(cache) == 0
  t.softmax(-1)
  assert len(cache) == 1
  with Context(IMAGE=1): t.softmax(-1)  # a setting the frontend reads is part of the key
  assert len(cache) == 2

def test_errors_are_still_raised_after_a_recipe(rng: np.random.Generator) -> None:
  w = _real(randf(rng, 3, 2, 3, 3))
  x = _real(randf(rng, 1, 2, 6, 6))
  x.conv2d(w, padding=1)
  x.conv2d(w, padding=1)
  with pytest.raises(ValueError, match="channels"): _real(randf(rng, 1, 4, 6, 6)).conv2d(w, padding=1)
  with pytest.raises(ValueError, match="line up"): _real(randf(rng, 2, 3)) @ _real(randf(rng, 4, 2))
  np.testing.assert_allclose(x.conv2d(w, padding=1).numpy(), np_conv2d(x.numpy(), w.numpy(), None, 1, 1, 1, 1), rtol=1e-5, atol=1e-5)

def test_a_recipe_keeps_no_buffers_alive(rng: np.random.Generator) -> None:
  import gc, weakref
  t = _real(randf(rng, 8, 8))
  t.layernorm(-1).numpy()
  out = t.layernorm(-1).realize()
  ref = weakref.ref(out.lazydata.base.buffer)
  del out
  gc.collect()
  assert ref() is None

@pytest.mark.parametrize("name,make,call", CASES, ids=[c[0] for c in CASES])
def test_a_replayed_result_frees_its_memory_when_dropped(name: str, make: Callable, call: Callable, rng: np.random.Generator) -> None:
  """No reference cycle keeps a replayed graph alive: dropping the result frees its buffers at once (to
  the caching allocator, for the next call to reuse), not at the next garbage collection."""
  import gc, weakref
  ins = [_real(a) for a in make(rng)]
  for _ in range(3): call(*ins).realize()
  gc.collect()
  gc.disable()
  try:
    out = call(*ins)
    base = weakref.ref(out.lazydata.base)
    out.realize()
    buf = weakref.ref(out.lazydata.base.buffer)
    del out
    assert base() is None and buf() is None
    out = call(*ins)  # dropped unrealized
    base = weakref.ref(out.lazydata.base)
    del out
    assert base() is None
  finally: gc.enable()

def test_replays_share_only_constants(rng: np.random.Generator) -> None:
  """Constants and their views are made once per recipe and shared by later replays; every other node is new."""
  xs = [randf(rng, 6, 10) for _ in range(4)]
  outs = [_real(x).layernorm(-1) for x in xs]  # recorded, then replayed three times
  nodes = [o.lazydata.base.replayed[1] for o in outs[1:]]
  def consts(ns: list) -> list: return [n for n in ns if n is not None and (n.base.op is BufferOps.CONST)]
  assert consts(nodes[0]) and all(a is b for a, b in zip(consts(nodes[1]), consts(nodes[2])))
  others = [[id(n) for n in ns if n is not None and n.base.op is not BufferOps.CONST and n.base.op is not None] for ns in nodes[1:]]
  assert others[0] and not set(others[0]) & set(others[1])
  for x, o in zip(xs, outs):
    xc = x - x.mean(-1, keepdims=True)
    np.testing.assert_allclose(o.numpy(), xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + 1e-5), rtol=1e-5, atol=1e-5)
