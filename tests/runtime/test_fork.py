"""fork after first use (issue 28, item 7): a `multiprocessing` child started by fork (the default
start method on Linux) after the parent ran kernels must run its own kernels (CPU, LLVM) or get a clear
error (OPENCL: drivers are not fork-safe) -- never hang. Each child has a deadline; a hang fails."""
from __future__ import annotations
import multiprocessing as mp
import os
from typing import Any
import numpy as np
import pytest
from tilecraft import Tensor

CHILD_DEADLINE_S = 60

def _child_work(device: str, q: Any) -> None:
  try:
    a = Tensor(np.full((256, 256), 0.5, np.float32), device=device)
    out = ((a @ a).relu() * 2).contiguous()
    q.put(("ok", float(out.numpy()[3, 7]), float((a + 1).sum().numpy())))
  except Exception as e:  # noqa: BLE001
    q.put(("err", type(e).__name__, str(e)))

def _in_forked_child(device: str) -> tuple:
  """What _child_work reports from a child forked now; fails the test if the child hangs."""
  ctx = mp.get_context("fork")
  q = ctx.Queue()
  p = ctx.Process(target=_child_work, args=(device, q))
  p.start()
  p.join(CHILD_DEADLINE_S)
  if p.is_alive():
    p.kill()
    p.join()
    pytest.fail(f"a child forked after {device} kernels ran hung in its first kernel")
  assert p.exitcode == 0, f"the forked child died (exit code {p.exitcode})"
  return q.get(timeout=10)

def _parent_runs_parallel_kernels(device: str) -> None:
  # a matmul and a large elementwise kernel: the global loops run on every core (an OpenMP team)
  a = Tensor(np.ones((512, 512), np.float32), device=device)
  np.testing.assert_allclose(((a @ a).relu()).numpy()[0, :3], [512.0] * 3)
  np.testing.assert_allclose((Tensor(np.ones((1 << 20,), np.float32), device=device) * 3).numpy()[:2], [3.0, 3.0])

@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
@pytest.mark.parametrize("device", ["CPU", "LLVM"])
def test_forked_child_runs_kernels_after_the_parent_did(device: str) -> None:
  _parent_runs_parallel_kernels(device)
  res = _in_forked_child(device)
  assert res[0] == "ok", res
  assert res[1] == pytest.approx(128.0) and res[2] == pytest.approx(256 * 256 * 1.5)
  # and the parent still runs on all its threads afterwards
  _parent_runs_parallel_kernels(device)

@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_forked_child_gets_a_clear_opencl_error(require_or_skip: Any) -> None:
  try: _parent_runs_parallel_kernels("OPENCL")
  except Exception as e:  # noqa: BLE001
    require_or_skip("OPENCL", f"{type(e).__name__}: {e}")
  res = _in_forked_child("OPENCL")
  assert res[:2] == ("err", "ForkedOpenCLError"), res
  assert "spawn" in res[2] and "forked" in res[2]
  _parent_runs_parallel_kernels("OPENCL")  # the parent is unaffected
