"""The CPU rules of hand_coded_optimizations, on both vector widths (CPU_ARCH haswell / skylake-avx512):
which opts fire on which shapes, and that the kernels they give compute the right thing. Also
BLOCK (reduce blocking), the opt the matmul rule uses for long reduces. A kernel for an ISA this
host can't execute (AVX-512 on an AVX2 machine) is built and inspected, never run."""
import importlib.util, math
from pathlib import Path
import numpy as np
import pytest
from tilecraft import Context, Tensor
from tilecraft.helpers import prod
from tilecraft.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tilecraft.device import Buffer, CompiledRunner, Device
from tilecraft.dtype import dtypes
from tilecraft.ops import MemBuffer
from tilecraft.host import cpu_target, missing_features
from tilecraft.renderer.cstyle import OpenCLRenderer

_spec = importlib.util.spec_from_file_location("_tc_bench_common", Path(__file__).resolve().parents[2] / "bench" / "common.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)  # type: ignore[union-attr]

U, R, B, S, P, D = OptOps.UPCAST, OptOps.UNROLL, OptOps.BLOCK, OptOps.SWAP, OptOps.PACK, OptOps.PADTO
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

def runnable() -> bool:
  """Whether this host executes code for the CPU_ARCH in force."""
  return not missing_features(cpu_target())

def check(k, inputs, want, rtol=1e-4, atol=0.0):
  """k's output against want where this host runs the current CPU_ARCH; elsewhere k is only compiled."""
  if not runnable():
    assert Device["CPU"].compiler.compile(k.to_program().src)
    return
  np.testing.assert_allclose(run(k, inputs, want.size).reshape(want.shape), want, rtol=rtol, atol=atol)

def check_tensor(t, want, rtol=1e-4, atol=0.0):
  """t's value against want where this host runs the current CPU_ARCH; elsewhere its kernels are only compiled."""
  if runnable():
    np.testing.assert_allclose(t.numpy(), want, rtol=rtol, atol=atol)
    return
  for si in t.schedule():
    if si.ast.op.name == "KERNEL": assert Device["CPU"].compiler.compile(hand(si.ast).to_program().src)

@pytest.mark.parametrize("arch", list(ARCHS))
def test_matmul_tile_and_blocking(arch, rng):
  vw = ARCHS[arch]
  with Context(CPU_ARCH=arch):
    # column tiles outermost and the column operand's panel packed (the whole reduce while it fits);
    # AVX2's 16 registers take 6 rows (12 accumulators), the 64 rows padded to 66
    tile = [(U, 1, vw), (U, 0, 8)] if vw == 16 else [(U, 1, vw), (D, 0, 6), (U, 0, 6)]
    assert opts(hand(bench.matmul_ast(64, 64, 64))) == tile + [(U, 1, 2), (S, 0, 1), (P, 2, 0)]
    k = hand(bench.matmul_ast(64, 256, 512))
    # (AVX2, 256 columns: padded to 264, the 4 rows x 3 vectors tile, see test_avx2_matmul_tile_of_4_rows_x_3_vectors)
    want = tile + [(U, 1, 2)] if vw == 16 else [(D, 1, 24), (U, 1, 8), (U, 0, 4), (U, 1, 3)]
    assert opts(k) == want + [(S, 0, 1), (P, 2, 0)], opts(k)
    a, b = rng.random((64, 512), dtype=np.float32), rng.random((512, 256), dtype=np.float32)
    check(k, [a, b], a @ b, rtol=1e-4)
    # a panel over CPU_PACK_MAX_BYTES: the reduce runs in blocks, and a block's panel is packed
    # (32 rows: padding them to 36 would add 1/8 of the work, so 8 rows, or 4 with AVX2's 16 registers;
    # 16 rows would be 2 row tiles per block: no pack, see test_blocks_read_by_one_or_two_row_tiles_...)
    k = hand(bench.matmul_ast(32, 4 * vw, 8192))
    assert opts(k) == [(U, 1, vw), (U, 0, 8 if vw == 16 else 4), (U, 1, 2), (B, 0, 256), (S, 0, 1), (P, 2, 0)], opts(k)
    assert any("blocks of 256" in r for r in k.applied_opts_reasons)
    a, b = rng.random((32, 8192), dtype=np.float32), rng.random((8192, 4 * vw), dtype=np.float32)
    check(k, [a, b], a @ b, rtol=1e-4)
    # odd sizes the tile doesn't divide fall back to the general rules
    assert (B, 0, 256) not in opts(hand(bench.matmul_ast(25, 20, 16)))

@pytest.mark.parametrize("M,padded", [(1024 // 8, True), (96, False), (100, True)])
def test_avx2_matmul_tile_has_6_rows(M, padded, rng):
  # 16 ymm registers: 6x2 accumulators + 2 B vectors + a broadcast; rows padded to a multiple of 6
  # (masked stores, the broadcast B panel left unmasked so it can still be packed), or not when 6 divides
  with Context(CPU_ARCH="haswell"):
    # (64 columns: padding them to 3 vectors' 72 is too much for the 4 x 3 tile)
    k = hand(bench.matmul_ast(M, 64, 40))
    assert opts(k) == [(U, 1, 8)] + ([(D, 0, 6)] if padded else []) + [(U, 0, 6), (U, 1, 2), (S, 0, 1), (P, 2, 0)], opts(k)
    a, b = rng.standard_normal((M, 40), dtype=np.float32), rng.standard_normal((40, 64), dtype=np.float32)
    want = run(Kernel(bench.matmul_ast(M, 64, 40), Device["CPU"].renderer), [a, b], M * 64).reshape(M, 64)  # unoptimized
    np.testing.assert_allclose(want, a @ b, rtol=1e-4, atol=1e-4)
    check(k, [a, b], want, rtol=1e-5, atol=1e-5)
  # a row count whose padding would be more than 1/32 of the work, and 8 divides it: 4 rows (8 x 2 accumulators
  # would spill the 16 registers); AVX-512 keeps 8 rows
  with Context(CPU_ARCH="haswell"):
    k = hand(bench.matmul_ast(40, 64, 40))
    assert opts(k)[:3] == [(U, 1, 8), (U, 0, 4), (U, 1, 2)], opts(k)
    a, b = rng.standard_normal((40, 40), dtype=np.float32), rng.standard_normal((40, 64), dtype=np.float32)
    check(k, [a, b], a @ b, rtol=1e-4, atol=1e-4)
  with Context(CPU_ARCH="skylake-avx512"): assert (U, 0, 8) in opts(hand(bench.matmul_ast(40, 48, 40)))
  with Context(CPU_ARCH="skylake-avx512"): assert (D, 0, 6) not in opts(hand(bench.matmul_ast(128, 64, 40)))

@pytest.mark.parametrize("M,N,K", [(300, 500, 700), (128, 3072, 768), (100, 48, 40), (128, 768, 3072), (128, 1024, 4096)])
def test_avx2_matmul_tile_of_4_rows_x_3_vectors(M, N, K, rng):
  """16 registers, a plain matmul whose columns fill 3 vectors (padded by at most 1/32) and whose 3-vector panel fits a
  pack whole: 4 rows x 3 vectors (12 accumulators, 3 loads and 4 broadcasts per 12 FMAs, not 6 x 2's 2 and 6). Where the
  panel is too big for a pack (a reduce of 3072 or 4096) and more than 16 row tiles read it, the reduce goes in blocks
  of 1024. Against numpy and the unoptimized kernel. Not where the columns would pad more (64 -> 72), the panel is too
  big and 16 or fewer row tiles read it (streamed in blocks of 256 by the 6 x 2 tile), the kernel has two reduces, or
  on AVX-512."""
  with Context(CPU_ARCH="haswell"):
    k = hand(bench.matmul_ast(M, N, K))
    blocked = [(B, 0, 1024)] if K > 768 else []
    assert opts(k) == ([(D, 1, 24)] if N % 24 else []) + [(U, 1, 8), (U, 0, 4), (U, 1, 3)] + blocked + [(S, 0, 1), (P, 2, 0)], opts(k)
    a, b = rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
    want = run(Kernel(bench.matmul_ast(M, N, K), Device["CPU"].renderer), [a, b], M * N).reshape(M, N)  # unoptimized
    np.testing.assert_allclose(want, a @ b, rtol=1e-4, atol=1e-3 * max(1, K / 1024))
    check(k, [a, b], want, rtol=1e-5, atol=1e-4 * max(1, K / 512))  # (blocks sum in another order: a long K's rounding)
    for shape in ((96, 64, 40), (64, 768, 3072), (32, 1024, 4096)):
      assert (U, 1, 3) not in opts(hand(bench.matmul_ast(*shape))), shape
  with Context(CPU_ARCH="skylake-avx512"): assert (U, 1, 8) not in opts(hand(bench.matmul_ast(M, N, K)))  # (16-lane vectors)

def test_padto_of_an_output_axis_leaves_broadcast_inputs_unmasked(rng):
  # the rows' padding is masked in the row operand and the stores; the column operand doesn't vary
  # along the rows, so it stays unmasked there (and its panel can be packed: fixed along the row loop)
  k = Kernel(bench.matmul_ast(10, 16, 8), Device["CPU"].renderer)
  k.apply_opt(Opt(OptOps.PADTO, 0, 4))
  assert k.full_shape[0] == 12
  assert not k.sts[2].axis_is_masked(0) and k.sts[2].real_strides()[0] == 0
  assert k.sts[1].axis_is_masked(0) and k.sts[0].axis_is_masked(0)
  for o in (Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.SWAP, 0, 1), Opt(OptOps.PACK, 2, 0)): k.apply_opt(o)
  a, b = rng.standard_normal((10, 8), dtype=np.float32), rng.standard_normal((8, 16), dtype=np.float32)
  check(k, [a, b], a @ b, rtol=1e-5, atol=1e-5)

def test_conv_third_reuse_falls_back_to_2_rows(rng):
  # 10 output rows: 4 doesn't divide them, 2 does
  ast = bench.conv3x3_ast(8, 16, 10, 8)
  k = hand(ast)
  assert (U, 1, 2) in opts(k), opts(k)
  img, w = rng.random((8, 10, 8), dtype=np.float32), rng.random((16, 8, 3, 3), dtype=np.float32)
  check(k, [img, w], bench.numpy_conv3x3(img, w), rtol=1e-4)

def test_matmul_tile_through_tensor(rng):
  a, b = rng.random((96, 300), dtype=np.float32), rng.random((300, 64), dtype=np.float32)
  for arch in ARCHS:
    with Context(CPU_ARCH=arch): check_tensor(Tensor(a) @ Tensor(b), a @ b)

@pytest.mark.parametrize("arch", list(ARCHS))
def test_matvec_streams_rows_with_8_accumulators(arch, rng):
  vw = ARCHS[arch]
  A, x = rng.random((64, 256), dtype=np.float32), rng.random(256, dtype=np.float32)
  with Context(CPU_ARCH=arch):
    si = (Tensor(A) @ Tensor(x)).schedule()[-1]
    k = hand(si.ast)
    assert opts(k) == [(R, 0, vw), (U, 0, 8)], opts(k)
    assert all("matvec" in r for r in k.applied_opts_reasons)
    check_tensor(Tensor(A) @ Tensor(x), A @ x)

@pytest.mark.parametrize("arch", list(ARCHS))
def test_vector_matrix_blocks_of_4_where_8_does_not_divide(arch, rng):
  """x @ W at batch 1, W 516 x 1000 (2 MB): the columns padded to the 8-vector tile, the reduce in blocks of 4 (8
  doesn't divide 516; see test_vector_matrix_streams_a_big_matrix_in_blocks); against numpy and the unoptimized kernel."""
  vw, K, N = ARCHS[arch], 516, 1000
  x, w = rng.standard_normal((1, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
  with Context(CPU_ARCH=arch):
    ast = bench.matmul_ast(1, N, K)
    k = hand(ast)
    pad = [(D, 0, 8 * vw)] if N % (8 * vw) else []
    assert opts(k) == pad + [(U, 0, vw), (U, 0, 8), (B, 0, 4)], opts(k)
    assert any("vector-matrix" in r and "blocks of" in r for r in k.applied_opts_reasons)
    check(k, [x, w], x @ w, rtol=1e-4, atol=1e-3)
    if runnable():
      np.testing.assert_allclose(run(k, [x, w], N).reshape(1, N), _unoptimized(ast, [x, w], N).reshape(1, N), rtol=1e-4, atol=1e-4)

@pytest.mark.parametrize("arch", list(ARCHS))
def test_conv_third_reuse_upcast_and_full_kx_unroll(arch, rng):
  ast = bench.conv3x3_ast(8, 16, 8, 8)  # axes: cout, y, x, cin, ky, kx
  with Context(CPU_ARCH=arch):
    k = hand(ast)
    o = opts(k)
    assert (U, 1, 4) in o and o[-1] == (R, 2, 0), o  # four output rows share each weight; kx unrolled
    img, w = rng.random((8, 8, 8), dtype=np.float32), rng.random((16, 8, 3, 3), dtype=np.float32)
    check(k, [img, w], bench.numpy_conv3x3(img, w), rtol=1e-4)

# (width -> (columns padded to, lanes) per vector width: 2 vectors where that pads at most 1/4, else one vector;
# AVX-512 takes 8 lanes where they pad less than 16)
ODD_CONV_TILES = {8: {55: (16, 8), 27: (16, 8), 13: (16, 8)}, 16: {55: (16, 16), 27: (32, 16), 13: (16, 16)}}

@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("width", [55, 27, 13])
def test_odd_conv_rows_take_padded_tiles(arch, width, rng):
  """Conv rows that are neither a multiple of the vector nor of half of it (SqueezeNet's 3x3 convs at 55^2, 27^2,
  13^2) take the matmul tile with the columns padded (masked lanes) instead of the general rules' scalar tiles:
  2 vectors where that pads at most 1/4 (on AVX-512 one whole vector where 2 half-width ones pad as much: 55 -> 64),
  output channels as the tile's rows, kx unrolled. Both vs numpy."""
  vw = ARCHS[arch]
  cols, lanes = ODD_CONV_TILES[vw][width]
  ast = bench.conv3x3_ast(4, 16, 8, width)  # axes: cout, y, x, cin, ky, kx
  img, w = rng.random((4, 8, width), dtype=np.float32), rng.random((16, 4, 3, 3), dtype=np.float32)
  with Context(CPU_ARCH=arch):
    k = hand(ast)
    o = opts(k)
    assert o[:2] == [(D, 2, cols), (U, 2, lanes)] and o[-1] == (R, 2, 0), o
    assert any(op is U and ax == 0 for op, ax, _ in o), o  # output channels: the tile's rows
    if cols == 2 * lanes: assert (U, 2, 2) in o, o
    assert "matmul register tile" in k.applied_opts_reasons[0]
    check(k, [img, w], bench.numpy_conv3x3(img, w), rtol=1e-4)

@pytest.mark.parametrize("arch", list(ARCHS))
def test_small_image_conv_holds_all_rows_in_registers(arch, rng):
  """A 7x7 image (ResNet-50's last stage): 7 columns padded to one 8-lane vector, all 7 rows upcast whole and 2
  output channels (14 accumulators), so each weight broadcast serves the whole image. The padded input is masked
  along the rows: the stack/cat rule must not take them first."""
  ast = bench.conv3x3_ast(16, 8, 7, 7)
  img, w = rng.random((16, 7, 7), dtype=np.float32), rng.random((8, 16, 3, 3), dtype=np.float32)
  with Context(CPU_ARCH=arch):
    k = hand(ast)
    assert opts(k) == [(D, 2, 8), (U, 2, 8), (U, 1, 0), (U, 0, 2), (R, 2, 0)], opts(k)
    check(k, [img, w], bench.numpy_conv3x3(img, w), rtol=1e-4)

def _pool_ref(x, size, stride):
  win = np.lib.stride_tricks.sliding_window_view(x, (size, size), axis=(2, 3))[:, :, ::stride, ::stride]
  return win.max(axis=(-2, -1))

@pytest.mark.parametrize("arch", list(ARCHS))
def test_window_reduces_pad_their_output_rows_to_vectors(arch, rng):
  """Max-pools and depthwise convs (reduces of at most 49) with output rows no vector width divides (13 and 14
  wide): the rows are padded (masked lanes) and made vectors, instead of a scalar loop; a row of 2-4 vectors
  is computed whole per iteration. Both vs numpy."""
  vw = ARCHS[arch]
  x = rng.standard_normal((1, 8, 27, 27), dtype=np.float32)
  dw_x, dw_w = rng.standard_normal((1, 16, 14, 14), dtype=np.float32), rng.standard_normal((16, 1, 3, 3), dtype=np.float32)
  with Context(CPU_ARCH=arch):
    t = Tensor(x).max_pool2d(3, 2)  # 27 -> 13
    k = hand([si for si in t.schedule() if si.ast.op.name == "KERNEL"][-1].ast)
    assert opts(k)[:2] == [(D, 2, vw), (U, 2, vw)] and "window reduce" in k.applied_opts_reasons[0], opts(k)
    if vw == 8: assert opts(k)[2] == (U, 2, 0) and "all 2 vectors" in k.applied_opts_reasons[2], opts(k)  # (16 lanes: the whole row)
    check_tensor(t, _pool_ref(x, 3, 2))
    t = Tensor(dw_x).conv2d(Tensor(dw_w), padding=1, groups=16)  # 14 -> 16 (AVX2: 2 vectors; AVX-512: one)
    k = hand([si for si in t.schedule() if si.ast.op.name == "KERNEL"][-1].ast)
    assert opts(k)[:2] == [(D, 2, vw), (U, 2, vw)], opts(k)
    want = np.stack([_conv_ref(dw_x[:, c:c + 1], dw_w[c:c + 1], 1, 1)[:, 0] for c in range(16)], axis=1)
    if runnable(): np.testing.assert_allclose(t.numpy(), want, rtol=1e-4, atol=1e-5)
    else: check_tensor(t, want)
    # 55-wide rows (SqueezeNet's first max-pool): 8 lanes pad least (56), but on AVX-512 4 whole 16-lane vectors make the
    # row the tile takes whole (1.23-1.28x faster than 7 x 8 lanes); AVX2's 8 lanes are its width, and its 7 vectors the
    # tile (a pool holds nothing else in registers: 1.36-1.63x faster than one vector a step, POOL_ROW_VECTORS)
    x = rng.standard_normal((1, 4, 111, 111), dtype=np.float32)
    t = Tensor(x).max_pool2d(3, 2)
    k = hand([si for si in t.schedule() if si.ast.op.name == "KERNEL"][-1].ast)
    assert opts(k)[:3] == [(D, 2, vw), (U, 2, vw), (U, 2, 0)], opts(k)
    check_tensor(t, _pool_ref(x, 3, 2))
    # 56-wide rows (ResNet-50's max-pool): a multiple of 8 lanes, which the general rules ran as 4 lanes on AVX-512;
    # 4 x 16 lanes, padded to 64 and taken whole, are 1.8-1.9x faster there; AVX2 takes its 7 vectors whole (1.06-1.37x)
    x = rng.standard_normal((1, 4, 113, 113), dtype=np.float32)
    t = Tensor(x).max_pool2d(3, 2)
    k = hand([si for si in t.schedule() if si.ast.op.name == "KERNEL"][-1].ast)
    assert opts(k)[:3] == ([(D, 2, 16), (U, 2, 16), (U, 2, 0)] if vw == 16 else [(U, 2, 8), (U, 2, 0), (R, 1, 0)]), opts(k)
    check_tensor(t, _pool_ref(x, 3, 2))
    # a global average pool over 7x7 (a reduce of 49 with the channels as the output's row): no image row, one vector of
    # channels a step (4-6 vectors of gathered channels ran 0.86-0.94x)
    t = Tensor(rng.standard_normal((1, 256, 7, 7), dtype=np.float32)).mean((2, 3))
    k = hand([si for si in t.schedule() if si.ast.op.name == "KERNEL"][-1].ast)
    assert not any(op is U and amt in (0, 2, 4, 5, 6, 7) for op, _, amt in opts(k)), opts(k)

def test_a_short_argmax_keeps_its_window_row_as_the_tile(rng):
  """An argmax over 44 values (a window-length reduce) of 255 rows: the rows are padded to vectors, and the
  register-tile rules leave that axis alone. They used to upcast it 3 more times for the broadcast index
  input: 512 scalar int accumulators and a 50 s gcc compile."""
  x = rng.standard_normal((255, 44)).astype(np.float32)
  x[::7, 3] = x[::7].max(1) + 1  # (ties and a known winner in some rows)
  t = Tensor(x).argmax(-1)
  k = hand([si for si in t.schedule() if si.ast.op.name == "KERNEL"][-1].ast)
  lanes = int(np.prod([s for s in k.full_shape[k.first_upcast:] if isinstance(s, int)]))
  assert lanes <= 64, (opts(k), k.applied_opts_reasons)
  np.testing.assert_array_equal(t.numpy(), x.argmax(-1))

def test_grouped_1x1_conv_takes_6_padded_rows_on_avx2(rng):
  """34 output channels per group (ShuffleNet): 8 rows would pad to 40 (over 1/7), so AVX2 takes 6 rows padded
  to 36 (at most 1/16 more work) instead of the general rules' single-vector tile."""
  x, w = rng.standard_normal((1, 68, 16, 16), dtype=np.float32), rng.standard_normal((68, 34, 1, 1), dtype=np.float32) * 0.2
  with Context(CPU_ARCH="haswell"):
    t = Tensor(x).conv2d(Tensor(w), groups=2)
    k = hand([si for si in t.schedule() if si.ast.op.name == "KERNEL"][-1].ast)
    o = opts(k)
    assert (D, 1, 6) in o and (U, 1, 6) in o and o[0] == (U, 2, 8), o
    want = np.concatenate([_conv_ref(x[:, g * 34:(g + 1) * 34], w[g * 34:(g + 1) * 34], 1, 0) for g in range(2)], axis=1)
    if runnable(): np.testing.assert_allclose(t.numpy(), want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    else: check_tensor(t, want)

@pytest.mark.parametrize("cout,cin,groups,hw,ks", [(68, 34, 2, 16, 1), (64, 32, 1, 8, 3)])
def test_rows_8_would_overpad_take_6_with_32_registers(cout, cin, groups, hw, ks, rng):
  """With 32 registers too, a row axis that 8 rows would pad by more than 1/7 takes 6 rows padded by at most
  1/16 (34 -> 36 channels per group: ShuffleNet's grouped 1x1 convs, 1.9x faster; 6-pixel rows: Inception v1's
  3x3 convs to 6x6, 7-9x faster than the general rules' scalar tile, AVX-512), right against numpy."""
  x, w = rng.standard_normal((1, cin, hw, hw), dtype=np.float32), rng.standard_normal((cout, cin // groups, ks, ks), dtype=np.float32) * 0.2
  with Context(CPU_ARCH="skylake-avx512"):
    t = Tensor(x).conv2d(Tensor(w), groups=groups)
    k = hand([si for si in t.schedule() if si.ast.op.name == "KERNEL"][-1].ast)
    o = opts(k)
    assert ((U, 1, 6) in o) if groups > 1 else (len(o) >= 4 and (P, 2, 0) in o), o
    cpg, opg = cin // groups, cout // groups
    want = np.concatenate([_conv_ref(x[:, g * cpg:(g + 1) * cpg], w[g * opg:(g + 1) * opg], 1, 0) for g in range(groups)], axis=1)
    if runnable(): np.testing.assert_allclose(t.numpy(), want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    else: check_tensor(t, want)

@pytest.mark.parametrize("arch", list(ARCHS))
def test_strided_conv_with_25_wide_rows_takes_padded_vectors(arch, rng):
  """ZFNet's 5x5 stride-2 conv (25-wide output rows, 25 -> 32 pads 7/25): a vector tile along the padded rows. It
  took the general rules' 4 x 8 x 4 = 128 scalar accumulators on output channels before (1.7 GFLOP/s, 28x slower,
  AVX-512); right against numpy."""
  x, w = rng.standard_normal((1, 8, 53, 53), dtype=np.float32), rng.standard_normal((32, 8, 5, 5), dtype=np.float32) * 0.1
  with Context(CPU_ARCH=arch):
    t, k = _conv_kernel(x, w, 2, 0)
    o = opts(k)
    if ARCHS[arch] == 16: assert any(op is D and ax == 2 for op, ax, _ in o) and any(op is U and ax == 2 and amt in (8, 16) for op, ax, amt in o), o
    # (16 registers: the weights packed as 2 vectors of output channels x 7 padded rows of broadcast pixels, 1.5x faster)
    else: assert o[:3] == [(U, 0, 8), (D, 2, 7), (U, 2, 7)] and (P, 2, 0) in o, o
    _check_conv(t, x, w, 2, 0)

def test_general_rules_keep_scalar_tiles_within_the_registers():
  """Where no upcast output axis is contiguous in the output (scalar accumulators, one register each), the general
  rules' register tile stays within 2 x vw of them (a 256 x 11 matmul: 11 columns take no vector tile; it took
  4 x 8 x 4 = 128 scalar accumulators on the rows before), right against numpy."""
  from tilecraft.codegen.heuristic import _vector_upcast
  a, b = np.random.default_rng(0).standard_normal((256, 96), dtype=np.float32), np.random.default_rng(1).standard_normal((96, 11), dtype=np.float32)
  for arch, vw in ARCHS.items():
    with Context(CPU_ARCH=arch):
      k = hand(bench.matmul_ast(256, 11, 96))
      assert not _vector_upcast(k) and 4 <= prod_upcast(k) <= 2 * vw, opts(k)
      check(k, [a, b], a @ b, atol=1e-4 * float(np.abs(a @ b).max()))

def test_columns_of_one_vector_take_8_rows_not_32(rng):
  """AVX-512, a matmul whose 16 output columns are one vector (narrower than the tile's 2): one vector x 8 rows. The
  general rules took 32 rows of it (32 accumulators and a broadcast: spilled, 5x slower on 1024x4096 @ 4096x16)."""
  a, b = rng.standard_normal((128, 256), dtype=np.float32), rng.standard_normal((256, 16), dtype=np.float32)
  with Context(CPU_ARCH="skylake-avx512"):
    k = hand(bench.matmul_ast(128, 16, 256))
    assert opts(k) == [(U, 1, 16), (U, 0, 8)], opts(k)
    check(k, [a, b], a @ b, rtol=1e-4)
  with Context(CPU_ARCH="haswell"):  # (2 vectors of 8 columns: the usual tile)
    assert opts(hand(bench.matmul_ast(128, 16, 256)))[:1] == [(U, 1, 8)]

@pytest.mark.parametrize("N,tile", [(8, [(U, 1, 8), (U, 0, 8)]), (24, [(U, 1, 8), (U, 0, 8), (U, 1, 3)]),
                                     (40, [(D, 1, 48), (U, 1, 16), (U, 0, 8), (U, 1, 3)]), (72, [(U, 1, 8), (U, 0, 8), (U, 1, 3)]),
                                     (80, [(D, 1, 48), (U, 1, 16), (U, 0, 8), (U, 1, 3)])])
def test_narrow_columns_take_a_tile_of_at_most_3_vectors(N, tile, rng):
  """AVX-512, a matmul whose columns (a multiple of 8) the 2-vector tile doesn't fit: at most 3 whole or half vectors
  x 8 rows, padded by at most 1/4. The general rules took 32 rows of one vector (spilled): 32 x 4096 @ 4096 x 24, 40,
  72 and 80 ran 4.5-11x slower."""
  a, b = rng.standard_normal((32, 256), dtype=np.float32), rng.standard_normal((256, N), dtype=np.float32)
  with Context(CPU_ARCH="skylake-avx512"):
    k = hand(bench.matmul_ast(32, N, 256))
    assert opts(k)[:len(tile)] == tile, opts(k)
    assert prod_upcast(k) <= 24 * 16, prod_upcast(k)
    check(k, [a, b], a @ b, rtol=1e-4, atol=1e-4)

@pytest.mark.parametrize("N,tile", [(12, [(D, 1, 16), (U, 1, 8), (D, 0, 6), (U, 0, 6), (U, 1, 2)]), (20, [(D, 1, 24), (U, 1, 8), (U, 0, 4), (U, 1, 3)])])
def test_narrow_columns_on_avx2_take_padded_8_lane_vectors(N, tile, rng):
  """AVX2, 12 or 20 columns: 2 vectors x 6 rows or 3 x 4 (12 accumulators of 16 registers), padded by at most 1/3. The
  general rules took 4-lane vectors: 100 x 2048 @ 2048 x 12 and x 20 ran 1.8x and 2.7x slower."""
  a, b = rng.standard_normal((100, 256), dtype=np.float32), rng.standard_normal((256, N), dtype=np.float32)
  with Context(CPU_ARCH="haswell"):
    k = hand(bench.matmul_ast(100, N, 256))
    assert opts(k)[:len(tile)] == tile, opts(k)
    check(k, [a, b], a @ b, rtol=1e-4, atol=1e-4)

@pytest.mark.parametrize("arch", list(ARCHS))
def test_panels_of_one_vector_take_the_next_panel_as_the_second_vector(arch, rng):
  """Weights laid out in panels of one vector of columns, (n / vw, k, vw), contracted with x (m, k): the vector runs
  along the panel's columns (unit stride), the next panel gives the tile's second vector, and nothing is packed (the
  panels are contiguous already). The general rules' vectors ran across the panels (gathers, 30x slower)."""
  vw = ARCHS[arch]
  x, w = rng.standard_normal((32, 128), dtype=np.float32), rng.standard_normal((8, 128, vw), dtype=np.float32)
  with Context(CPU_ARCH=arch):
    t = (Tensor(x).reshape(32, 1, 128, 1) * Tensor(w).reshape(1, 8, 128, vw)).sum(2)
    [si] = [si for si in t.schedule() if si.ast.op.name == "KERNEL"]
    k = hand(si.ast)
    up = {k.full_shape[a]: a for a in range(k.first_upcast, k.shape_len)}
    assert (U, 2, vw) in opts(k) and (U, 1, 2) in opts(k) and not any(o[0] is P for o in opts(k)), opts(k)
    assert k.sts[0].real_strides()[up[vw]] == 1, "the vector runs along the panel's columns"
    check_tensor(t, np.einsum("mk,nkl->mnl", x, w), rtol=1e-4, atol=1e-4)

@pytest.mark.parametrize("arch", list(ARCHS))
def test_row_reduces_with_a_bias_take_vectors_along_the_rows(arch, rng):
  """A layernorm of a residual sum with a bias added (x = a + r + bias): the bias is broadcast over the rows, which
  made the data-reuse rule upcast the rows (16 x 8 rows, every other input read as gathers, 3.3-4.9x slower).
  The mean and variance kernels vectorize along the contiguous rows instead; right against numpy."""
  a, r, c = rng.standard_normal((1, 64, 256), dtype=np.float32), rng.standard_normal((1, 64, 256), dtype=np.float32), rng.standard_normal(256, dtype=np.float32)
  vw = ARCHS[arch]
  with Context(CPU_ARCH=arch):
    x = Tensor(a) + Tensor(r) + Tensor(c)
    t = (x - x.mean(-1, keepdim=True)) * (x.var(-1, keepdim=True) + 1e-5).rsqrt()
    reduces = [hand(si.ast) for si in t.schedule() if si.ast.op.name == "KERNEL" and any(op.op.name == "SUM" for op in si.ast.lazyops)]
    assert reduces and all(opts(k)[0] == (R, 0, vw) for k in reduces), [opts(k) for k in reduces]
    xn = (a + r + c).astype(np.float64)
    check_tensor(t, (xn - xn.mean(-1, keepdims=True)) / np.sqrt(xn.var(-1, keepdims=True) + 1e-5), rtol=1e-4, atol=1e-4)

def prod_upcast(k) -> int:
  """Accumulators per tile: the upcast output axes (not unrolled reduces)."""
  n = 1
  for a in range(k.first_upcast, k.shape_len):
    if k.full_shape[a] == k.output_shape[a]: n *= k.full_shape[a]
  return n

@pytest.mark.parametrize("arch", list(ARCHS))
def test_conv_rows_padded_to_full_vectors(arch, rng):
  """56-wide conv rows of a 4-channel conv (a reduce of 36, short enough to count as a window): AVX-512 pads them to 64
  (PADTO 16) and runs 16-lane vectors x 8 channels, kx unrolled; AVX2 keeps 8 lanes unpadded. No output rows besides:
  with a reduce under 64 the tile stays within 8 vector accumulators (cpu_third_reuse_cap; 4 rows, 32 accumulators,
  ran 1.26x slower hot and 1.29x with the caches flushed, AVX-512). Both vs numpy."""
  ast = bench.conv3x3_ast(4, 16, 8, 56)  # axes: cout, y, x, cin, ky, kx
  img, w = rng.random((4, 8, 56), dtype=np.float32), rng.random((16, 4, 3, 3), dtype=np.float32)
  with Context(CPU_ARCH=arch):
    k = hand(ast)
    want = ([(OptOps.PADTO, 2, 16), (U, 2, 16)] if ARCHS[arch] == 16 else [(U, 2, 8)]) + [(U, 0, 8), (R, 2, 0)]
    assert opts(k) == want, opts(k)
    check(k, [img, w], bench.numpy_conv3x3(img, w), rtol=1e-4)
    # the weights don't vary along the padded axis: they stay unmasked (one broadcast, no lane gates)
    assert k.sts[2].real_strides()[2] == 0
    # no padding where it would add more than 1/7 of the work (40 -> 48), or where the width divides
    for wd in (40, 64): assert (OptOps.PADTO, 2, 16) not in opts(hand(bench.conv3x3_ast(4, 16, 8, wd)))

# ---- BLOCK ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("seq", [[(B, 0, 16)], [(U, 1, 4), (B, 0, 8), (S, 0, 1)], [(R, 0, 4), (B, 0, 4)], [(B, 0, 8), (R, 1, 4)],
                                 [(B, 0, 16), (R, 1, 0)], [(U, 1, 8), (B, 0, 32), (R, 1, 8)], [(B, 0, 8), (OptOps.PADTO, 0, 3)]])
def test_block_matches_numpy(seq, rng):
  M, N, K = 12, 24, 64
  a, b = rng.random((M, K), dtype=np.float32), rng.random((K, N), dtype=np.float32)
  k = Kernel(bench.matmul_ast(M, N, K), Device["CPU"].renderer)
  for o in seq: k.apply_opt(Opt(*o))
  assert k.reduce_block
  check(k, [a, b], a @ b, rtol=1e-4)

EPILOGUES = {  # (tilecraft, numpy) of what a kernel computes from a matmul's sum
  "relu": (lambda m, c: m.relu(), lambda m, c: np.maximum(m, 0)),
  "bias+gelu": (lambda m, c: (m + c).gelu(), lambda m, c: (lambda x: 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x ** 3))))(m + c)),
  "residual*2-1": (lambda m, c: (m + c) * 2 - 1, lambda m, c: (m + c) * 2 - 1),
}

@pytest.mark.parametrize("epi", list(EPILOGUES))
@pytest.mark.parametrize("seq", [[(B, 0, 16)], [(U, 1, 4), (B, 0, 8), (S, 0, 1)], [(R, 0, 4), (B, 0, 4)], [(U, 0, 4), (B, 0, 4), (R, 1, 4)],
                                 [(B, 0, 8), (OptOps.PADTO, 0, 5)]], ids=["plain", "tile", "vector-reduce-lanes", "unrolled", "padded"])
def test_block_with_an_epilogue(epi, seq, rng):
  """BLOCK where the kernel computes more than the sum: the blocks before the last store bare partial
  sums, the last applies the epilogue (bias, activation, residual) to the whole sum. Against numpy and
  against the same kernel without opts."""
  M, N, K = 12, 16, 64
  a, b, c = rng.random((M, K), dtype=np.float32) - 0.5, rng.random((K, N), dtype=np.float32) - 0.5, rng.random((M, N), dtype=np.float32)
  tc, ref = EPILOGUES[epi]
  t = tc(Tensor(a) @ Tensor(b), Tensor(c).realize() if epi != "bias+gelu" else Tensor(c[0]).realize())
  si = t.schedule()[-1]
  want = ref(a.astype(np.float64) @ b, c if epi != "bias+gelu" else c[0])
  for b_ in si.bufs:
    if not b_.is_allocated(): b_.allocate()
  outs = []
  for opt_seq in ([], seq):
    k = Kernel(si.ast, Device["CPU"].renderer)
    for o in opt_seq: k.apply_opt(Opt(*o))
    assert k.reduce_block == bool(opt_seq)
    if not runnable():
      assert Device["CPU"].compiler.compile(k.to_program().src)
      return
    CompiledRunner(k.to_program())(list(si.bufs), si.var_vals)
    outs.append(si.bufs[0].numpy().reshape(M, N).copy())
  np.testing.assert_allclose(outs[1], want, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-6)

def test_blocks_read_by_one_or_two_row_tiles_are_unrolled_not_packed(rng):
  """A decode batch's matmul (16 rows, a long reduce): each block of the column operand is read by only 2
  row tiles, so it isn't packed; the block's reduce is unrolled by 4 instead (AVX-512: on AVX2 the whole
  reduce's panel fits a pack and no block is made)."""
  with Context(CPU_ARCH="skylake-avx512"):
    k = hand(bench.matmul_ast(16, 64, 4096))
    assert (B, 0, 256) in opts(k) and (R, 1, 4) in opts(k) and not any(o[0] is P for o in opts(k)), opts(k)
    a, b = rng.standard_normal((16, 4096), dtype=np.float32), rng.standard_normal((4096, 64), dtype=np.float32)
    check(k, [a, b], a @ b, rtol=1e-4, atol=1e-3)
    assert any(o[0] is P for o in opts(hand(bench.matmul_ast(48, 64, 4096)))), "6 row tiles: packed as before"

@pytest.mark.parametrize("arch", list(ARCHS))
def test_panels_read_by_few_row_tiles_are_packed_a_block_at_a_time(arch, rng):
  """A 32-row matmul (8 row tiles of 4 rows on AVX2, 4 of 8 on AVX-512) whose whole column panel fits a pack still packs
  it a block of 256 at a time, so the compute asks for the next block's lines while it runs (lower_pack.py); with many
  row tiles, or fewer than 3 blocks, the whole panel is packed as before. A kernel with two reduces (a SwiGLU's gate and
  up projections, which BLOCK refuses) keeps its whole-panel pack."""
  with Context(CPU_ARCH=arch):
    k = hand(bench.matmul_ast(32, 1024, 2048))
    assert (B, 0, 256) in opts(k) and any(o[0] is P for o in opts(k)), opts(k)
    a, b = rng.standard_normal((32, 2048), dtype=np.float32), rng.standard_normal((2048, 1024), dtype=np.float32)
    check(k, [a, b], a @ b, rtol=1e-4, atol=1e-3)
    for M, K in ((256, 2048), (32, 512)):
      k = hand(bench.matmul_ast(M, 1024, K))
      assert (B, 0, 256) not in opts(k) and any(o[0] is P for o in opts(k)), (M, K, opts(k))
    x, w1, w3 = (Tensor(rng.standard_normal(s, dtype=np.float32)) for s in ((32, 1024), (1024, 512), (1024, 512)))
    g = x @ w1
    (si,) = [si for si in (g * g.sigmoid() * (x @ w3)).schedule() if si.ast.op.name == "KERNEL"]
    k = hand(si.ast)
    assert len(k.reduceops) == 2 and not any(o[0] is B for o in opts(k)) and sum(o[0] is P for o in opts(k)) == 2, opts(k)

@pytest.mark.parametrize("arch", list(ARCHS))
def test_block_of_a_max_reduce(arch, rng):
  """BLOCK on a MAX reduce (column maxima: the rows in blocks of 8 across all column tiles, as column sums take them;
  walking all 64 rows down one column tile was 3.8x slower): the first block starts from the lowest value, not 0
  (every value negative here), a NaN in any block reaches the output, ints work, and an epilogue is applied once,
  by the last block. Against numpy and the unoptimized kernel."""
  vw = ARCHS[arch]
  x = -np.abs(rng.standard_normal((64, 4000), dtype=np.float32)) - 1.0
  x[37, 5], x[3, 4001 % 4000] = np.nan, np.nan
  with Context(CPU_ARCH=arch):
    for t, want in ((Tensor(x).max(0), x.max(0)), ((Tensor(x).max(0) * 2.0).exp(), np.exp(x.max(0) * 2.0))):
      [si] = [si for si in t.schedule() if si.ast.op.name == "KERNEL"]
      k = hand(si.ast)
      assert (B, 0, 8) in opts(k), opts(k)
      check_tensor(t, want, rtol=1e-6)
      if runnable():
        np.testing.assert_allclose(run(k, [x], want.size), _unoptimized(si.ast, [x], want.size), rtol=1e-6)  # (vector exp: an ulp)
    xi = rng.integers(-1000, -10, (64, 4000)).astype(np.int32)
    t = Tensor(xi).max(0)
    [si] = [si for si in t.schedule() if si.ast.op.name == "KERNEL"]
    assert (B, 0, 8) in opts(hand(si.ast)), opts(hand(si.ast))
    if runnable(): np.testing.assert_array_equal(t.numpy(), xi.max(0))

def test_block_on_conv_cin(rng):
  k = Kernel(bench.conv3x3_ast(16, 8, 6, 6), Device["CPU"].renderer)
  for o in [(U, 2, 2), (B, 0, 4), (R, 2, 0)]: k.apply_opt(Opt(*o))
  img, w = rng.random((16, 6, 6), dtype=np.float32), rng.random((8, 16, 3, 3), dtype=np.float32)
  check(k, [img, w], bench.numpy_conv3x3(img, w), rtol=1e-4)

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
  # an epilogue whose output can't hold the float partial sums (a half result)
  t = Tensor.empty(16, 64, dtype=dtypes.half) @ Tensor.empty(64, 16, dtype=dtypes.half)
  k = Kernel(t.schedule()[-1].ast, Device["CPU"].renderer)
  with pytest.raises(KernelOptError, match="must hold the partial sums"): k.apply_opt(Opt(B, 0, 8))
  Kernel(Tensor.empty(16, 64).max(1).schedule()[-1].ast, Device["CPU"].renderer).apply_opt(Opt(B, 0, 8))  # (a MAX is blocked too)
  two = [si for si in Tensor.empty(16, 64).softmax(1).schedule() if si.ast.op.name == "KERNEL" and len(si.ast.src) == 2]  # (max and sum)
  k = Kernel(two[0].ast, Device["CPU"].renderer)
  with pytest.raises(KernelOptError, match="exactly one SUM or MAX"): k.apply_opt(Opt(B, 0, 8))

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
    check_tensor(Tensor(a).sum(0), a.sum(0, dtype=np.float64), rtol=1e-5)

def test_plain_parallel_loops_are_shared_out_dynamically(rng):
  # a slower core (another program) takes fewer chunks instead of holding every kernel up; about
  # 64 chunks, so the shared counter costs little; a symbolic trip count stays static
  from tilecraft.codegen.uops import UOp, UOps
  from tilecraft.renderer.cstyle import CRenderer
  with Context(CPU_ARCH="haswell"):
    assert "#pragma omp parallel for private(pack2) schedule(dynamic, 1)\n" in hand(bench.matmul_ast(1024, 1024, 64)).to_program().src  # 64 column tiles
  mv = Kernel((Tensor(rng.random((4096, 64), dtype=np.float32)) @ Tensor(rng.random(64, dtype=np.float32))).schedule()[-1].ast, Device["CPU"].renderer)
  assert "#pragma omp parallel for schedule(dynamic, 8)\n" in mv.hand_coded_optimizations().to_program().src  # 512 row tiles
  ren = CRenderer()
  zero, var = UOp.const(dtypes.int32, 0), UOp(UOps.DEFINE_VAR, dtypes.int32, (), "n")
  assert ren.parallel_schedule(zero, UOp.const(dtypes.int32, 1000)) == " schedule(dynamic, 16)"
  assert ren.parallel_schedule(zero, UOp.const(dtypes.int32, 1)) == "" and ren.parallel_schedule(zero, var) == ""

def test_dynamic_parallel_loops_with_uneven_thread_counts():
  """Matmul (packed panels: private arrays) and matvec on 3 and 7 threads, in fresh processes."""
  import subprocess, sys
  code = ("import numpy as np; from tilecraft import Tensor, Context\n"
          "rng = np.random.default_rng(2)\n"
          "a, b, x = rng.random((200, 96), dtype=np.float32), rng.random((96, 80), dtype=np.float32), rng.random(96, dtype=np.float32)\n"
          "for arch in ('haswell', 'native'):\n"
          "  with Context(CPU_ARCH=arch):\n"
          "    np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-4)\n"
          "    np.testing.assert_allclose((Tensor(a) @ Tensor(x)).numpy(), a @ x, rtol=1e-4)\n")
  root = str(Path(__file__).resolve().parents[2])
  for n in (3, 7):
    env = {**__import__("os").environ, "OMP_NUM_THREADS": str(n), "PYTHONPATH": root}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]

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
  check(k, [a], a.sum(0, dtype=np.float64), rtol=1e-5)

# ---- shapes from real models (issue 29): remainders, strided convs, stems ----

def _conv_ref(x, w, stride, pad):
  p = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
  win = np.lib.stride_tricks.sliding_window_view(p, w.shape[2:], axis=(2, 3))[:, :, ::stride, ::stride]
  return np.einsum("nchwij,ocij->nohw", win, w.astype(np.float64))

def _check_conv(t, x, w, stride, pad):
  ref = _conv_ref(x, w, stride, pad)
  if not runnable(): return check_tensor(t, ref)  # (only compiled)
  np.testing.assert_allclose(t.numpy(), ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())

def _conv_kernel(x, w, stride, pad):
  """The conv as one kernel, strided 1x1 convs too (conv2d would copy their kept pixels together first on a
  CPU: frontend/nn.py; the strided kernel is what other targets, and strided views of users' own, get)."""
  from tilecraft.frontend import nn
  keep, nn._compacts_strided_pointwise = nn._compacts_strided_pointwise, lambda device: False
  try: t = Tensor(x).conv2d(Tensor(w), stride=stride, padding=pad)
  finally: nn._compacts_strided_pointwise = keep
  return t, hand([si for si in t.schedule() if si.ast.op.name == "KERNEL"][-1].ast)

@pytest.mark.parametrize("arch", list(ARCHS))
def test_matmul_tile_pads_the_column_remainder(arch, rng):
  """N = 124 isn't a multiple of the tile's 2 vectors: padded (masked lanes) instead of the general
  rules' 4-wide scalar tiles (matmul 300x700x500: 3x faster on AVX2)."""
  vw = ARCHS[arch]
  a, b = rng.standard_normal((30, 40), dtype=np.float32), rng.standard_normal((40, 124), dtype=np.float32)
  with Context(CPU_ARCH=arch):
    k = hand(bench.matmul_ast(30, 124, 40))
    assert opts(k)[:2] == [(D, 1, 2 * vw), (U, 1, vw)] and (U, 1, 2) in opts(k)
    assert "column" in k.applied_opts_reasons[0]
    check(k, [a, b], a @ b)

@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("shape", [((1, 256, 30, 30), (64, 256, 1, 1), 2, 0), ((1, 32, 30, 30), (64, 32, 3, 3), 2, 1)], ids=["1x1s2", "3x3s2"])
def test_strided_conv_vectors_run_along_packed_output_channels(arch, shape, rng):
  """A strided conv's output pixels are stride 2 in the image: the tile's vectors run along the output
  channels instead, the weight panel packed so they are contiguous; the 15 pixel rows padded to 16;
  a 3x3's kernel row unrolled."""
  xs, ws, stride, pad = shape
  vw = ARCHS[arch]
  x, w = rng.standard_normal(xs, dtype=np.float32), rng.standard_normal(ws, dtype=np.float32) * 0.1
  with Context(CPU_ARCH=arch):
    t, k = _conv_kernel(x, w, stride, pad)
    o = opts(k)
    assert o[0] == (U, 0, vw) and (U, 0, 2) in o and (P, 2, 0) in o and (D, 2, 8) in o, o
    if ws[-1] == 3: assert o[-1][0] is R
    _check_conv(t, x, w, stride, pad)

@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("shape", [((1, 1024, 14, 14), (64, 1024, 1, 1), 2), ((1, 1024, 7, 7), (64, 1024, 1, 1), 1)], ids=["1x1s2", "1x1at7"])
def test_packed_tile_with_a_long_reduce_takes_one_vector_of_columns(arch, shape, rng):
  """The packed tile's columns are each a vector accumulator of the 8 (padded) pixel rows; with a reduce of
  >= 1024, 2 vectors' worth of columns spill them on AVX-512 (32 accumulators), so one vector's worth. On AVX2
  only where the pixel rows are contiguous (stride 1): strided rows are gathers, which 16 columns share."""
  xs, ws, stride = shape
  vw = ARCHS[arch]
  x, w = rng.standard_normal(xs, dtype=np.float32), rng.standard_normal(ws, dtype=np.float32) * 0.05
  with Context(CPU_ARCH=arch):
    t, k = _conv_kernel(x, w, stride, 0)
    o = opts(k)
    if stride == 1:  # (the 49 pixels padded to 64 take the 2-vector tile instead, see the next test)
      assert o[:2] == [(D, 1, 2 * vw), (U, 1, vw)], o
      return _check_conv(t, x, w, stride, 0)
    assert o[0] == (U, 0, vw) and (P, 2, 0) in o and (U, 1 if stride == 1 else 2, 8) in o, o
    assert ((U, 0, 2) in o) == (vw == 8 and stride == 2), o
    if (U, 0, 2) not in o: assert "2 would spill" in k.applied_opts_reasons[0]
    _check_conv(t, x, w, stride, 0)

@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("size", [7, 14])
def test_1x1_conv_at_7_and_14_pixels_on_32_registers(arch, size, rng):
  """1x1 convs whose pixel count fills no 2-vector tile unpadded (49, 196). With 32 registers (AVX-512): 49 pixels are
  padded to 64 for the 2-vector tile along the pixels (the input channels' panel packed); 196 pixels padded to 208 are
  one 16-lane vector of rows under one vector's worth of output channels, the weights packed (16 accumulators). Both
  1.2-1.4x faster than 8 pixel rows x 32 channels (ResNet-50, measured). With 16 registers (AVX2) the 49 pixels are
  4 tiles of 2 8-lane vectors, padded to 64, with 6 rows (1.3-1.6x faster than 16 channels x 8 pixels, spilled);
  196 pixels keep the 8-row tile."""
  vw = ARCHS[arch]
  x, w = rng.standard_normal((1, 512, size, size), dtype=np.float32), rng.standard_normal((128, 512, 1, 1), dtype=np.float32) * 0.05
  with Context(CPU_ARCH=arch):
    t, k = _conv_kernel(x, w, 1, 0)
    o = opts(k)
    if size == 7: assert o[:2] == [(D, 1, 2 * vw), (U, 1, vw)] and (P, 1, 0) in o and (vw == 8 or o[2] == (U, 0, 8)), o
    elif vw == 8: assert not any("contiguous rows are one vector" in r for r in k.applied_opts_reasons), o
    else: assert o == [(U, 0, vw), (D, 1, vw), (U, 1, vw), (P, 2, 0)] and "one vector of columns" not in k.applied_opts_reasons[2], o
    _check_conv(t, x, w, 1, 0)

@pytest.mark.parametrize("cout, packed", [(16, False), (64, True)])
def test_a_panel_only_two_row_tiles_read_is_not_packed(cout, packed, rng):
  """A 1x1 conv to 16 output channels (SqueezeNet's squeeze convs) on AVX-512: 2 row tiles of 8 read each panel of pixels,
  a run of vector loads, which stays in L1 between them with the column tiles outermost: no copy. 64 output channels (8 row
  tiles) keep the pack."""
  x, w = rng.standard_normal((1, 128, 55, 55), dtype=np.float32), rng.standard_normal((cout, 128, 1, 1), dtype=np.float32) * 0.1
  with Context(CPU_ARCH="skylake-avx512"):
    t, k = _conv_kernel(x, w, 1, 0)
    o = opts(k)
    assert (U, 0, 8) in o and (S, 0, 1) in o and ((P, 1, 0) in o) == packed, o
    if not packed: assert any("only 2 row tile(s) read it: no pack" in r for r in k.applied_opts_reasons), k.applied_opts_reasons
    _check_conv(t, x, w, 1, 0)

@pytest.mark.parametrize("arch", list(ARCHS))
def test_strided_conv_with_28_wide_rows_takes_7_rows(arch, rng):
  """A 3x3 stride-2 conv to 28-wide output rows: the accumulators are vectors of the packed output channels (the
  gathered pixels broadcast, lower_state.py), 2 vectors per pixel row. 7 rows, unpadded: with 32 registers 16 rows padded
  to 32 spill (7 rows 1.15-1.27x faster on ResNet-50's 128 ch at 56^2, AVX-512); with 16, 8 rows padded to 32 are 16
  accumulators, spilled (7 rows 1.04-1.14x faster, AVX2)."""
  vw = ARCHS[arch]
  x, w = rng.standard_normal((1, 64, 56, 56), dtype=np.float32), rng.standard_normal((128, 64, 3, 3), dtype=np.float32) * 0.05
  with Context(CPU_ARCH=arch):
    t, k = _conv_kernel(x, w, 2, 1)
    o = opts(k)
    assert o[:2] == [(U, 0, vw), (U, 2, 7)] and (U, 0, 2) in o and (P, 2, 0) in o, o
    assert f"float{vw} acc" in k.to_program().src
    _check_conv(t, x, w, 2, 1)

@pytest.mark.parametrize("arch", list(ARCHS))
def test_strided_conv_tile_without_its_pack_and_with_odd_rows(arch, rng):
  """A stride-2 3x3 conv of 512 channels to 7x7: the packed tile's panel is over CPU_PACK_MAX_BYTES. One vector of output
  channels x the whole 7-wide row, the weights packed (in blocks of 256 input channels with 32 registers, whose vector's
  panel is 295 KB): 1.23-1.27x faster in ResNet-50 than the unpacked tile on AVX-512, 1.2x on AVX2 (there against the
  unpacked tile with the image's 7 rows whole, itself 1.42x the row-by-row tile). And 17-wide strided rows (no row tile fits on AVX-512) take the
  packed tile (10x faster than the general rules), padded to 7 rows on AVX2 (17 -> 21, 14 accumulators: 1.04-1.14x faster
  than 8 rows' 16) and to 6 on AVX-512 (17 -> 18: 1.25x faster than 8 with the vectors along the output channels)."""
  vw = ARCHS[arch]
  x, w = rng.standard_normal((1, 512, 14, 14), dtype=np.float32), rng.standard_normal((32, 512, 3, 3), dtype=np.float32) * 0.02
  with Context(CPU_ARCH=arch):
    t, k = _conv_kernel(x, w, 2, 1)
    if vw >= 16: assert opts(k) == [(U, 0, vw), (U, 2, 0), (B, 0, 256), (P, 2, 0), (R, 3, 0)], opts(k)
    else: assert opts(k) == [(U, 0, vw), (U, 2, 0), (P, 2, 0), (R, 2, 0)], opts(k)
    _check_conv(t, x, w, 2, 1)
  x, w = rng.standard_normal((1, 128, 34, 34), dtype=np.float32), rng.standard_normal((64, 128, 3, 3), dtype=np.float32) * 0.05
  with Context(CPU_ARCH=arch):
    t, k = _conv_kernel(x, w, 2, 1)
    o = opts(k)
    rows = 6 if vw >= 16 else 7
    assert o[0] == (U, 0, vw) and (D, 2, rows) in o and (U, 2, rows) in o and (P, 2, 0) in o, o
    _check_conv(t, x, w, 2, 1)

@pytest.mark.parametrize("arch", list(ARCHS))
def test_strided_conv_with_14_wide_rows_takes_one_packed_vector_on_32_registers(arch, rng):
  """A 3x3 stride-2 conv of 256 channels to 14-wide rows: 2 vectors of output channels are a panel too big to pack.
  With 32 registers one vector of them (packed, unblocked: 147 KB) x the whole row (14 accumulators), 1.12-1.15x
  faster than the image-packed tile with 16-lane vectors along the padded row (ResNet-50, AVX-512); AVX2 packs 2
  vectors of 8 (the same 147 KB) over 7 rows (8 padded ones, 16 accumulators, spilled: 1.07-1.18x slower)."""
  vw = ARCHS[arch]
  x, w = rng.standard_normal((1, 256, 28, 28), dtype=np.float32), rng.standard_normal((64, 256, 3, 3), dtype=np.float32) * 0.02
  with Context(CPU_ARCH=arch):
    t, k = _conv_kernel(x, w, 2, 1)
    o = opts(k)
    if vw >= 16: assert o == [(U, 0, vw), (U, 2, 0), (P, 2, 0), (R, 2, 0)], o
    else: assert o[:3] == [(U, 0, vw), (U, 2, 7), (U, 0, 2)] and (P, 2, 0) in o, o
    _check_conv(t, x, w, 2, 1)

@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("cin,cout,size", [(64, 128, 13), (512, 32, 7)])
def test_conv_rows_no_vector_divides_take_vectors_of_output_channels(arch, cin, cout, size, rng):
  """A 3x3 conv to 13- or 7-wide rows (SqueezeNet, Inception, ResNet-50 and VGG's late stages): with 32 registers
  one vector of output channels over their packed weights (in blocks of 256 input channels where that panel is too
  big) x the whole row, a broadcast pixel each, unpadded: the lowering makes the accumulators vectors of output
  channels and stores them lane by lane. 1.15-1.39x faster than 16-lane vectors along the row padded to 16 (8 for
  the 7-wide ones), AVX-512, on the models' own kernels. With 16 registers (AVX2, rows of at most 14) the same with
  8-lane vectors, whose panel fits a pack unblocked: 1.1-1.5x faster than the padded rows (SqueezeNet, Inception,
  ResNet-50's kernels, interleaved)."""
  vw = ARCHS[arch]
  x, w = rng.standard_normal((1, cin, size, size), dtype=np.float32), rng.standard_normal((cout, cin, 3, 3), dtype=np.float32) * 0.05
  with Context(CPU_ARCH=arch):
    t, k = _conv_kernel(x, w, 1, 1)
    o, src = opts(k), k.to_program().src
    if vw >= 16:
      blocked = [(B, 0, 256)] if cin == 512 else []
      assert o == [(U, 0, vw), (U, 2, 0)] + blocked + [(P, 2, 0), (R, 3 if blocked else 2, 0)], o
      assert "float16 acc" in src and "float acc" not in src and (R, 2, 0) not in [(q.op, q.axis, q.amt) for q in k.applied_opts[:2]]
    else: assert o == [(U, 0, vw), (U, 2, 0), (P, 2, 0), (R, 2, 0)] and "float8 acc" in src and "float acc" not in src, o
    _check_conv(t, x, w, 1, 1)

def test_packed_conv_rows_are_whole_vectors(rng):
  """A stride-2 3x3 conv of 32 channels with 17-wide output rows takes the packed tile (AVX2), 7 rows (padded to 21;
  8 rows padded to 24 ran 1.07-1.15x slower) with the kernel row unrolled, and vector accumulators (of the output
  channels), never scalar ones (3-5x slower)."""
  x, w = rng.standard_normal((1, 32, 34, 34), dtype=np.float32), rng.standard_normal((64, 32, 3, 3), dtype=np.float32) * 0.1
  with Context(CPU_ARCH="haswell"):
    t, k = _conv_kernel(x, w, 2, 1)
    o = opts(k)
    assert (D, 2, 7) in o and (U, 2, 7) in o and (P, 2, 0) in o, o
    assert "float8 acc" in k.to_program().src and "float acc" not in k.to_program().src
    _check_conv(t, x, w, 2, 1)

@pytest.mark.parametrize("arch", list(ARCHS))
def test_stem_keeps_vectors_along_output_pixels(arch, rng):
  """A 7x7 stride-2 stem (reduce of 3x7x7 = 147): too short to repay a pack, so the vectors stay
  along the output pixels (strided loads) and the kernel row is unrolled. A strided vector load is vw
  scalar loads: one vector and twice the rows (12 on AVX2, 16 on AVX-512) share each; with 16 output
  channels on AVX2 (12 would pad by half) the usual rows x 2 vectors."""
  vw = ARCHS[arch]
  x = rng.standard_normal((1, 3, 64, 64), dtype=np.float32)
  for cout in (48, 16):
    w = rng.standard_normal((cout, 3, 7, 7), dtype=np.float32) * 0.1
    with Context(CPU_ARCH=arch):
      t, k = _conv_kernel(x, w, 2, 3)
      o = opts(k)
      assert o[0] == (U, 2, vw) and o[-1] == (R, 2, 0), o
      if cout == 48 or vw == 16: assert (U, 0, 12 if vw == 8 else 16) in o and (U, 2, 2) not in o, o
      else: assert (U, 2, 2) in o, o  # (12 rows would pad 16 by half: the usual rows x 2 vectors)
      if cout == 48: assert (P, 2, 0) not in o, o  # (the weights are not packed: the packed tile doesn't pay at 147)
      _check_conv(t, x, w, 2, 3)

@pytest.mark.parametrize("arch", list(ARCHS))
def test_stem_with_one_vector_of_columns_takes_the_tile(arch, rng):
  """A stem whose output rows are a multiple of one vector but not of the tile's 2 (48 here, ResNet-50's 112 on
  AVX-512): the strided-loads tile needs only one vector of columns, so it applies (it took the general rules:
  2.6x slower on ResNet-50's stem, AVX-512, 1 thread). With 16 registers and an even count of 16-channel column tiles
  the packed tile of vectors of output channels takes it instead (1.5-1.65x faster than the strided loads, AVX2); with
  an odd one (3, a 48-channel stem) the strided loads stay (the packed tile 0.83x there, one of 2 cores idle a third of
  the time)."""
  vw = ARCHS[arch]
  x, w = rng.standard_normal((1, 3, 96, 96), dtype=np.float32), rng.standard_normal((32, 3, 7, 7), dtype=np.float32) * 0.1
  with Context(CPU_ARCH=arch):
    t, k = _conv_kernel(x, w, 2, 3)
    o = opts(k)
    if vw == 16: assert o == [(U, 2, 16), (U, 0, 16), (R, 2, 0)], o
    else: assert o[:3] == [(U, 0, 8), (U, 2, 8), (U, 0, 2)] and (P, 2, 0) in o and o[-1] == (R, 2, 0), o
    _check_conv(t, x, w, 2, 3)
  w48 = rng.standard_normal((48, 3, 7, 7), dtype=np.float32) * 0.1
  with Context(CPU_ARCH=arch):
    t, k = _conv_kernel(x, w48, 2, 3)
    o = opts(k)
    assert o[0] == (U, 2, vw) and o[-1] == (R, 2, 0) and (U, 2, 2) not in o and (P, 2, 0) not in o, o
    _check_conv(t, x, w48, 2, 3)

@pytest.mark.parametrize("arch", list(ARCHS))
def test_vector_matrix_takes_column_tiles_of_8_vectors(arch, rng):
  """x @ W with one row of x (fc at batch 1): 8 vectors of W's columns per thread, padded from 250 to 256."""
  vw = ARCHS[arch]
  x, w = rng.standard_normal((1, 300), dtype=np.float32), rng.standard_normal((300, 250), dtype=np.float32)
  with Context(CPU_ARCH=arch):
    t = Tensor(x) @ Tensor(w)
    k = hand([si for si in t.schedule() if si.ast.op.name == "KERNEL"][-1].ast)
    assert opts(k) == [(D, 0, 8 * vw), (U, 0, vw), (U, 0, 8)], opts(k)
    check_tensor(t, x @ w)

@pytest.mark.parametrize("arch", list(ARCHS))
def test_fused_matmuls_share_one_tile_with_both_panels_packed(arch, rng):
  """SwiGLU's silu(x @ w1) * (x @ w3) is one kernel of two reduces: the matmul tile with one vector of columns and
  8 rows (AVX-512) or 4 (AVX2): each reduce has its own accumulators, 16 or 8 in all, which fit the registers; both
  column operands packed."""
  vw = ARCHS[arch]
  x, w1, w3 = (rng.standard_normal(s, dtype=np.float32) * 0.2 for s in ((32, 64), (64, 4 * vw), (64, 4 * vw)))  # (4 row tiles or more: packed)
  with Context(CPU_ARCH=arch):
    tx = Tensor(x)
    h = tx @ Tensor(w1)
    t = h * h.sigmoid() * (tx @ Tensor(w3))
    k = hand([si for si in t.schedule() if si.ast.op.name == "KERNEL"][-1].ast)
    assert len(k.reduceops) == 2
    o = opts(k)
    assert o[:2] == [(U, 1, vw), (U, 0, 8 if vw == 16 else 4)] and (U, 1, 2) not in o and sum(op is P for op, _, _ in o) == 2, o
    h64 = x.astype(np.float64) @ w1
    want = (h64 / (1 + np.exp(-h64)) * (x.astype(np.float64) @ w3)).astype(np.float32)
    if runnable(): np.testing.assert_allclose(t.numpy(), want, rtol=1e-4, atol=1e-5 * np.abs(want).max())  # (values near 0)
    else: check_tensor(t, want)

@pytest.mark.parametrize("arch", list(ARCHS))
def test_attention_scores_take_the_matmul_tile_with_k_packed_per_head(arch, rng):
  """q @ k^T per head: k is strided along the scores' columns and moves along the head loop, so the column tiles go
  just inside the head loop (SWAP 1, 2) and k's panel is packed per head and column tile (the pack's scope is the
  column loop): the ordinary matmul tile (3.3x faster than dot products on AVX-512, BERT's 12x128x128x64).
  v in probs @ v is contiguous along the columns: no pack, no swap (packing it measured slower)."""
  vw = ARCHS[arch]
  q, kk = rng.standard_normal((3, 48, 32), dtype=np.float32), rng.standard_normal((3, 4 * vw, 32), dtype=np.float32)
  with Context(CPU_ARCH=arch):
    t = Tensor(q) @ Tensor(kk).transpose(-1, -2)
    k = hand([si for si in t.schedule() if si.ast.op.name == "KERNEL"][-1].ast)
    rows = [(U, 1, 8)] if vw == 16 else [(U, 1, 6)]
    assert opts(k) == [(U, 2, vw)] + rows + [(U, 2, 2), (S, 1, 2), (P, 2, 0)], opts(k)
    assert "inside the loops the column operand moves along" in k.applied_opts_reasons[3]
    check_tensor(t, q @ kk.transpose(0, 2, 1))
    p = rng.standard_normal((3, 48, 32), dtype=np.float32)
    t = Tensor(p) @ Tensor(kk)[:, :32]
    k = hand([si for si in t.schedule() if si.ast.op.name == "KERNEL"][-1].ast)
    assert not any(o[0] in (P, S) for o in opts(k)), opts(k)
    check_tensor(t, p @ kk[:, :32])

def _unoptimized(ast, inputs, out_size):
  """The kernel without opts: the reference the optimized kernel must match (where this host runs the arch)."""
  return run(Kernel(ast, Device["CPU"].renderer), inputs, out_size)

def check_unoptimized(si, rtol, atol, k=None):
  """Schedule item si's kernel (k, else the hand-coded one) against the unoptimized one on si's inputs, realized
  already (by check_tensor), where this host runs the CPU_ARCH in force."""
  if not runnable(): return
  flat, n = [b.numpy() for b in si.bufs[1:]], si.bufs[0].size
  np.testing.assert_allclose(run(k or hand(si.ast), flat, n), _unoptimized(si.ast, flat, n), rtol=rtol, atol=atol)

# (M, N, K) -> the short-rows tile's opts on AVX2 (8 lanes) and AVX-512 (16 lanes); None: the rule doesn't fire
SHORT_ROWS = {
  (8, 1024, 256): {8: [(U, 1, 8), (U, 0, 0), (U, 0, 2), (B, 0, 16)], 16: [(U, 1, 16), (U, 0, 0), (U, 0, 2), (B, 0, 16)]},
  # 1000 columns padded to the tile; a reduce of 264 (16 doesn't divide it) in blocks of 8
  (5, 1000, 264): {8: [(D, 1, 16), (U, 1, 8), (U, 0, 0), (U, 0, 2), (B, 0, 8)], 16: [(D, 1, 32), (U, 1, 16), (U, 0, 0), (U, 0, 2), (B, 0, 8)]},
  # 12 rows: 2 row tiles of 6 x 2 vectors of columns (either register count)
  (12, 512, 512): {8: [(U, 1, 8), (U, 0, 6), (U, 1, 2), (B, 0, 16)], 16: [(U, 1, 16), (U, 0, 6), (U, 1, 2), (B, 0, 16)]},
  # 16 rows: 2 row tiles of 8 rows x 2 vectors (with 16 registers too: 16 accumulators, some spilled, beat 8 x 1)
  (16, 512, 512): {8: [(U, 1, 8), (U, 0, 8), (U, 1, 2), (B, 0, 16)], 16: [(U, 1, 16), (U, 0, 8), (U, 1, 2), (B, 0, 16)]},
  # 13 rows: padded to 2 row tiles of 7 (masked rows) x 2 vectors; 10 rows keep one vector x all 10 rows with 32 registers
  (13, 512, 512): {8: [(U, 1, 8), (D, 0, 7), (U, 0, 7), (U, 1, 2), (B, 0, 16)], 16: [(U, 1, 16), (D, 0, 7), (U, 0, 7), (U, 1, 2), (B, 0, 16)]},
  (10, 512, 512): {8: [(U, 1, 8), (U, 0, 5), (U, 1, 2), (B, 0, 16)], 16: [(U, 1, 16), (U, 0, 0), (B, 0, 16)]},
  # 11 rows: with 16 registers padded to 2 row tiles of 6 (masked rows)
  (11, 512, 512): {8: [(U, 1, 8), (D, 0, 6), (U, 0, 6), (U, 1, 2), (B, 0, 16)], 16: [(U, 1, 16), (U, 0, 0), (B, 0, 16)]},
  # 17-24 rows: 4 row tiles of 5-6 rows x 2 vectors (18 padded to 20); 24 rows on 32 registers only with a reduce of 2048+
  (20, 512, 512): {8: [(U, 1, 8), (U, 0, 5), (U, 1, 2), (B, 0, 16)], 16: [(U, 1, 16), (U, 0, 5), (U, 1, 2), (B, 0, 16)]},
  (18, 512, 512): {8: [(U, 1, 8), (D, 0, 5), (U, 0, 5), (U, 1, 2), (B, 0, 16)], 16: [(U, 1, 16), (D, 0, 5), (U, 0, 5), (U, 1, 2), (B, 0, 16)]},
  (24, 512, 512): {8: [(U, 1, 8), (U, 0, 6), (U, 1, 2), (B, 0, 16)], 16: None},
  (24, 512, 2048): {8: [(U, 1, 8), (U, 0, 6), (U, 1, 2), (B, 0, 16)], 16: [(U, 1, 16), (U, 0, 6), (U, 1, 2), (B, 0, 16)]},
  (32, 512, 2048): {8: None, 16: None},  # more than 24 rows: the ordinary tile
  (16, 128, 4096): {8: None, 16: None},  # rows of 512 B, too short to stream once per row tile: the ordinary tile's column strips
  (8, 256, 256): {8: None, 16: None},  # a column operand of 256 KB stays in cache: the ordinary tile
  # 5-8 rows with a reduce of 2048+: 2 row tiles of 3-4 rows x 2 vectors with 16 registers (8 x 2 spilled: 1.06-1.56x),
  # all the rows with 32 (7 padded to 2 tiles of 4)
  (8, 1024, 2048): {8: [(U, 1, 8), (U, 0, 4), (U, 1, 2), (B, 0, 16)], 16: [(U, 1, 16), (U, 0, 0), (U, 0, 2), (B, 0, 16)]},
  (7, 512, 4096): {8: [(U, 1, 8), (D, 0, 4), (U, 0, 4), (U, 1, 2), (B, 0, 16)], 16: [(U, 1, 16), (U, 0, 0), (U, 0, 2), (B, 0, 16)]},
}

@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("shape", list(SHORT_ROWS))
def test_short_rows_tile_streams_the_column_operand_in_blocks(arch, shape, rng):
  """A matmul with few rows and a long reduce over a big column operand (a decode batch): all the rows in the tile,
  one output loop (the column tiles) inside blocks of 16 reduce steps (BLOCK), no pack; against numpy and against
  the unoptimized kernel."""
  M, N, K = shape
  want_opts = SHORT_ROWS[shape][ARCHS[arch]]
  a, b = rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
  with Context(CPU_ARCH=arch):
    ast = bench.matmul_ast(M, N, K)
    k = hand(ast)
    if want_opts is None:
      assert not any("short-rows" in r for r in k.applied_opts_reasons), opts(k)
      return
    assert opts(k) == want_opts, opts(k)
    assert any("short-rows tile" in r for r in k.applied_opts_reasons) and not any(o[0] is P for o in opts(k))
    check(k, [a, b], a @ b, rtol=1e-4, atol=1e-3)
    if runnable():
      # (sums of up to 4096 products of magnitude ~100: an element near 0 differs by the summation order's rounding)
      np.testing.assert_allclose(run(k, [a, b], M * N).reshape(M, N), _unoptimized(ast, [a, b], M * N).reshape(M, N), rtol=1e-4,
                                 atol=max(1e-4, 1e-6 * float(np.abs(a @ b).max())))

@pytest.mark.parametrize("arch", list(ARCHS))
def test_short_rows_tile_through_tensor_with_bias(arch, rng):
  """x @ W + b at 8 rows: the bias is the block's epilogue (added once, by the last block)."""
  x, w, bias = (rng.standard_normal(s, dtype=np.float32) for s in ((8, 512), (512, 1000), (1000,)))
  with Context(CPU_ARCH=arch):
    t = Tensor(x) @ Tensor(w) + Tensor(bias)
    k = hand([si for si in t.schedule() if si.ast.op.name == "KERNEL"][-1].ast)
    assert any("short-rows tile" in r for r in k.applied_opts_reasons), opts(k)
    check_tensor(t, x @ w + bias, rtol=1e-3, atol=1e-5 * float(np.abs(x @ w + bias).max()))  # (sums of 512 products: an element near 0)

def test_rows_taken_whole_keep_the_second_vector_of_columns(rng):
  """8 rows on AVX-512 (a reduce too short for the short-rows tile): the tile's rows take their axis whole, and the
  second vector of columns is upcast on the columns' axis, which moved down (it was refused before: one vector)."""
  with Context(CPU_ARCH="skylake-avx512"):
    k = hand(bench.matmul_ast(8, 1024, 128))
    assert opts(k)[:3] == [(U, 1, 16), (U, 0, 8), (U, 0, 2)], opts(k)
    a, b = rng.standard_normal((8, 128), dtype=np.float32), rng.standard_normal((128, 1024), dtype=np.float32)
    check(k, [a, b], a @ b, rtol=1e-4, atol=1e-4)

@pytest.mark.parametrize("arch", list(ARCHS))
def test_vector_matrix_streams_a_big_matrix_in_blocks(arch, rng):
  """x @ W + b at batch 1 with W of 2 MB and 4+ column tiles: the reduce in blocks of 8 with the column tiles inside
  (each thread streams whole rows of W); the bias is the last block's epilogue. A narrow W (2 column tiles) isn't blocked."""
  vw = ARCHS[arch]
  x, w, bias = (rng.standard_normal(s, dtype=np.float32) for s in ((1, 512), (512, 1024), (1024,)))
  with Context(CPU_ARCH=arch):
    t = Tensor(x) @ Tensor(w) + Tensor(bias)
    si = [si for si in t.schedule() if si.ast.op.name == "KERNEL"][-1]
    k = hand(si.ast)
    assert opts(k) == [(U, 0, vw), (U, 0, 8), (B, 0, 8)], opts(k)
    check_tensor(t, x @ w + bias, rtol=1e-4, atol=1e-3)
    check_unoptimized(si, 1e-4, 1e-4, k)
    assert not any(o[0] is B for o in opts(hand(bench.matmul_ast(1, 2 * 8 * vw, 4096))))

@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("shape", [(27, 27, 128), (3136, 64), (13, 13, 48)], ids=["27x27x128", "3136x64", "13x13x48"])
def test_transposing_copy_takes_a_tile_of_both_axes(arch, shape, rng):
  """A channels-last tensor copied to channels-first with an epilogue (Winograd's output copy): a T x T tile of the
  input's contiguous axis and the output's (T = the vector width), the output's padded where that adds <= 1/3
  (27 -> 32, 13 -> 16), so rows are loaded and stored whole. Against numpy."""
  vw = ARCHS[arch]
  x = rng.standard_normal(shape, dtype=np.float32)
  perm = (len(shape) - 1,) + tuple(range(len(shape) - 1))
  with Context(CPU_ARCH=arch):
    t = (Tensor(x).permute(*perm) + 1.0).relu()
    [si] = [si for si in t.schedule() if si.ast.op.name == "KERNEL"]
    o, full = opts(hand(si.ast)), Kernel(si.ast, Device["CPU"].renderer).full_shape  # (the output's later axes merge: (128, 729))
    last = len(full) - 1
    tile = vw if shape[-1] % vw == 0 and shape[-1] > vw else 8
    pad = [(D, last, tile)] if full[last] % tile else []
    assert o == pad + [(U, 0, tile), (U, last, tile)], o
    check_tensor(t, np.maximum(np.transpose(x, perm) + 1.0, 0.0))

@pytest.mark.parametrize("arch", list(ARCHS))
def test_masked_transposing_copy_takes_no_tile(arch, rng):
  """A concatenation whose channels-last piece is copied to channels-first (DenseNet-121's dense blocks after a
  Winograd conv): the transposed input is gated per element, so no T x T tile (it ran 1.04-1.4x slower there,
  and its unrolled gates took gcc 1-8 s per kernel): nothing of the channel axis is upcast. Against numpy."""
  x, y = rng.standard_normal((3136, 32), dtype=np.float32), rng.standard_normal((64, 3136), dtype=np.float32)
  with Context(CPU_ARCH=arch):
    t = (Tensor(y).cat(Tensor(x).permute(1, 0), axis=0) + 1.0).relu()
    [si] = [si for si in t.schedule() if si.ast.op.name == "KERNEL"]
    o = opts(hand(si.ast))
    assert not any(op is U and ax == 0 for op, ax, amt in o), o
    check_tensor(t, np.maximum(np.concatenate([y, x.T], 0) + 1.0, 0.0))

@pytest.mark.parametrize("arch", list(ARCHS))
def test_pad_copy_rows_padded_to_vectors(arch, rng):
  """A pad (-inf, before a max-pool) whose 114-wide rows no vector divides: the rows padded to the vector width (masked
  lanes) and vectorized, 1.8-2x faster than scalar (AVX2 and AVX-512); a selection between two inputs (a concatenation)
  of the same odd rows keeps its lanes unpadded (per-lane gated vectors were 1.5-2.3x slower). Against numpy."""
  vw = ARCHS[arch]
  x = rng.standard_normal((1, 8, 112, 112), dtype=np.float32)
  with Context(CPU_ARCH=arch):
    t = Tensor(x).pad(((0, 0), (0, 0), (1, 1), (1, 1)), value=-math.inf).contiguous()
    [si] = [si for si in t.schedule() if si.ast.op.name == "KERNEL"]
    assert opts(hand(si.ast)) == [(D, 2, vw), (U, 2, vw)]
    check_tensor(t, np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf))
    y = rng.standard_normal((1, 8, 112, 2), dtype=np.float32)
    t = Tensor(x).cat(Tensor(y), axis=3).contiguous()
    [si] = [si for si in t.schedule() if si.ast.op.name == "KERNEL"]
    assert not any(op is D for op, _, _ in opts(hand(si.ast))), opts(hand(si.ast))
    check_tensor(t, np.concatenate([x, y], 3))

@pytest.mark.parametrize("arch", list(ARCHS))
def test_elementwise_odd_rows_padded_to_vectors(arch, rng):
  """Elementwise kernels whose contiguous axis no vector divides: padded to the vector width (masked lanes) and
  vectorized, not scalar (exp over 1000 x 1001: 7.5x faster on AVX-512) nor 4 lanes where 4 divides (sigmoid * y over a
  vocabulary's 8 x 50257 logits flattened: 2.5x; 8 lanes divide them). A window masked along another axis (an LRN's channel window: one gate
  per row) and a concatenation along the rows are padded too; a concatenation along the padded axis is not. Against
  numpy and the unoptimized kernel."""
  vw = ARCHS[arch]
  x, y = rng.standard_normal((100, 1001), dtype=np.float32), rng.standard_normal((1, 1001), dtype=np.float32)
  z = rng.standard_normal((8, 50257), dtype=np.float32)
  with Context(CPU_ARCH=arch):
    for t, want, axis, n_in in (((Tensor(x) * Tensor(y)).exp(), np.exp(x * y), 1, 2),
                                (Tensor(z).sigmoid() * Tensor(z * 2), 1 / (1 + np.exp(-z)) * z * 2, 0, 2)):
      [si] = [si for si in t.schedule() if si.ast.op.name == "KERNEL"]
      k = hand(si.ast)
      size = want.size if axis == 0 else want.shape[axis]  # (the logits' kernel is flat: 8 x 50257 in one axis)
      assert opts(k) == ([(D, axis, vw)] if size % vw else []) + [(U, axis, vw)], opts(k)
      check_tensor(t, want, rtol=1e-5, atol=1e-6)
    # a channel window (rows of 109 x 109 pixels, 3 channels each side): masks along the channels only
    c = rng.standard_normal((1, 12, 109, 109), dtype=np.float32)
    win = (Tensor(c) * Tensor(c)).pad(((0, 0), (1, 1), (0, 0), (0, 0)))
    sc = rng.standard_normal((1, 12, 1, 1), dtype=np.float32)  # (a per-channel scale keeps the channel axis apart)
    t = Tensor(c) * Tensor(sc) / (1.0 + win[:, 0:12] + win[:, 1:13] + win[:, 2:14]).sqrt()
    [si] = [si for si in t.schedule() if si.ast.op.name == "KERNEL"]
    k = hand(si.ast)
    assert opts(k) == [(D, 1, vw), (U, 1, vw)], opts(k)
    cp = np.pad(c * c, ((0, 0), (1, 1), (0, 0), (0, 0)))
    want = c * sc / np.sqrt(1.0 + cp[:, 0:12] + cp[:, 1:13] + cp[:, 2:14])
    check_tensor(t, want, rtol=1e-5, atol=1e-6)
    check_unoptimized(si, 1e-5, 1e-6, k)
    # a concatenation along the rows (a gate per row) is padded; along the odd axis (lanes gated per load) it is not
    t = (Tensor(x).cat(Tensor(y), axis=0) + Tensor(y)).exp()
    [si] = [si for si in t.schedule() if si.ast.op.name == "KERNEL"]
    assert opts(hand(si.ast)) == [(D, 1, vw), (U, 1, vw)], opts(hand(si.ast))
    check_tensor(t, np.exp(np.concatenate([x, y], 0) + y), rtol=1e-5)
    t = (Tensor(x[:, :1000]).cat(Tensor(x[:, :1]), axis=1) * 2).exp()
    [si] = [si for si in t.schedule() if si.ast.op.name == "KERNEL"]
    assert not any(op is D for op, _, _ in opts(hand(si.ast))), opts(hand(si.ast))
    check_tensor(t, np.exp(np.concatenate([x[:, :1000], x[:, :1]], 1) * 2), rtol=1e-5)

@pytest.mark.parametrize("arch", list(ARCHS))
def test_odd_column_and_row_reduces(arch, rng):
  """A column reduce whose 999 columns no vector divides: the columns padded to the vector width and vectorized (scalar
  before: 13x slower). A row reduce over 5000-long rows (argmax's max and index reduce, fused): vectors along the rows,
  half the width on AVX-512 where the width doesn't divide them, and its 1000 output rows not padded (masked loads
  only: 1.4x slower). Against numpy."""
  vw = ARCHS[arch]
  x, y = rng.standard_normal((1001, 999), dtype=np.float32), rng.standard_normal((1000, 5000), dtype=np.float32)
  with Context(CPU_ARCH=arch):
    t = Tensor(x).sum(0)
    [si] = [si for si in t.schedule() if si.ast.op.name == "KERNEL"]
    assert opts(hand(si.ast))[:2] == [(D, 0, vw), (U, 0, vw)], opts(hand(si.ast))
    check_tensor(t, x.sum(0), rtol=1e-4, atol=1e-3)
    t = Tensor(y).argmax(1)
    [si] = [si for si in t.schedule() if si.ast.op.name == "KERNEL" and si.ast.src[0].arg.dtype == dtypes.int64]
    o = opts(hand(si.ast))
    assert (R, 0, 8) in o and not any(op is D for op, _, _ in o), o
    check_tensor(t, np.argmax(y, 1))

@pytest.mark.parametrize("arch", list(ARCHS))
def test_odd_axes_take_half_width_lanes_where_the_width_pads_too_much(arch, rng):
  """Softmax over the axis before the last (8 x 1000 x 49: the 49 columns contiguous): its column reduce and its
  elementwise kernel pad the 49 to 56 as 8 lanes on both ISAs (AVX-512's 16 would add 15: scalar code before, 4x slower
  in all); a 24-wide elementwise row takes 8 lanes unpadded on AVX-512 (4 before: 1.9x slower). Against numpy and the
  unoptimized kernels."""
  vw = ARCHS[arch]
  x, y, b = rng.standard_normal((8, 1000, 49), dtype=np.float32), rng.standard_normal((300, 24), dtype=np.float32), \
    rng.standard_normal((1, 24), dtype=np.float32)
  e = np.exp(x - x.max(1, keepdims=True))
  with Context(CPU_ARCH=arch):
    t = Tensor(x).softmax(1)
    kernels = [si for si in t.schedule() if si.ast.op.name == "KERNEL"]
    assert len(kernels) == 2
    for si, axis in zip(kernels, (1, 2)):
      o = opts(hand(si.ast))
      assert o[0] == (D, axis, 8) and (U, axis, 8) in o and not any(op is U and ax == axis and amt != 8 for op, ax, amt in o), o
    check_tensor(t, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)
    for si in kernels: check_unoptimized(si, 1e-5, 1e-7)
    t = (Tensor(y) + Tensor(b)).exp()
    [si] = [si for si in t.schedule() if si.ast.op.name == "KERNEL"]
    assert opts(hand(si.ast)) == [(U, 1, 8)], opts(hand(si.ast))
    check_tensor(t, np.exp(y + b), rtol=1e-6)

@pytest.mark.parametrize("arch", list(ARCHS))
def test_conv_of_512_channels_blocks_its_channels_to_pack_on_avx2(arch, rng):
  """A 3x3 conv of 512 input channels with 28-wide rows on AVX2: the packed tile's panel (512 x 9 x 16 weights, 295 KB)
  is over the pack limit and no other tile takes 28-wide rows, so the input channels run in blocks of 256 and each
  block's panel is packed (the general rules' tile ran 2.5-3.2x slower). AVX-512 keeps its tile (vectors along the rows, no
  pack, no blocks). Direct conv (WINO=0); against numpy and the unoptimized kernel."""
  x, w = rng.standard_normal((1, 512, 8, 28), dtype=np.float32), rng.standard_normal((32, 512, 3, 3), dtype=np.float32) / 48
  xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
  want = np.einsum("nchwij,ocij->nohw", np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3)), w)
  with Context(CPU_ARCH=arch, WINO=0):
    t = Tensor(x).conv2d(Tensor(w), padding=1)
    [si] = [si for si in t.schedule() if si.ast.op.name == "KERNEL"]
    o = opts(hand(si.ast))
    if ARCHS[arch] == 8: assert (B, 0, 256) in o and any(op is P for op, _, _ in o), o
    else: assert not any(op in (B, P) for op, _, _ in o), o
    check_tensor(t, want, rtol=1e-4, atol=1e-4)
    check_unoptimized(si, 1e-4, 1e-4)

