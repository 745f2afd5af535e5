"""The C renderer's masked vector loads and stores (tc_mload_*, tc_mstore_*): every mask pattern reads
exactly the enabled lanes, 0 elsewhere, or writes exactly the enabled lanes, and never touches a
masked-off lane, proven with vectors that straddle a PROT_NONE page before and after the data (an
access of a masked-off lane there would crash). Built for AVX-512 (the host, where it has it), AVX2
(haswell) and plain x86-64 (the lane-by-lane fallback)."""
import ctypes, itertools, mmap, platform
import numpy as np
import pytest
from tilecraft.dtype import dtypes
from tilecraft.helpers import Context
from tilecraft.renderer.cstyle import CRenderer
from tilecraft.runtime.cpu import CPUCompiler, load_library
from op_checks import require_arch

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 ISAs")

DTS = [dtypes.float32, dtypes.int32, dtypes.int64, dtypes.float64]
WIDTHS = [2, 4, 8, 16]

def _source() -> str:
  ren = CRenderer()
  vecs = sorted({d.vec(n) for d in DTS for n in WIDTHS} | {dtypes.int32.vec(n) for n in WIDTHS}, key=lambda d: (d.scalar().name, d.count))
  lines = ["#if defined(__AVX__)", "#include <immintrin.h>", "#endif"]
  lines += [f"typedef {ren.type_names[v.scalar()]} {ren.render_dtype(v)} __attribute__((vector_size({v.itemsize}), aligned({v.scalar().itemsize})));" for v in vecs]
  for d in DTS:
    for n in WIDTHS:
      v = d.vec(n)
      vt, st = ren.render_dtype(v), ren.type_names[d]
      lines += ren._masked_load_helper(v)
      # masks[k]: lane bits of pattern k; offs[k]: the element offset from p that pattern k loads at
      lines += [f"void t_{vt}(const {st}* p, const int* masks, const long long* offs, int n, {st}* out) {{",
                f"  for (int k = 0; k < n; k++) {{ int{n} m; for (int i = 0; i < {n}; i++) m[i] = (masks[k] >> i) & 1 ? (i % 3 ? 1 : -1) : 0;",
                f"    {vt} r = tc_mload_{vt}(p + offs[k], m); __builtin_memcpy(out + k * {n}, &r, sizeof(r)); }}", "}"]
      # stores: pattern k writes lanes of vals[k*n ...] at p + offs[k]
      lines += ren._masked_store_helper(v)
      lines += [f"void s_{vt}({st}* p, const int* masks, const long long* offs, int n, const {st}* vals) {{",
                f"  for (int k = 0; k < n; k++) {{ int{n} m; for (int i = 0; i < {n}; i++) m[i] = (masks[k] >> i) & 1 ? (i % 3 ? 1 : -1) : 0;",
                f"    {vt} v; __builtin_memcpy(&v, vals + k * {n}, sizeof(v)); tc_mstore_{vt}(p + offs[k], m, v); }}", "}"]
  return "\n".join(lines) + "\n"

@pytest.fixture(scope="module", params=["native", "haswell", "x86-64"])
def lib(request):
  require_arch(request.param)
  with Context(CPU_ARCH=request.param): return load_library(CPUCompiler().compile(_source()))

@pytest.fixture(scope="module")
def fenced():
  """Three pages: unreadable, data, unreadable (PROT_NONE through mprotect)."""
  libc = ctypes.CDLL(None, use_errno=True)
  ps = mmap.PAGESIZE
  mem = mmap.mmap(-1, 3 * ps, prot=mmap.PROT_READ | mmap.PROT_WRITE)
  base = ctypes.addressof(ctypes.c_char.from_buffer(mem))
  for page in (0, 2): assert libc.mprotect(ctypes.c_void_p(base + page * ps), ps, 0) == 0, ctypes.get_errno()
  yield mem, base, ps
  for page in (0, 2): libc.mprotect(ctypes.c_void_p(base + page * ps), ps, mmap.PROT_READ | mmap.PROT_WRITE)

