"""The C renderer's streaming (non-temporal) stores: used for big outputs the kernel never reads,
fenced in every thread, and correct whatever the alignment of the buffers (a misaligned one takes
the plain store at run time). CPU_STREAM_MIN_BYTES=0 streams every store that may stream, so small
kernels exercise the path."""
import collections
import numpy as np
import pytest
from tilecraft import Context, Tensor
from tilecraft.codegen.kernel import Kernel, OptOps
from tilecraft.device import Device
from tilecraft.host import cpu_target
from tilecraft.testing import fuzz
from tilecraft.testing.corpus import corpus
from op_checks import require_arch

ARCHS = ("native", "haswell")
X86 = cpu_target().isa in ("AVX-512", "AVX2", "AVX", "SSE")
pytestmark = pytest.mark.skipif(not X86, reason="streaming stores are an x86 feature of the C renderer")

def _program(t: Tensor):
  k = Kernel(t.schedule()[-1].ast, Device["CPU"].renderer).hand_coded_optimizations()
  return k.to_program()

@pytest.mark.parametrize("arch", ARCHS)
def test_big_elementwise_output_streams_and_fences(arch):
  n = 1 << 23  # 32 MiB written
  with Context(CPU_ARCH=arch):
    src = _program(Tensor.empty(n) + Tensor.empty(n)).src
    op = "_mm512_stream_ps" if cpu_target().isa == "AVX-512" else "_mm256_stream_ps"
  assert "tc_stream_float" in src and op in src
  # each thread fences after its share of the loop (nowait), before the region's closing barrier
  loop, fence = src.index("#pragma omp for schedule(static) nowait"), src.index("_mm_sfence();")
  assert src.index("#pragma omp parallel\n") < loop < fence

def test_small_output_stores_plainly_unless_asked():
  t = Tensor.empty(4096) * 2
  assert "tc_stream" not in _program(t).src and "sfence" not in _program(t).src
  with Context(CPU_STREAM_MIN_BYTES=0): assert "tc_stream" in _program(t).src

def test_no_streaming_into_an_output_the_kernel_reads():
  # the blocked matmul accumulates in its output (loads it back), so it must keep its stores cached
  # (a reduce of 8192: its panel is too big to PACK whole, so the matmul rule blocks it)
  with Context(CPU_STREAM_MIN_BYTES=0):
    p = _program(Tensor.empty(256, 8192) @ Tensor.empty(8192, 256))
  assert any(o.op is OptOps.BLOCK for o in p.applied_opts), p.applied_opts
  assert "(data0+" in p.src.split("{", 2)[2] and "tc_stream" not in p.src

def test_scalar_stores_stay_plain():
  with Context(CPU_STREAM_MIN_BYTES=0): src = _program(Tensor.empty(7, 5).sum(1)).src  # one scalar per row
  assert "tc_stream" not in src and "sfence" not in src

@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("offset", [0, 4, 32])
def test_any_buffer_alignment_is_correct(arch, offset, rng):
  """Buffers that start `offset` bytes past a 64-byte boundary: a misaligned one takes the plain store."""
  require_arch(arch)
  n = 4096
  with Context(CPU_ARCH=arch, CPU_STREAM_MIN_BYTES=0):
    t = Tensor.empty(n) * Tensor.empty(n) + Tensor.empty(n)
    p = _program(t)
    assert "tc_stream" in p.src
    prog = Device["CPU"].runtime(p.name, Device["CPU"].compiler.compile_cached(p.src))
  guard = 64
  raw = [np.zeros(n + 2 * guard + 32, np.float32) for _ in range(4)]
  def at(a):  # a view of n floats `offset` bytes past a 64-byte boundary, inside a guard zone
    start = (-a.ctypes.data % 64 + offset) // 4 + guard
    return a[start:start + n]
  out, a, b, c = (at(r) for r in raw)
  for x in (a, b, c): x[:] = rng.standard_normal(n).astype(np.float32)
  raw[0][:] = np.nan
  out = at(raw[0])
  prog(*[x.ctypes.data for x in (out, a, b, c)])
  np.testing.assert_allclose(out, a * b + c, rtol=1e-6, atol=1e-6)
  outside = np.ones(raw[0].size, bool)
  outside[out.ctypes.data // 4 - raw[0].ctypes.data // 4 + np.arange(n)] = False
  assert np.isnan(raw[0][outside]).all()  # nothing written outside the output

ENTRIES = ("ew_50257", "ew_broadcast_7x25", "ew_permute_7x25x49", "ew_transposed_store_9x14", "arith_double", "arith_long", "cast_int32_to_all",
           "multi_output_9x12", "sum_axis2_5x7x9", "matmul_16x16x16")

@pytest.mark.fuzz
@pytest.mark.parametrize("arch", ARCHS)
def test_fuzz_with_every_store_streaming(arch, monkeypatch):
  """Random opts on corpus kernels, every allowed store streaming: the same outputs as the unoptimized
  kernel and numpy, with guard zones."""
  require_arch(arch)
  monkeypatch.setattr(fuzz, "_program_cache", collections.OrderedDict())  # programs rendered under these settings only
  streamed = []
  get_program = fuzz.get_program
  def recording(*a, **kw):
    p = get_program(*a, **kw)
    streamed.append("tc_stream" in p.src)
    return p
  monkeypatch.setattr(fuzz, "get_program", recording)
  entries = corpus()
  names = [n for n in ENTRIES if n in entries]
  assert len(names) == len(ENTRIES), set(ENTRIES) - set(names)
  with Context(CPU_ARCH=arch, CPU_STREAM_MIN_BYTES=0):
    for i, name in enumerate(names):
      rep = fuzz.fuzz_ast(entries[name], np.random.default_rng(i), 5)
      assert not rep.failures, rep.failures[0]
  assert sum(streamed) >= 5, "the fuzzed kernels hardly used streaming stores"