@pytest.mark.parametrize("arch", list(ARCHS))
def test_batched_1x1_conv_packs_its_image_panel_inside_the_batch(arch, rng):
  """A 1x1 conv at batch 3: the batch (the weights broadcast along it, the image stepping past its whole panel) is not
  the column tiles; the pixel tiles go just inside it and each image panel is packed, as at batch 1. Against numpy and
  the unoptimized kernel."""
  vw = ARCHS[arch]
  x, w = rng.standard_normal((3, 64, 16, 16), dtype=np.float32), rng.standard_normal((32, 64, 1, 1), dtype=np.float32) / 8
  with Context(CPU_ARCH=arch):
    t = Tensor(x).conv2d(Tensor(w))
    [si] = [si for si in t.schedule() if si.ast.op.name == "KERNEL"]
    o = opts(hand(si.ast))
    assert (U, 2, vw) in o and (S, 1, 2) in o and (P, 1, 0) in o, o
    want = np.einsum("nchw,oc->nohw", x, w[:, :, 0, 0])
    check_tensor(t, want, rtol=1e-4, atol=1e-5)
    check_unoptimized(si, 1e-4, 1e-5)

@pytest.mark.parametrize("arch", list(ARCHS))
def test_padded_rows_of_a_2_vector_tile(arch, rng):
  """A batched matmul with 49 rows (Winograd's tiles of a 14x14 image): padded to 8 rows with 32 registers; with 16
  (AVX2) to 4 rows, as where 8 divides (8 rows x 2 vectors spill: 1.15-1.68x slower in five models). Against numpy."""
  vw = ARCHS[arch]
  a, b = rng.standard_normal((16, 49, 128), dtype=np.float32), rng.standard_normal((16, 128, 256), dtype=np.float32)
  with Context(CPU_ARCH=arch):
    t = Tensor(a) @ Tensor(b)
    [si] = [si for si in t.schedule() if si.ast.op.name == "KERNEL"]
    rows = 8 if vw >= 16 else 4
    assert opts(hand(si.ast))[:3] == [(U, 2, vw), (D, 1, rows), (U, 1, rows)], opts(hand(si.ast))
    check_tensor(t, a @ b, rtol=1e-4, atol=1e-3)

