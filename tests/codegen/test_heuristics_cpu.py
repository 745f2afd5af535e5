"""The CPU rules of hand_coded_optimizations, on both vector widths (CPU_ARCH native / haswell):
which opts fire on which shapes, and that the kernels they give compute the right thing. Also
BLOCK (reduce blocking), the opt the matmul rule uses for long reduces."""
import importlib.util
from pathlib import Path
import numpy as np
import pytest
from tilecraft import Context, Tensor
from tilecraft.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tilecraft.device import Buffer, CompiledRunner, Device
from tilecraft.dtype import dtypes
from tilecraft.renderer.cstyle import OpenCLRenderer

_spec = importlib.util.spec_from_file_location("_tc_bench_common", Path(__file__).resolve().parents[2] / "bench" / "common.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)  # type: ignore[union-attr]

U, R, B, S, P = OptOps.UPCAST, OptOps.UNROLL, OptOps.BLOCK, OptOps.SWAP, OptOps.PACK
ARCHS = {"haswell": 8, "skylake-avx512": 16}  # -march -> float lanes

def hand(ast):
  k = Kernel(ast, Device["CPU"].renderer)
  k.hand_coded_optimizations()
  return k

def opts(k): return [(o.op, o.axis, o.amt) for o in k.applied_opts]

def run(k, inputs, out_size):
  out = Buffer("CPU", out_size, dtypes.float32).allocate()
  CompiledRunner(k.to_program())([out] + [Buffer("CPU", a.size, dtypes.float32).copyin(a) for a in inputs])
  return out.numpy()

@pytest.mark.parametrize("arch", list(ARCHS))
def test_matmul_tile_and_blocking(arch, rng):
  vw = ARCHS[arch]
  with Context(CPU_ARCH=arch):
    # column tiles outermost and the column operand's panel packed (the whole reduce while it fits)
    assert opts(hand(bench.matmul_ast(64, 64, 64))) == [(U, 1, vw), (U, 0, 8), (U, 1, 2), (S, 0, 1), (P, 2, 0)]
    k = hand(bench.matmul_ast(64, 256, 512))
    assert opts(k) == [(U, 1, vw), (U, 0, 8), (U, 1, 2), (S, 0, 1), (P, 2, 0)], opts(k)
    a, b = rng.random((64, 512), dtype=np.float32), rng.random((512, 256), dtype=np.float32)
    np.testing.assert_allclose(run(k, [a, b], 64 * 256).reshape(64, 256), a @ b, rtol=1e-4)
    # a panel over CPU_PACK_MAX_BYTES: the reduce runs in blocks, and a block's panel is packed
    k = hand(bench.matmul_ast(16, 4 * vw, 8192))
    assert opts(k) == [(U, 1, vw), (U, 0, 8), (U, 1, 2), (B, 0, 256), (S, 0, 1), (P, 2, 0)], opts(k)
    assert any("blocks of 256" in r for r in k.applied_opts_reasons)
    a, b = rng.random((16, 8192), dtype=np.float32), rng.random((8192, 4 * vw), dtype=np.float32)
    np.testing.assert_allclose(run(k, [a, b], 16 * 4 * vw).reshape(16, 4 * vw), a @ b, rtol=1e-4)
    # odd sizes the tile doesn't divide fall back to the general rules
    assert (B, 0, 256) not in opts(hand(bench.matmul_ast(25, 20, 16)))

def test_conv_third_reuse_falls_back_to_2_rows(rng):
  # 10 output rows: 4 doesn't divide them, 2 does
  ast = bench.conv3x3_ast(8, 16, 10, 8)
  k = hand(ast)
  assert (U, 1, 2) in opts(k), opts(k)
  img, w = rng.random((8, 10, 8), dtype=np.float32), rng.random((16, 8, 3, 3), dtype=np.float32)
  np.testing.assert_allclose(run(k, [img, w], 16 * 80).reshape(16, 10, 8), bench.numpy_conv3x3(img, w), rtol=1e-4)

def test_matmul_tile_through_tensor(rng):
  a, b = rng.random((96, 300), dtype=np.float32), rng.random((300, 64), dtype=np.float32)
  for arch in ARCHS:
    with Context(CPU_ARCH=arch): np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-4)

@pytest.mark.parametrize("arch", list(ARCHS))
def test_matvec_streams_rows_with_8_accumulators(arch, rng):
  vw = ARCHS[arch]
  A, x = rng.random((64, 256), dtype=np.float32), rng.random(256, dtype=np.float32)
  with Context(CPU_ARCH=arch):
    si = (Tensor(A) @ Tensor(x)).schedule()[-1]
    k = hand(si.ast)
    assert opts(k) == [(R, 0, vw), (U, 0, 8)], opts(k)
    assert all("matvec" in r for r in k.applied_opts_reasons)
    np.testing.assert_allclose((Tensor(A) @ Tensor(x)).numpy(), A @ x, rtol=1e-4)

@pytest.mark.parametrize("arch", list(ARCHS))
def test_conv_third_reuse_upcast_and_full_kx_unroll(arch, rng):
  ast = bench.conv3x3_ast(8, 16, 8, 8)  # axes: cout, y, x, cin, ky, kx
  with Context(CPU_ARCH=arch):
    k = hand(ast)
    o = opts(k)
    assert (U, 1, 4) in o and o[-1] == (R, 2, 0), o  # four output rows share each weight; kx unrolled
    img, w = rng.random((8, 8, 8), dtype=np.float32), rng.random((16, 8, 3, 3), dtype=np.float32)
    np.testing.assert_allclose(run(k, [img, w], 16 * 64).reshape(16, 8, 8), bench.numpy_conv3x3(img, w), rtol=1e-4)