def _cases(n: int, elems: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
  """(mask, offset) pairs: every pattern wholly inside the page, and vectors hanging over either
  edge with only their in-page lanes possibly enabled."""
  full = range(1 << n) if n <= 8 else rng.integers(0, 1 << n, 300)
  cases = [(int(m), int(off)) for m in full for off in (0, elems - n)]
  for hang in range(1, n):
    inside = (1 << (n - hang)) - 1  # lanes 0 .. n-hang-1 lie in the page at the end
    for m in itertools.chain([inside, 0], rng.integers(0, 1 << n, 12)):
      cases.append((int(m) & inside, elems - n + hang))  # runs past the end
      cases.append(((int(m) << hang) & ((1 << n) - 1), -hang))  # starts before the beginning
  return [m for m, _ in cases], [o for _, o in cases]

@pytest.mark.parametrize("dt", DTS, ids=lambda d: d.name)
@pytest.mark.parametrize("n", WIDTHS)
def test_masked_load_reads_only_enabled_lanes(lib, fenced, dt, n):
  mem, base, ps = fenced
  rng = np.random.default_rng(n)
  esz = dt.itemsize
  elems = ps // esz
  data = np.frombuffer(mem, dtype=dt.np, count=elems, offset=ps)
  data[:] = (np.arange(elems) * 3 + 1).astype(dt.np)
  masks, offs = _cases(n, elems, rng)
  out = np.zeros(len(masks) * n, dtype=dt.np)
  ct = {dtypes.float32: ctypes.c_float, dtypes.int32: ctypes.c_int32, dtypes.int64: ctypes.c_int64, dtypes.float64: ctypes.c_double}[dt]
  fn = getattr(lib, f"t_{CRenderer().render_dtype(dt.vec(n))}")
  fn(ctypes.cast(base + ps, ctypes.POINTER(ct)), np.array(masks, np.int32).ctypes.data_as(ctypes.POINTER(ctypes.c_int)),
     np.array(offs, np.int64).ctypes.data_as(ctypes.POINTER(ctypes.c_longlong)), len(masks), out.ctypes.data_as(ctypes.POINTER(ct)))
  want = np.zeros_like(out).reshape(-1, n)
  for k, (m, off) in enumerate(zip(masks, offs)):
    for i in range(n):
      if m >> i & 1: want[k, i] = data[off + i]
  np.testing.assert_array_equal(out.reshape(-1, n), want)

@pytest.mark.parametrize("dt", DTS, ids=lambda d: d.name)
@pytest.mark.parametrize("n", WIDTHS)
def test_masked_store_writes_only_enabled_lanes(lib, fenced, dt, n):
  mem, base, ps = fenced
  rng = np.random.default_rng(n + 100)
  elems = ps // dt.itemsize
  data = np.frombuffer(mem, dtype=dt.np, count=elems, offset=ps)
  data[:] = (np.arange(elems) * 3 + 1).astype(dt.np)
  masks, offs = _cases(n, elems, rng)
  vals = (rng.integers(-1000, 1000, len(masks) * n) * 2 + 1).astype(dt.np)  # odd: never equal to what the page holds
  want = data.copy()
  for k, (m, off) in enumerate(zip(masks, offs)):
    for i in range(n):
      if m >> i & 1: want[off + i] = vals[k * n + i]
  ct = {dtypes.float32: ctypes.c_float, dtypes.int32: ctypes.c_int32, dtypes.int64: ctypes.c_int64, dtypes.float64: ctypes.c_double}[dt]
  fn = getattr(lib, f"s_{CRenderer().render_dtype(dt.vec(n))}")
  fn(ctypes.cast(base + ps, ctypes.POINTER(ct)), np.array(masks, np.int32).ctypes.data_as(ctypes.POINTER(ctypes.c_int)),
     np.array(offs, np.int64).ctypes.data_as(ctypes.POINTER(ctypes.c_longlong)), len(masks), vals.ctypes.data_as(ctypes.POINTER(ct)))
  np.testing.assert_array_equal(data, want)