@pytest.mark.parametrize("arch", list(ARCHS))
def test_two_reduces_of_distinct_inputs(arch, rng):
  """Two 1x1 convs of distinct inputs summed in one kernel (a bottleneck's last conv and its projection shortcut): with
  16 registers (AVX2) one row of 4 vectors per reduce (1.5-1.68x faster than 4 rows of one in ResNet-50); with 32, and
  where the reduces share an input (SwiGLU's x @ w1 and x @ w3), rows of one vector each. Against numpy."""
  vw = ARCHS[arch]
  h, x = rng.standard_normal((1, 64, 16, 16), dtype=np.float32), rng.standard_normal((1, 64, 16, 16), dtype=np.float32)
  w1, w2 = (rng.standard_normal((128, 64, 1, 1), dtype=np.float32) * 0.1 for _ in range(2))
  with Context(CPU_ARCH=arch):
    t = Tensor(h).conv2d(Tensor(w1)) + Tensor(x).conv2d(Tensor(w2))
    [si] = [si for si in t.schedule() if si.ast.op.name == "KERNEL"]
    o = opts(hand(si.ast))
    assert o[:2] == ([(U, 1, 8), (U, 1, 4)] if vw == 8 else [(U, 1, vw), (U, 0, 8)]), o
    check_tensor(t, _conv_ref(h, w1, 1, 0) + _conv_ref(x, w2, 1, 0), rtol=1e-4, atol=1e-4)
    a, b, c = (rng.standard_normal(s, dtype=np.float32) for s in [(32, 256), (256, 512), (256, 512)])
    ta = Tensor(a)
    t2 = (ta @ Tensor(b)) * (ta @ Tensor(c))
    [si] = [si for si in t2.schedule() if si.ast.op.name == "KERNEL"]
    assert not any(op is U and amt == 4 and ax == 1 for op, ax, amt in opts(hand(si.ast))[1:2]), opts(hand(si.ast))
    check_tensor(t2, (a @ b) * (a @ c), rtol=1e-4, atol=1e-2)