# ---- BLOCK ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("seq", [[(B, 0, 16)], [(U, 1, 4), (B, 0, 8), (S, 0, 1)], [(R, 0, 4), (B, 0, 4)], [(B, 0, 8), (R, 1, 4)],
                                 [(B, 0, 16), (R, 1, 0)], [(U, 1, 8), (B, 0, 32), (R, 1, 8)], [(B, 0, 8), (OptOps.PADTO, 0, 3)]])
def test_block_matches_numpy(seq, rng):
  M, N, K = 12, 24, 64
  a, b = rng.random((M, K), dtype=np.float32), rng.random((K, N), dtype=np.float32)
  k = Kernel(bench.matmul_ast(M, N, K), Device["CPU"].renderer)
  for o in seq: k.apply_opt(Opt(*o))
  assert k.reduce_block
  np.testing.assert_allclose(run(k, [a, b], M * N).reshape(M, N), a @ b, rtol=1e-4)

def test_block_on_conv_cin(rng):
  k = Kernel(bench.conv3x3_ast(16, 8, 6, 6), Device["CPU"].renderer)
  for o in [(U, 2, 2), (B, 0, 4), (R, 2, 0)]: k.apply_opt(Opt(*o))
  img, w = rng.random((16, 6, 6), dtype=np.float32), rng.random((8, 16, 3, 3), dtype=np.float32)
  np.testing.assert_allclose(run(k, [img, w], 8 * 36).reshape(8, 6, 6), bench.numpy_conv3x3(img, w), rtol=1e-4)

def test_block_refusals():
  ast = bench.matmul_ast(16, 16, 64)
  def refused(seq, match, ren=None):
    k = Kernel(ast, ren or Device["CPU"].renderer)
    for o in seq[:-1]: k.apply_opt(Opt(*o))
    with pytest.raises(KernelOptError, match=match): k.apply_opt(Opt(*seq[-1]))
  refused([(B, 0, 64)], "whole axis")
  refused([(B, 0, 0)], "whole axis")
  refused([(B, 0, 6)], "does not divide")
  refused([(B, 0, 8), (B, 1, 2)], "already blocked")
  refused([(B, 0, 8), (R, 0, 2)], "block axis")
  refused([(B, 0, 8)], "CPU", OpenCLRenderer())
  # elementwise ops after the reduce: the output can't hold partial sums
  t = (Tensor.empty(16, 64) @ Tensor.empty(64, 16)).relu()
  k = Kernel(t.schedule()[-1].ast, Device["CPU"].renderer)
  with pytest.raises(KernelOptError, match="store the reduce itself"): k.apply_opt(Opt(B, 0, 8))
  k = Kernel(Tensor.empty(16, 64).max(1).schedule()[-1].ast, Device["CPU"].renderer)
  with pytest.raises(KernelOptError, match="SUM"): k.apply_opt(Opt(B, 0, 8))

# ---- column sums: rows in blocks across the column tiles, one parallel region --------------------

@pytest.mark.parametrize("arch", list(ARCHS))
def test_column_sums_block_rows_in_one_parallel_region(arch, rng):
  a = rng.random((512, 768), dtype=np.float32)
  with Context(CPU_ARCH=arch):
    si = Tensor(a).sum(0).schedule()[-1]
    k = hand(si.ast)
    assert (B, 0, 8) in opts(k) and any("blocks of 8" in r for r in k.applied_opts_reasons), opts(k)
    src = k.to_program().src
    # the block loop is outside the (only) output loop, which is shared out in one region without barriers
    region, loop = src.index("#pragma omp parallel\n"), src.index("#pragma omp for schedule(static) nowait")
    assert region < src.index("for (int ridx0") < loop < src.index("for (int gidx0")
    np.testing.assert_allclose(Tensor(a).sum(0).numpy(), a.sum(0, dtype=np.float64), rtol=1e-5)

def test_column_sums_with_uneven_thread_counts():
  """Each thread must get the same column tiles in every block (static schedule): 3 and 7 threads
  over a tile count they don't divide, in fresh processes."""
  import subprocess, sys
  code = ("import numpy as np; from tilecraft import Tensor\n"
          "rng = np.random.default_rng(1)\n"
          "for shape in ((512, 1088), (256, 4096), (1024, 48)):\n"
          "  a = rng.random(shape, dtype=np.float32)\n"
          "  for _ in range(3): np.testing.assert_allclose(Tensor(a).sum(0).numpy(), a.sum(0, dtype=np.float64), rtol=1e-5)\n")
  for threads in ("3", "7"):
    env = {**__import__("os").environ, "OMP_NUM_THREADS": threads}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]

@pytest.mark.parametrize("seq", [[(U, 0, 8), (B, 0, 4)], [(B, 0, 16)], [(U, 0, 4), (U, 0, 4), (B, 0, 2), (R, 1, 2)]])
def test_block_with_one_output_loop_matches_numpy(seq, rng):
  """BLOCK on kernels whose only output loop is parallel: the block loop runs outside it."""
  a = rng.random((256, 512), dtype=np.float32)
  si = Tensor(a).sum(0).schedule()[-1]
  k = Kernel(si.ast, Device["CPU"].renderer)
  for o in seq: k.apply_opt(Opt(*o))
  src = k.to_program().src
  assert src.index("for (int ridx0") < src.index("for (int gidx0"), src
  np.testing.assert_allclose(run(k, [a], 512), a.sum(0, dtype=np.float64), rtol=1e-5)
