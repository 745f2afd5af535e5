"""Signed int overflow wraps as in numpy on every target (renderer/cstyle.py: wrapping_alus). It is
undefined behaviour in OpenCL C, CUDA, HIP and Metal, and PoCL's compiler used that: (a+b)<a and
(a+1)>a came out wrong for INT_MAX, in int32 and int64. Arithmetic on data runs through unsigned
types there; index math stays signed; the CPU's C (-fwrapv) is unchanged."""
import re
import numpy as np
import pytest
from tilecraft import Tensor, dtypes
from tilecraft.codegen.kernel import Kernel
from tilecraft.renderer.cstyle import CRenderer, OpenCLRenderer
from tilecraft.renderer.cuda import CUDARenderer
from tilecraft.renderer.hip import HIPRenderer
from tilecraft.renderer.metal import MetalRenderer

def _cases(np_dt):
  info = np.iinfo(np_dt)
  a = np.array([info.max, 5, info.min, 7, info.max, -3, info.min, 0], np_dt)
  b = np.array([1, 3, -1, info.max, info.max, info.min, info.min, info.min], np_dt)
  return a, b

def _flags(a, b):
  """Comparisons whose operands wrap in numpy, one bit each (one fused kernel), and a wrapping product."""
  bits = (((a + b) < a), ((a + 1) > a), ((a - b) < a), (-a < 0), ((a * b) >= 0))
  return sum((x.astype(np.int32) if isinstance(x, np.ndarray) else x.cast(dtypes.int32)) * (1 << i) for i, x in enumerate(bits)), a * b + 1

@pytest.mark.opencl
@pytest.mark.parametrize("np_dt", [np.int32, np.int64], ids=["int32", "int64"])
def test_overflow_wraps_like_numpy_on_opencl(np_dt):
  a, b = _cases(np_dt)
  with np.errstate(over="ignore"): want = _flags(a, b)
  got = [t.numpy() for t in _flags(Tensor(a, device="OPENCL"), Tensor(b, device="OPENCL"))]
  np.testing.assert_array_equal(got[0], want[0])  # bit i set: comparison i is true (see _flags)
  np.testing.assert_array_equal(got[1], want[1])

def _srcs(ren):
  a, b = Tensor.empty(64, dtype=dtypes.int32, device="CPU"), Tensor.empty(64, dtype=dtypes.int32, device="CPU")
  return [Kernel(si.ast, opts=ren).hand_coded_optimizations().to_program().src for si in (((a + b) < a) & ((-a * b).sum() < 3)).schedule()]

@pytest.mark.parametrize("ren,unsigned", [(OpenCLRenderer(), "as_uint("), (CUDARenderer(), "(unsigned int)"),
                                          (HIPRenderer(), "(unsigned int)"), (MetalRenderer(), "(uint)")], ids=lambda x: type(x).__name__)
def test_data_arithmetic_renders_unsigned_index_math_stays_signed(ren, unsigned):
  srcs = _srcs(ren)
  joined = "\n".join(srcs)
  assert unsigned in joined and "+" in joined
  # every signed +, - or * on loaded data goes through the unsigned type; ids and offsets stay plain signed C
  assert not re.search(r"\bval\d+\s*[-+*]|[-+*]\s*val\d+\b", joined), joined
  assert re.search(r"\([lg]idx0\*\d+\)", joined) and re.search(r"\(alu\d+\+\d+\)", joined), joined
  # a float kernel is untouched
  x = Tensor.empty(16, 16, device="CPU")
  assert unsigned not in Kernel((x @ x).schedule()[-1].ast, opts=ren).hand_coded_optimizations().to_program().src

def test_cpu_c_keeps_plain_arithmetic():
  """The CPU's C is built with -fwrapv: signed overflow wraps there already."""
  assert not any("unsigned int)" in s for s in _srcs(CRenderer()))

def test_wrapping_sources_compile_for_cuda_and_hip(cuda_compiler_ok, hip_clang_ok):
  from tilecraft.runtime.cuda import CUDACompiler
  from tilecraft.runtime.hip import HIPCompiler
  CUDACompiler("sm_80").compile_batch(_srcs(CUDARenderer()))
  HIPCompiler().compile_batch(_srcs(HIPRenderer()))