@pytest.mark.parametrize("arch", list(ARCHS))
def test_a_scalar_input_is_no_data_reuse(arch, rng):
  """A global average pool scaled by a scalar tensor (ResNet-50's head reads one in its epilogue): the scalar doesn't
  vary along the channels, but a register tile has nothing to share in it. The data-reuse rule took it for reuse and
  upcast 16 x 8 x 4 = 512 channels (3.1x slower than the vector-wide tile left now, and 0.9 s of gcc)."""
  x, s = rng.standard_normal((1, 1024, 7, 7), dtype=np.float32), rng.standard_normal((1,), dtype=np.float32)
  with Context(CPU_ARCH=arch):
    t = Tensor(x).realize().mean(axis=(2, 3)) * Tensor(s).realize()
    (si,) = t.schedule()
    k = hand(si.ast)
    assert not any("data reuse" in r for r in k.applied_opts_reasons) and prod(k.full_shape[k.first_upcast:]) <= 16 * 4, opts(k)
    check_tensor(t, x.mean(axis=(2, 3)) * s, rtol=1e-4, atol=1e-6)

@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("hw", [7, 14])
def test_scalar_inputs_leave_a_conv_its_matmul_tile(arch, hw, rng):
  """A 1x1 conv with a ReLU6 whose bounds are 0-d tensors (an ONNX Clip's min and max inputs), loaded as scalars in the
  epilogue: the same opts as with constant bounds. A scalar varies along no axis, so it can't be the input broadcast
  along the rows; counted as one, it denied the tile and the general rules took the kernel (MobileNet-v2's 160 -> 960
  at 7^2 2.8-2.9x slower on AVX-512, caches flushed)."""
  x, w = rng.standard_normal((1, 96, hw, hw), dtype=np.float32), rng.standard_normal((576, 96, 1, 1), dtype=np.float32) * 0.1
  with Context(CPU_ARCH=arch):
    def kernel(lo, hi):
      t = Tensor(x).realize().conv2d(Tensor(w).realize()).clip(lo, hi)
      return t, hand([si for si in t.schedule() if si.ast.op.name == "KERNEL"][-1].ast)
    t, k = kernel(Tensor(np.float32(0.0)).realize(), Tensor(np.float32(0.5)).realize())
    assert sorted(b.idx for b in k.bufs if isinstance(b, MemBuffer)) == [0, 1, 2, 3, 4], "the bounds should be loads here"
    assert opts(k) == opts(kernel(0.0, 0.5)[1]), opts(k)
    assert not any("data reuse" in r for r in k.applied_opts_reasons), k.applied_opts_reasons
    check_tensor(t, np.clip(_conv_ref(x, w, 1, 0), 0.0, 0.5), rtol=1e-4, atol=1e-5)

