"""The schedule cache (engine/schedule.py, its templates in engine/plan_cache.py): a graph built again with the same structure over new inputs
gets the cached schedule (the same AST objects), which must be exactly the schedule the scheduler
would build for it; graphs that differ in anything the scheduler reads must not share one."""
from __future__ import annotations
import gc, weakref
from typing import Any, Callable
import numpy as np
import pytest
from tilecraft import Tensor, Variable, dtypes
from tilecraft.engine import plan_cache, schedule as S

def _inputs(rng: np.random.Generator, shapes: list[tuple[int, ...]], dtype: Any = np.float32) -> list[Tensor]:
  return [Tensor(rng.uniform(-2, 2, s).astype(dtype)).realize() for s in shapes]

def _signature(items: list, ins: list[Tensor]) -> list[tuple]:
  """Each item's AST and its buffers as roles: the k-th input, or the n-th buffer the schedule made."""
  inputs = {id(t.lazydata.base.buffer): k for k, t in enumerate(ins)}
  made: dict[int, int] = {}
  def role(b: Any) -> tuple:
    if id(b) in inputs: return ("in", inputs[id(b)])
    return ("new", made.setdefault(id(b), len(made)), b.size, b.dtype)
  return [(si.ast, tuple(role(b) for b in si.bufs), tuple(sorted(si.var_vals.items(), key=str))) for si in items]

def _fresh(fn: Callable, ins: list[Tensor]) -> list:
  """The schedule the scheduler builds without the cache."""
  plan_cache.clear()
  return fn(*ins).schedule()

GRAPHS: dict[str, tuple[list[tuple[int, ...]], Callable]] = {
  "relu chain": ([(4, 5), (4, 5), (5,)], lambda a, b, c: (a * b + c).relu()),
  "matmul": ([(6, 7), (7, 3)], lambda a, b: a @ b),
  "shared input": ([(8,), (8,)], lambda a, b: a * a + b),
  "same graph other input": ([(8,), (8,)], lambda a, b: a * b + b),
  "softmax": ([(5, 9)], lambda x: x.softmax(-1)),
  "reduce read twice": ([(6, 4)], lambda x: x - x.sum(1, keepdim=True) * x.max(1, keepdim=True)),
  "permuted view": ([(3, 4), (4, 3)], lambda a, b: a + b.permute(1, 0)),
  "pad through exp": ([(5,)], lambda a: a.pad(((1, 2),)).exp()),
  "contiguous in the middle": ([(4, 4)], lambda a: (a * 2).contiguous().permute(1, 0) + 1),
  "split reduce": ([(1 << 16,)], lambda a: a.sum()),
  "arange": ([(7,)], lambda a: a + Tensor.arange(7)),
}

@pytest.mark.parametrize("name", list(GRAPHS))
def test_cached_schedule_is_the_schedule(name: str, rng: np.random.Generator) -> None:
  shapes, fn = GRAPHS[name]
  plan_cache.clear()
  first = fn(*_inputs(rng, shapes)).schedule()
  ins = _inputs(rng, shapes)
  cached = fn(*ins).schedule()
  assert [si.ast for si in cached] and all(a.ast is b.ast for a, b in zip(cached, first)), "the second build did not hit the cache"
  ins2 = _inputs(rng, shapes)
  assert _signature(cached, ins) == _signature(_fresh(fn, ins2), ins2)

@pytest.mark.parametrize("name", ["relu chain", "shared input", "same graph other input", "reduce read twice", "split reduce"])
def test_cached_schedule_computes_the_same(name: str, rng: np.random.Generator) -> None:
  shapes, fn = GRAPHS[name]
  plan_cache.clear()
  ins = _inputs(rng, shapes)
  want = fn(*ins).numpy()
  for _ in range(2):  # from the cache: new outputs each call, the same values
    ins2 = [Tensor(t.numpy()).realize() for t in ins]
    np.testing.assert_array_equal(fn(*ins2).numpy(), want)

PAIRS: dict[str, tuple[list[tuple[int, ...]], Callable, Callable]] = {
  "-0.0 vs 0.0": ([(4,)], lambda a: (a > 5).where(a, 0.0), lambda a: (a > 5).where(a, -0.0)),
  "a*a vs a*b": ([(4,), (4,)], lambda a, b: a * a, lambda a, b: a * b),
  "axis 0 vs 1": ([(3, 4)], lambda a: a.sum(0), lambda a: a.sum(1)),
  "view vs none": ([(4, 4)], lambda a: a + a, lambda a: a + a.permute(1, 0)),
  "contiguous": ([(4, 4)], lambda a: (a * 2).permute(1, 0) + 1, lambda a: (a * 2).contiguous().permute(1, 0) + 1),
  "int vs float const": ([(4,)], lambda a: a.cast(dtypes.int32) + 1, lambda a: a.cast(dtypes.int32).cast(dtypes.float32) + 1.0),
  "cast dtype": ([(4,)], lambda a: a.cast(dtypes.float16), lambda a: a.cast(dtypes.int8)),
}

