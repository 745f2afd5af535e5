"""The plan cache (engine/plan_cache.py): one chain from a graph's shape to a runnable plan, with named
keys; a repeated graph goes key -> plan without scheduling or looking runners up again, clear() makes
the next call cold, and other runner settings pick another plan."""
from __future__ import annotations
import numpy as np
import pytest
from tilecraft import Context, Tensor
from tilecraft.engine import plan_cache, realize, schedule

def _np_layernorm(x: np.ndarray) -> np.ndarray:
  xc = x - x.mean(-1, keepdims=True)
  return xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + 1e-5)

def _delta(before: dict[str, int]) -> dict[str, int]:
  return {k: v - before[k] for k, v in plan_cache.stats().items() if v != before[k]}

def test_a_repeated_graph_goes_from_its_key_to_its_plan(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
  x = rng.standard_normal((6, 40)).astype(np.float32)
  t = Tensor(x).realize()
  kernels = len(t.layernorm(-1).schedule())
  plan_cache.clear()
  for _ in range(3): t.layernorm(-1).realize()  # recorded and scheduled; walk remembered; plan bound
  before = plan_cache.stats()
  def must_not_run(*args: object, **kw: object) -> None: raise AssertionError("a warm call scheduled or looked a runner up")
  with monkeypatch.context() as mp:
    for name in ("_walk", "_decide_realizes", "_build_schedule", "instantiate"): mp.setattr(schedule, name, must_not_run)
    for name in ("get_runner", "run_schedule", "create_schedule", "instantiate", "loaded_runners"): mp.setattr(realize, name, must_not_run)
    out = t.layernorm(-1).realize()
  np.testing.assert_allclose(out.numpy(), _np_layernorm(x), rtol=1e-5, atol=1e-5)
  assert _delta(before) == {"plan_hits": 1}
  # clear(): the next call walks, schedules and loads its runners again, and binds a new plan
  plan_cache.clear()
  assert plan_cache.stats() == dict.fromkeys(plan_cache.stats(), 0)
  np.testing.assert_allclose(t.layernorm(-1).realize().numpy(), _np_layernorm(x), rtol=1e-5, atol=1e-5)
  cold = plan_cache.stats()
  assert cold["walk_hits"] == 0 and cold["graph_misses"] == 1 and cold["runner_misses"] == kernels and cold["templates"] == 1
  for _ in range(2): t.layernorm(-1).realize()
  before = plan_cache.stats()
  t.layernorm(-1).realize()
  assert _delta(before) == {"plan_hits": 1}

def test_other_settings_pick_another_plan(rng: np.random.Generator) -> None:
  x = rng.standard_normal((5, 24)).astype(np.float32)
  t = Tensor(x).realize()
  for _ in range(3): t.layernorm(-1).realize()
  hit = plan_cache.replayed_walk(t.layernorm(-1).lazydata.base, schedule.fuse_reduces())
  assert hit is not None
  plans = hit[0].plans
  hand = realize._settings(t.device)
  assert hand in plans and isinstance(hand, plan_cache.RunnerSettings)
  with Context(NOOPT=1):
    noopt = realize._settings(t.device)
    assert noopt.mode.noopt == 1 and noopt != hand and noopt.mode._replace(noopt=0) == hand.mode
    before = plan_cache.stats()
    for _ in range(2): np.testing.assert_allclose(t.layernorm(-1).realize().numpy(), _np_layernorm(x), rtol=1e-5, atol=1e-5)
    assert _delta(before)["plan_misses"] == 1 and noopt in plans  # one plan made, then run
  assert plans[noopt] is not plans[hand] and plans[hand].launches != plans[noopt].launches

def test_keys_name_their_fields(rng: np.random.Generator) -> None:
  t = Tensor(rng.standard_normal((4, 5)).astype(np.float32)).realize()
  order, leaves, key = schedule._walk([(t * 2 + 1).relu().lazydata])
  assert isinstance(key, plan_cache.GraphKey) and key.fused is schedule.fuse_reduces()
  assert len(key.nodes) == len(order) + len(leaves) and key.outputs == (len(order) - 1,)
  si = (t * 2 + 1).relu().schedule()[-1]
  runner = realize.get_runner(si.ast, t.device)
  assert plan_cache.runners[plan_cache.RunnerKey(si.ast.key, realize._settings(t.device))] is runner
  assert plan_cache.loaded_runners(realize._settings(t.device))[si.ast] is runner

def test_a_full_table_is_emptied_first() -> None:
  t = plan_cache.Table("t", 2)
  for i in range(3): t.put(i, str(i))
  assert dict(t) == {2: "2"}
