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

# ---- values computed from thread ids alone (no loads) -------------------------------------------
def _id_only(dev, dt, shift):
  x = Tensor.arange(8, device=dev, dtype=dt) * (1 << shift)
  return [x + 7, ((x * 3) < 5).cast(dtypes.int32) + (-x < 0).cast(dtypes.int32) * 2]

@pytest.mark.opencl
@pytest.mark.parametrize("np_dt,dt,shift", [(np.int32, dtypes.int32, 30), (np.int64, dtypes.int64, 62)], ids=["int32", "int64"])
def test_id_only_overflow_wraps_like_numpy_on_opencl(np_dt, dt, shift):
  """arange(8) * 2**30 overflows int32 without touching data: numpy wraps it, so must the kernel."""
  x = np.arange(8, dtype=np_dt) * np_dt(1 << shift)
  with np.errstate(over="ignore"): want = [x + np_dt(7), ((x * np_dt(3)) < 5).astype(np.int32) + (-x < 0).astype(np.int32) * 2]
  for got, w in zip(_id_only("OPENCL", dt, shift), want): np.testing.assert_array_equal(got.numpy(), w)

@pytest.mark.parametrize("ren,unsigned", [(OpenCLRenderer(), "as_uint"), (CUDARenderer(), "unsigned"),
                                          (HIPRenderer(), "unsigned"), (MetalRenderer(), "uint")], ids=lambda x: type(x).__name__)
def test_id_only_overflow_renders_unsigned(ren, unsigned):
  """The id-only products that can pass INT_MAX (and what is computed from them) wrap; the id
  arithmetic that provably fits stays signed."""
  from tilecraft.codegen.uops import UOps
  from tilecraft.ops import BinaryOps, UnaryOps
  for si in _id_only("CPU", dtypes.int32, 30)[1].schedule():
    k = Kernel(si.ast, opts=ren).hand_coded_optimizations()
    src = k.to_program().src
    wrapped = ren.wrapping_alus(k.uops)
    muls = [u for u in k.uops if u.op is UOps.ALU and u.arg is BinaryOps.MUL and u.dtype.scalar() == dtypes.int32]
    big = [u for u in muls if any(1073741824 in (s.arg if isinstance(s.arg, tuple) else (s.arg,)) for s in u.src + tuple(x for s in u.src for x in s.src) if s.op is UOps.CONST)]
    assert big and all(u in wrapped for u in big), src
    assert any(u.arg is UnaryOps.NEG for u in wrapped), src  # -x of a wrapped value
    assert not any(u.arg is BinaryOps.MUL and u.src[1].op is UOps.CONST and u.src[1].arg == 4 for u in wrapped), src  # lidx0*4: an address
    assert unsigned in src, src

def test_index_math_of_the_corpus_stays_signed():
  """Interval analysis proves every corpus kernel's index math fits its type: no ALU that an
  address is computed from renders through the unsigned type (testing/corpus.py, hand-coded opts)."""
  from tilecraft.codegen.uops import UOps
  from tilecraft.testing.corpus import corpus
  ren = OpenCLRenderer()
  for name, e in corpus(small=True).items():
    k = Kernel(e.ast, opts=ren).hand_coded_optimizations().linearize()
    addr, todo = set(), [u.src[1] for u in k.uops if u.op in (UOps.LOAD, UOps.STORE) and len(u.src) > 1]
    while todo:
      if (u := todo.pop()) not in addr and u.op is not UOps.LOAD: addr.add(u); todo.extend(u.src)
    assert not addr & ren.wrapping_alus(k.uops), name

@pytest.mark.opencl
@pytest.mark.parametrize("np_dt", [np.int32, np.int64], ids=["int32", "int64"])
def test_min_over_minus_one_wraps_like_numpy_on_opencl(np_dt):
  """MIN // -1 overflows (the hardware traps or gives garbage); numpy wraps to MIN, and MIN % -1 is 0."""
  lo = np.iinfo(np_dt).min
  a = np.array([lo, lo, lo + 1, 7, -7, lo, 0, 5], np_dt)
  b = np.array([-1, 1, -1, -1, 2, 0, -1, -2], np_dt)
  with np.errstate(all="ignore"): want = (a // b, a % b)
  ta, tb = Tensor(a, device="OPENCL"), Tensor(b, device="OPENCL")
  np.testing.assert_array_equal((ta // tb).numpy(), want[0])
  np.testing.assert_array_equal((ta % tb).numpy(), want[1])