@pytest.mark.parametrize("name", list(PAIRS))
def test_different_structures_do_not_share(name: str, rng: np.random.Generator) -> None:
  shapes, f, g = PAIRS[name]
  ins = _inputs(rng, shapes)
  assert _signature(_fresh(f, ins), ins) != _signature(_fresh(g, ins), ins)  # the pair really differs
  for fn in (f, g, f, g):  # each built after the other one was cached
    ins = _inputs(rng, shapes)
    got = fn(*ins).schedule()
    ins2 = _inputs(rng, shapes)
    assert _signature(got, ins) == _signature(_fresh(fn, ins2), ins2)

def test_negative_zero_survives_the_cache() -> None:
  plan_cache.clear()
  x = Tensor(np.array([1.0, 7.0], np.float32)).realize()
  for _ in range(2):
    assert list(np.signbit((x > 5).where(x, 0.0).numpy())) == [False, False]
    assert list(np.signbit((x > 5).where(x, -0.0).numpy())) == [True, False]

def test_symbolic_graphs_are_not_cached() -> None:
  n = Variable("n", 1, 10).bind(3)
  t = Tensor(np.arange(10, dtype=np.float32)).realize()
  lb = (t.shrink(((0, n),)) * 2).lazydata
  order, leaves, key = S._walk([lb])
  assert key is None and len(order) >= 1 and len(leaves) == 1

def test_the_cache_keeps_no_buffers_alive(rng: np.random.Generator) -> None:
  plan_cache.clear()
  fn = GRAPHS["relu chain"][1]
  for _ in range(2):
    ins = _inputs(rng, GRAPHS["relu chain"][0])
    out = fn(*ins)
    out.realize()
    refs = [weakref.ref(t.lazydata.base.buffer) for t in ins + [out]] + [weakref.ref(out.lazydata.base)]
    del ins, out
    gc.collect()
    assert all(r() is None for r in refs)
  assert plan_cache.templates

REPLAYED = {  # composites frontend/recipes.py replays: realizing one alone skips the walk after the first time
  "softmax": ([(5, 9)], lambda x: x.softmax(-1)),
  "layernorm": ([(5, 9)], lambda x: x.layernorm(-1)),
  "matmul": ([(6, 7), (7, 3)], lambda a, b: a @ b),
  "conv2d": ([(1, 2, 6, 6), (3, 2, 3, 3)], lambda x, w: x.conv2d(w, padding=1)),
  "split reduce": ([(1 << 16,)], lambda a: a.sum()),
}

@pytest.mark.parametrize("name", list(REPLAYED))
def test_a_replayed_graph_skips_the_walk_for_the_same_schedule(name: str, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
  from tilecraft import Context
  shapes, fn = REPLAYED[name]
  ins = _inputs(rng, shapes)
  with Context(RECIPES=0): want = _signature(_fresh(fn, ins), ins)  # (cold: before the walk is remembered, which clear() forgets)
  for _ in range(2): fn(*_inputs(rng, shapes)).realize()  # recorded, then the walk remembered
  walks = []
  real_walk = S._walk
  monkeypatch.setattr(S, "_walk", lambda outs: walks.append(1) or real_walk(outs))
  out = fn(*ins)
  assert out.lazydata.base.replayed is not None
  assert _signature(out.schedule(), ins) == want and not walks
  # a forced realize added afterwards changes the structure: the walk runs again, and finds the right schedule
  out2 = fn(*ins)
  nodes = out2.lazydata.base.replayed[1]  # (without the output's base and view)
  unforced = [b for b in nodes if b is not None and b._base is None and b.op is not None and not b.forced_realize]
  assert unforced or name == "split reduce"  # (its one other node is forced already)
  if unforced:
    unforced[0].forced_realize = True
    items = out2.schedule()
    assert walks and len(items) == len(want) + 1  # the forced value is a kernel of its own now
  np.testing.assert_allclose(fn(*ins).numpy(), out.realize().numpy(), rtol=1e-6)
