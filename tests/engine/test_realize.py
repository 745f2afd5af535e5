"""run_schedule (engine/realize.py): it looks runners and launch arguments up before launching, and
marks outputs realized at the end; a kernel that fails leaves the items before it realized, itself not."""
from __future__ import annotations
import numpy as np
import pytest
from tilecraft import Tensor
from tilecraft.engine.realize import get_runner, run_schedule

def test_a_failing_kernel_leaves_the_earlier_ones_realized(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
  x = rng.standard_normal((8, 16)).astype(np.float32)
  Tensor(x).softmax(-1).realize()  # compiled and loaded
  out = Tensor(x).softmax(-1)
  sched = out.schedule()
  assert len(sched) == 2  # the statistics (max and 1/sum: one kernel, two outputs) and the output
  last = get_runner(sched[-1].ast, sched[-1].bufs[0].device)
  def broken(*args: object, **kw: object) -> None: raise RuntimeError("launch failed")
  monkeypatch.setattr(last, "clprg", broken)
  with pytest.raises(RuntimeError, match="launch failed"): run_schedule(sched)
  assert [all(lb.realized for lb in si.outputs) for si in sched] == [True, False]
  monkeypatch.undo()
  run_schedule(out.schedule())  # what is left: the last kernel, reading the realized statistics
  e = np.exp(x - x.max(-1, keepdims=True))
  np.testing.assert_allclose(out.numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)

def test_a_runner_compiled_at_its_turn(rng: np.random.Generator) -> None:
  """A kernel seen for the first time is compiled when its turn comes, after the items it reads ran."""
  x = rng.standard_normal((5, 7)).astype(np.float32)
  out = (Tensor(x) * 3.25).softmax(-1)  # a scale no other test uses: new kernels
  e = np.exp(x * 3.25 - (x * 3.25).max(-1, keepdims=True))
  np.testing.assert_allclose(out.numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
