"""engine/realize.py's BoundSchedule: a schedule rerun on its own buffers (what an ONNX model's capture
launches) gives what run_schedule gives for the new data in its inputs, for kernels, a cross-device COPY
and a kernel with a Variable (its var_vals kept), and counts its kernels."""
from __future__ import annotations
import numpy as np
from tilecraft import Tensor, Variable
from tilecraft.engine import realize
from tilecraft.engine.realize import BoundSchedule, run_schedule
from tilecraft.ops import MetaOps

def _rerun(inp: Tensor, out: Tensor, data: list[np.ndarray], expect: object) -> BoundSchedule:
  sched = out.schedule()
  run_schedule(sched)
  bound = BoundSchedule(sched)
  for x in data:
    inp.lazydata.buffer.copyin(x)
    k0 = realize.kernel_count
    bound.run()
    assert realize.kernel_count - k0 == bound.kernels == sum(si.ast.op is not MetaOps.COPY for si in sched)
    np.testing.assert_allclose(out.lazydata.base.buffer.numpy()[:out.numel()].reshape(out.shape), expect(x), rtol=1e-6)  # type: ignore[operator]
  return bound

def test_rerun_kernels_and_copy() -> None:
  rng = np.random.default_rng(0)
  a = Tensor(rng.standard_normal((4, 8)).astype(np.float32), device="CPU")
  out = ((a.to("PYTHON") * 2).sum(1) + 1).contiguous()
  bound = _rerun(a, out, [rng.standard_normal((4, 8)).astype(np.float32) for _ in range(2)], lambda x: (x * 2).sum(1) + 1)
  assert any(si.ast.op is MetaOps.COPY for si in bound.schedule) and bound.kernels >= 1

def test_rerun_kernel_with_a_variable() -> None:
  rng = np.random.default_rng(1)
  a = Tensor(rng.standard_normal((5, 8)).astype(np.float32))
  n = Variable("n", 1, 8)
  out = (a.shrink(((0, 5), (0, n.bind(3)))) * 2 + 1).sum(1).contiguous()
  bound = _rerun(a, out, [rng.standard_normal((5, 8)).astype(np.float32) for _ in range(2)], lambda x: (x[:, :3] * 2 + 1).sum(1))
  assert any(si.var_vals for si in bound.schedule)
