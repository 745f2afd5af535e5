"""codegen/linearize.py: the order of a kernel's UOps. Here: an epilogue's operands (a conv's bias and residual, read
after its reduce) are loaded where they are used, after the reduce loop and inside the output loop, not hoisted
above the loops, where they would hold registers through the reduce."""
import numpy as np
import pytest
from tilecraft import Context, Tensor
from tilecraft.codegen import linearize
from tilecraft.codegen.kernel import Kernel
from tilecraft.codegen.uops import UOps
from tilecraft.device import Device

def _conv_epilogue_uops(arch: str):
  x, w = Tensor(np.ones((1, 64, 28, 28), np.float32)).realize(), Tensor(np.ones((256, 64, 1, 1), np.float32)).realize()
  b, res = Tensor(np.ones(256, np.float32)).realize(), Tensor(np.ones((1, 256, 28, 28), np.float32)).realize()
  with Context(CPU_ARCH=arch):
    si = [s for s in (x.conv2d(w, b) + res).relu().schedule() if s.ast.op.name == "KERNEL"][-1]
    k = Kernel(si.ast, Device["CPU"].renderer).hand_coded_optimizations().linearize()
  return k.uops

def _positions(uops):
  """(index of each global load by buffer arg, [(RANGE index, ENDRANGE index, is reduce)])"""
  loads: dict[int, list[int]] = {}
  for i, u in enumerate(uops):
    if u.op is UOps.LOAD and u.src[0].op is UOps.DEFINE_GLOBAL: loads.setdefault(u.src[0].arg, []).append(i)
  loops = [(i, next(j for j, e in enumerate(uops) if e.op is UOps.ENDRANGE and e.src[0] is u), u.arg[0] == "reduce")
           for i, u in enumerate(uops) if u.op is UOps.RANGE]
  return loads, loops

@pytest.mark.parametrize("arch", ["haswell", "skylake-avx512"])
def test_epilogue_loads_follow_the_reduce_loop(arch):
  loads, loops = _positions(_conv_epilogue_uops(arch))
  reduce_ends = [end for _, end, red in loops if red]
  last_reduce_end = max(reduce_ends)
  inner_output = max((r for r in loops if not r[2] and r[0] < last_reduce_end < r[1]), key=lambda r: r[0])  # the loop around it
  for buf in (3, 4):  # (the bias and the residual: kernel arguments after the image and the weight)
    assert all(last_reduce_end < i < inner_output[1] for i in loads[buf]), (buf, loads[buf], loops)
  keep = linearize.DEFER_AFTER_LOOPS
  linearize.DEFER_AFTER_LOOPS = False
  try: old_loads, old_loops = _positions(_conv_epilogue_uops(arch))
  finally: linearize.DEFER_AFTER_LOOPS = keep
  compute_loop = max(start for start, _, red in old_loops if red)
  assert any(i < compute_loop for i in old_loads[3] + old_loads[4]), "the switch restores the old (hoisted) order"
