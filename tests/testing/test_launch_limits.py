"""An opt is applied whole or refused (issue 27 item 5): every launch limit of the target is checked
when the opt is applied, and a refusal names the limit. Threads per workgroup, local memory of a
grouped reduce (sized by the reduce's dtype, not the output's) and TC use 3's fragment staging.
The property: an opt list apply_opt accepts never fails at launch on the PYTHON device under
EMULATE=CUDA, METAL and AMD (tilecraft.testing.launch_check.launch_errors; more sequences in the slow tier)."""
import numpy as np
import pytest
from tilecraft.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tilecraft.device import Device
from tilecraft.dtype import dtypes
from tilecraft.helpers import Context
from tilecraft.testing.launch_check import launch_error, launch_errors, launch_kernels

KERNELS = launch_kernels()

def _apply(k: Kernel, opts: list) -> None:
  for o in opts: k.apply_opt(o)

def test_group_buffer_is_sized_by_the_reduce_dtype():
  """bool(sum(x) > 0): 256 x 16 x 4 float32 partials are 64 KB, over CUDA's 48 KB (1-byte bools would be 16 KB)."""
  ast = KERNELS["bool_of_sum_256x1024"]
  with Context(EMULATE="CUDA"):
    k = Kernel(ast, opts=Device["PYTHON"].renderer)
    _apply(k, [Opt(OptOps.GROUPTOP, 0, 256), Opt(OptOps.UPCAST, 0, 16)])
    before = (k.sts, k.applied_opts[:])
    with pytest.raises(KernelOptError, match="local memory of 65536 bytes.*shared_max 49152"): k.apply_opt(Opt(OptOps.LOCAL, 0, 4))
    assert (k.sts, k.applied_opts) == before
    # one step smaller fits, and launches
    k.apply_opt(Opt(OptOps.LOCAL, 0, 2))
    assert launch_error(ast, k.applied_opts, kernel=k) is None

def test_half_output_of_a_float_reduce():
  with Context(EMULATE="METAL"):
    k = Kernel(KERNELS["half_of_sum_128x2048"], opts=Device["PYTHON"].renderer)
    _apply(k, [Opt(OptOps.GROUPTOP, 0, 256), Opt(OptOps.UPCAST, 0, 16)])
    with pytest.raises(KernelOptError, match="local memory of 65536 bytes"): k.apply_opt(Opt(OptOps.LOCAL, 0, 4))
    k.apply_opt(Opt(OptOps.LOCAL, 0, 2))  # 32 KB: exactly what Metal has

def test_tc_use3_staging_is_checked():
  """CUDA use 3 stages A (4 regs) and B (8 regs) of half per lane, 32 lanes, 16 warps, two halves, per
  upcast combination: with 4 of them that is 96 KB (refused); with 2, 48 KB (accepted, and it launches)."""
  ast = KERNELS["matmul_half_float_128x128x64"]
  base = [Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.LOCAL, 1, 4), Opt(OptOps.UPCAST, 0, 2)]
  with Context(EMULATE="CUDA"):
    ren = Device["PYTHON"].renderer
    k = Kernel(ast, opts=ren)
    # (the TC's N is axis 1, as in the reference: after the first UPCAST 0 2 takes all of axis 0, axis 0 is the N outer axis)
    assert k.apply_tensor_cores(3, base + [Opt(OptOps.UPCAST, 0, 2)], tc_opt=1) is False  # declined, as the reference does
    assert not k.applied_opts and k.tensor_core is None
    assert k.apply_tensor_cores(3, base, tc_opt=1)
    with pytest.raises(KernelOptError, match="local memory of 98304 bytes.*shared_max 49152"): k.copy().apply_opt(Opt(OptOps.UPCAST, 0, 2))
    assert k._tc_staging_bytes() == 49152
    assert launch_error(ast, k.applied_opts, tc_use=3, kernel=k) is None
    # use 1 and 2 stage nothing: the same opts are fine there
    for use in (1, 2): assert Kernel(ast, opts=ren).apply_tensor_cores(use, base + [Opt(OptOps.UPCAST, 0, 2)], tc_opt=1)

def test_threads_per_workgroup():
  with Context(EMULATE="AMD"):
    k = Kernel(KERNELS["bool_of_sum_256x1024"], opts=Device["PYTHON"].renderer)
    k.apply_opt(Opt(OptOps.LOCAL, 0, 256))
    with pytest.raises(KernelOptError, match="workgroup of 2048 threads.*limit of 1024"): k.apply_opt(Opt(OptOps.GROUP, 0, 8))

def test_accepted_opts_launch():
  """The property, default tier: 2 grown opt lists per (target, kernel), checked at launch (~4 s)."""
  fails, checked = launch_errors(KERNELS, 2)
  assert checked >= 20 and not fails, "\n".join(fails[:5])

@pytest.mark.slow
def test_accepted_opts_launch_many():
  fails, checked = launch_errors(KERNELS, 40, seed=1)
  assert checked >= 400 and not fails, "\n".join(fails[:5])