@pytest.mark.parametrize("k,stride,size,ch", [(5, 1, 28, 24), (5, 2, 56, 16), (3, 1, 28, 16), (3, 1, 27, 8), (3, 2, 40, 8)])
def test_depthwise_rows_of_3_or_4_vectors_are_the_tile_on_16_registers(k, stride, size, ch, rng):
  """AVX2: a depthwise conv whose output rows (28, 27, 20 wide) are 3-4 vectors once padded: the row padded to whole 8-lane
  vectors and taken whole, and no output rows besides (EfficientNet-B0's 5x5 convs to 28^2 3.1-3.4x faster, MobileNet-v2's
  3x3 convs at 28^2 1.3-1.7x, than the 4 x 4 scalars of 4 lanes the general rules took where the row is a multiple of 4,
  and 1.2-1.6x than the row with 2-4 output rows where it wasn't)."""
  x, w = rng.standard_normal((1, ch, size, size), dtype=np.float32), rng.standard_normal((ch, 1, k, k), dtype=np.float32)
  with Context(CPU_ARCH="haswell"):
    t = Tensor(x).realize().conv2d(Tensor(w).realize(), stride=stride, padding=k // 2, groups=ch)
    kern = hand([si for si in t.schedule() if si.ast.op.name == "KERNEL"][-1].ast)
    o, out_w = opts(kern), (size + 2 * (k // 2) - k) // stride + 1
    assert o[:3] == [(D, 2, 8), (U, 2, 8), (U, 2, 0)] and not any(op is U and ax != 2 for op, ax, _ in o), (out_w, o)
    ref = np.stack([_conv_ref(x[:, c:c + 1], w[c:c + 1], stride, k // 2)[:, 0] for c in range(ch)], axis=1)
    check_tensor(t, ref, rtol=1e-4, atol=1e-4)
    # a conv of 2 input channels has as short a reduce, but each image load serves every output channel: the tile across
    # the channels stays (_shared_along_other_axes)
    full = Tensor(x[:, :2]).realize().conv2d(Tensor(w[:8, :, :, :].repeat(2, axis=1)).realize(), stride=stride, padding=k // 2)
    assert any(op is U and ax == 0 for op, ax, _ in opts(hand([si for si in full.schedule() if si.ast.op.name == "KERNEL"][-1].ast)))

@pytest.mark.parametrize("stride,size", [(1, 56), (2, 112), (1, 40)])
def test_depthwise_rows_of_a_multiple_of_8_take_half_width_vectors_on_32_registers(stride, size, rng):
  """AVX-512: a depthwise conv whose output rows are a multiple of 8 but not of 16 (56, 40 wide): 8-lane vectors, the row
  whole (5-7 of them) and no output rows besides, not the row padded to 16 lanes under 8 rows (MobileNet-v2's 3x3 convs
  at 56^2 and from 112^2 1.2-1.46x faster). A max-pool of the same rows keeps its 16-lane vectors (as fast either way)."""
  ch = 8
  x, w = rng.standard_normal((1, ch, size, size), dtype=np.float32), rng.standard_normal((ch, 1, 3, 3), dtype=np.float32)
  with Context(CPU_ARCH="skylake-avx512"):
    t = Tensor(x).realize().conv2d(Tensor(w).realize(), stride=stride, padding=1, groups=ch)
    o = opts(hand([si for si in t.schedule() if si.ast.op.name == "KERNEL"][-1].ast))
    assert [x for x in o if x[0] is not R] == [(U, 2, 8), (U, 2, 0)], o
    full = Tensor(x[:, :2]).realize().conv2d(Tensor(w[:, :, :, :].repeat(2, axis=1)).realize(), stride=stride, padding=1)  # (2 input channels)
    assert any(op is U and ax == 0 for op, ax, _ in opts(hand([si for si in full.schedule() if si.ast.op.name == "KERNEL"][-1].ast)))
    ref = np.stack([_conv_ref(x[:, c:c + 1], w[c:c + 1], stride, 1)[:, 0] for c in range(ch)], axis=1)
    check_tensor(t, ref, rtol=1e-4, atol=1e-4)
    out = (size - 1) // stride + 1
    pool = Tensor(rng.standard_normal((1, ch, 2 * out, 2 * out), dtype=np.float32)).realize().pad(((0, 0), (0, 0), (1, 1), (1, 1))).max_pool2d(3, 2)
    o = opts(hand([si for si in pool.schedule() if si.ast.op.name == "KERNEL"][-1].ast))
    assert (U, 2, 16) in o, o

@pytest.mark.parametrize("arch", list(ARCHS))
def test_a_short_reduce_keeps_its_tile_within_8_vectors(arch, rng):
  """A 3x3 stride-2 stem of 3 input channels (a reduce of 27: MobileNet-v2's, EfficientNet-B0's, ShuffleNet's): the reuse
  rules' third upcast would make 4 output rows of 16 lanes x 8 channels, 32 accumulators on AVX-512, spilled, with too
  few FMAs per step to carry them (1.9-2.6x slower in the models' calls). It stops at 8 vector accumulators: none on
  AVX-512, the row's second vector (8) on AVX2. A 3x3 conv of 64 channels (a reduce of 576) still takes its 4 rows."""
  vw = ARCHS[arch]
  x, w = rng.standard_normal((1, 3, 224, 224), dtype=np.float32), rng.standard_normal((32, 3, 3, 3), dtype=np.float32)
  with Context(CPU_ARCH=arch):
    t = Tensor(x).realize().conv2d(Tensor(w).realize(), stride=2, padding=1)
    k = hand([si for si in t.schedule() if si.ast.op.name == "KERNEL"][-1].ast)
    assert prod_upcast(k) <= 8 * vw and prod_upcast(k) >= 4 * vw, (opts(k), prod_upcast(k))
    _check_conv(t, x, w, 2, 1)
    k64 = hand(bench.conv3x3_ast(64, 64, 8, 16))
    assert prod_upcast(k64) > 8 * vw or vw == 8, opts(k64)

@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("stride,size", [(1, 112), (2, 112), (1, 64)])
def test_depthwise_rows_of_whole_vectors_take_up_to_7_of_them(arch, stride, size, rng):
  """A depthwise conv whose output rows are whole vectors (112, 56 or 64 wide): up to 7 vectors of the row are the tile,
  no output rows besides (MobileNet-v2's 3x3 at 112^2 and from 112^2 with stride 2: 1.27-1.7x in its call, both
  vector widths). Not a squeeze-and-excitation's small matvec with a bias (the weight moves along the output channels by
  a whole row: no image row)."""
  vw, ch = ARCHS[arch], 4
  x, w = rng.standard_normal((1, ch, size, size), dtype=np.float32), rng.standard_normal((ch, 1, 3, 3), dtype=np.float32)
  with Context(CPU_ARCH=arch):
    t = Tensor(x).realize().conv2d(Tensor(w).realize(), stride=stride, padding=1, groups=ch)
    o = [x_ for x_ in opts(hand([si for si in t.schedule() if si.ast.op.name == "KERNEL"][-1].ast)) if x_[0] is not R]
    out = (size - 1) // stride + 1
    lanes = vw if out % vw == 0 else vw // 2  # (56 on AVX-512: the half-width row, test above)
    vectors = out // lanes
    count = next(c for c in range(7 if lanes == vw else 8, 0, -1) if vectors % c == 0)
    assert o == [(U, 2, lanes), (U, 2, 0 if count == vectors else count)], o
    ref = np.stack([_conv_ref(x[:, c:c + 1], w[c:c + 1], stride, 1)[:, 0] for c in range(ch)], axis=1)
    check_tensor(t, ref, rtol=1e-4, atol=1e-4)
    s_, w2, b2 = rng.standard_normal((1, 28), dtype=np.float32), rng.standard_normal((672, 28), dtype=np.float32).T, rng.standard_normal(672, dtype=np.float32)
    se = Tensor(s_).realize() @ Tensor(np.ascontiguousarray(w2.T)).realize().T + Tensor(b2).realize()
    k = hand([si for si in se.schedule() if si.ast.op.name == "KERNEL"][-1].ast)
    assert not any("the whole tile" in r for r in k.applied_opts_reasons), opts(k)
    check_tensor(se, s_ @ w2 + b2, rtol=1e-4, atol=1e-4)

@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("k,stride,size", [(5, 1, 14), (5, 1, 7), (5, 2, 14), (3, 1, 7), (3, 1, 14), (3, 2, 28)])
def test_depthwise_rows_of_7_images_take_7_rows(arch, k, stride, size, rng):
  """A depthwise conv to a 7^2 or 14^2 image (EfficientNet-B0's, MobileNet-v2's, ShuffleNet's last stages): 7 output rows
  besides the row's vector (4 and 3 divide neither, and one row was one chain of 9-25 dependent FMAs), the taps unrolled
  (5x5 at 14^2 and 7^2 1.3-1.6x faster, 3x3 1.1-1.2x). Not a 3x3 whose 14-wide row is two vectors on 16 registers (14
  accumulators: 0.87x), nor a 2x2 max-pool's 4 taps."""
  vw, ch = ARCHS[arch], 8
  x, w = rng.standard_normal((1, ch, size, size), dtype=np.float32), rng.standard_normal((ch, 1, k, k), dtype=np.float32)
  with Context(CPU_ARCH=arch):
    t = Tensor(x).realize().conv2d(Tensor(w).realize(), stride=stride, padding=k // 2, groups=ch)
    o = opts(hand([si for si in t.schedule() if si.ast.op.name == "KERNEL"][-1].ast))
    out = (size + 2 * (k // 2) - k) // stride + 1
    two_vectors = out == 14 and vw == 8
    assert ((U, 1, 7) in o) == (not two_vectors or k == 5), o
    if (U, 1, 7) in o: assert o[-1] == (R, 1, 0), o  # (the taps of a row: the inner window axis unrolled)
    ref = np.stack([_conv_ref(x[:, c:c + 1], w[c:c + 1], stride, k // 2)[:, 0] for c in range(ch)], axis=1)
    check_tensor(t, ref, rtol=1e-4, atol=1e-4)
    pool = Tensor(rng.standard_normal((1, ch, 2 * out, 2 * out), dtype=np.float32)).realize().max_pool2d(2, 2)
    assert not any(op is U and amt == 7 for op, _, amt in opts(hand([si for si in pool.schedule() if si.ast.op.name == "KERNEL"][-1].ast)))

@pytest.mark.parametrize("arch", list(ARCHS))
def test_concatenation_kernels_are_vector_code(arch, rng):
  """A concatenation's kernel (Tensor.cat selects each piece with a bool constant masked to its range), with a
  BatchNorm-like scale and a relu on top, one piece transposed (DenseNet-121's dense blocks): full vectors along the
  contiguous output axis, gathers only for the transposed piece. The bool constant once made the whole kernel
  scalar code (and the heuristics took 4 lanes): DenseNet-121's 58 such kernels 1.57x faster, AVX-512 and AVX2."""
  vw = ARCHS[arch]
  a, b = rng.standard_normal((24, 64), dtype=np.float32), rng.standard_normal((64, 8), dtype=np.float32)
  with Context(CPU_ARCH=arch):
    t = (Tensor(a).realize().cat(Tensor(b).realize().T, axis=0) * 1.5 - 0.25).relu()
    (si,) = [si for si in t.schedule() if si.ast.op.name == "KERNEL"]
    k = hand(si.ast)
    assert (U, 1, vw) in opts(k), opts(k)
    src = k.to_program().src
    assert f"float{vw} " in src and "tc_where" in src, src
    check_tensor(t, np.maximum(np.concatenate([a, b.T]) * 1.5 - 0.25, 0), rtol=1e-5, atol=1e-6)

@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("cin,cout,hw,stride,residual", [(512, 128, 7, 1, False), (256, 64, 14, 1, True), (256, 64, 14, 2, False), (512, 64, 5, 1, False),
                                                          (64, 128, 7, 1, False), (160, 64, 14, 2, True), (160, 64, 14, 1, False), (32, 64, 7, 1, False)])
def test_laid_out_columns_tile(arch, cin, cout, hw, stride, residual, rng):
  """A 1x1 conv against a weight in panels of 64 output channels (frontend/pointwise_layout.py): with 32 registers,
  4 vectors of output channels x 7 pixels, loaded straight from the panels (vectors along the output's strided
  channels, stored lane by lane; a residual gathered lane by lane), nothing packed or padded. Not on 16 registers,
  and not where vectors of pixels wouldn't pad (25 pixels, a multiple of neither 7 nor 16: the usual tiles). A reduce
  of fewer than 256 takes it only where vectors would pad the pixels by more than 1/8 (49 -> 64, not 196 -> 208), and
  not below 64 (laid_out_min_reduce)."""
  from tilecraft.frontend.pointwise_layout import pointwise_conv, pointwise_layout
  vw = ARCHS[arch]
  x, w = rng.standard_normal((1, cin, hw, hw), dtype=np.float32), rng.standard_normal((cout, cin, 1, 1), dtype=np.float32)
  ref = _conv_ref(x, w, stride, 0)
  res = rng.standard_normal(ref.shape, dtype=np.float32) if residual else None
  with Context(CPU_ARCH=arch):
    t = pointwise_conv(Tensor(x).realize(), Tensor(pointwise_layout(w)).realize(), (stride, stride))
    if residual: t = (t + Tensor(res).realize()).relu()
    si = [s for s in t.schedule() if s.ast.op.name == "KERNEL"][-1]
    k = hand(si.ast)
    pixels = ((hw - 1) // stride + 1) ** 2
    tile = vw == 16 and pixels % 7 == 0 and cin >= (256 if pixels == 196 else 64)
    assert ([(op, amt) for op, _, amt in opts(k)] == [(U, 16), (U, 4), (U, 7)]) == tile, (k.applied_opts, k.applied_opts_reasons)
    if tile: assert "float16 acc" in k.to_program().src
    want = np.maximum(ref + res, 0) if residual else ref
    check_tensor(t, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    check_unoptimized(si, 1e-4, 1e-4 * float(np.abs(want).max()), k)
