"""Lowering unit-stride loads whose validity varies by lane (a padded conv's shifted rows) into
vector loads gated per lane, on targets with masked loads (C, LLVM), and lane by lane elsewhere;
likewise stores (a PADTO-padded output row's last vector).
The gate keeps the lane-free part of the mask (the row mask) as one scalar splat. Results vs numpy
on both CPU targets and ISAs, for every vector dtype and width, under random opts too (the
differential fuzzer, `tilecraft fuzz -k pad -k conv`, covers the opt space more widely)."""
import re
import numpy as np
import pytest
from tilecraft import Context, Tensor, dtypes
from tilecraft.codegen.kernel import Kernel, Opt, OptOps
from tilecraft.codegen.uops import UOps
from tilecraft.device import Device
from tilecraft.ops import BinaryOps
from tilecraft.renderer.cstyle import CRenderer, OpenCLRenderer
from tilecraft.renderer.llvmir import LLVMRenderer
from tilecraft.testing.fuzz import check_opts, entry_inputs, find_entry, prebuild
from op_checks import require_arch

def _conv_ast(cin=4, cout=8, hw=16):
  x, w = Tensor.rand(1, cin, hw, hw), Tensor.rand(cout, cin, 3, 3)
  return x.conv2d(w, padding=1).schedule()[-1].ast

def _masked_loads(uops):
  return [u for u in uops if u.op is UOps.LOAD and len(u.src) >= 4 and u.src[2].dtype.count > 1]

@pytest.mark.parametrize("ren", [CRenderer, LLVMRenderer], ids=["C", "LLVM"])
def test_padded_conv_rows_are_masked_vector_loads(ren) -> None:
  k = Kernel(_conv_ast(), opts=ren())
  for o in (Opt(OptOps.UPCAST, 2, 8), Opt(OptOps.UNROLL, 2, 0)): k.apply_opt(o)  # 8 columns as lanes, kx unrolled
  k.linearize()
  m = _masked_loads(k.uops)
  assert len(m) == 2 and all(u.dtype == dtypes.float32.vec(8) for u in m)  # kx = 0 and 2; kx = 1 is a plain vector load
  for u in m:
    gate = u.src[2]
    assert gate.dtype == dtypes.bool.vec(8)
    # the row mask (lane-free) is one scalar splat ANDed with the column mask, which tests one edge lane
    assert gate.op is UOps.ALU and gate.arg is BinaryOps.AND
    lanes, splat = sorted(gate.src, key=lambda s: all(x is s.src[0] for x in s.src))
    assert splat.op is UOps.VECTORIZE and len(set(splat.src)) == 1
    assert sum(s.op is not UOps.CONST for s in lanes.src) == 1
  assert not any(u.op is UOps.LOAD and u.dtype.count == 1 and u.src[0] is m[0].src[0] for u in k.uops)  # no lane-by-lane reads

def test_no_masked_loads_where_the_target_has_none() -> None:
  k = Kernel(_conv_ast(), opts=OpenCLRenderer())
  k.apply_opt(Opt(OptOps.UPCAST, 2, 4))
  k.linearize()
  assert not _masked_loads(k.uops) and any(u.op is UOps.LOAD and u.dtype == dtypes.float32 and len(u.src) >= 4 for u in k.uops)

def test_masked_load_rendering() -> None:
  k = Kernel(_conv_ast(), opts=CRenderer())
  for o in (Opt(OptOps.UPCAST, 2, 8), Opt(OptOps.UNROLL, 2, 0)): k.apply_opt(o)
  k.linearize()
  src = k.to_program().src
  # the row mask is a branch around the load (alu?tc_mload(...):0); the lanes' mask is the column mask alone
  assert len(re.findall(r"\(\w+\?tc_mload_float8\(\(data1\+\w+\)\+-?\d+, vec\d+\):vec\d+\)", src)) == 2
  assert src.count("tc_mload_float8((data1+") == 2 and "static inline float8 tc_mload_float8(const float* p, int8 m)" in src

@pytest.mark.parametrize("arch", ["skylake-avx512", "haswell"])
def test_masked_load_rendering_llvm(arch) -> None:
  """AVX-512 targets get llvm.masked.load; AVX2 ones the vmaskmov intrinsic (LLVM miscompiles the
  generic one there: see LLVMRenderer.avx_masked). Rendered only: nothing runs for an ISA the host may lack."""
  with Context(CPU_ARCH=arch):
    k = Kernel(_conv_ast(), opts=LLVMRenderer())
    for o in (Opt(OptOps.UPCAST, 2, 8), Opt(OptOps.UNROLL, 2, 0)): k.apply_opt(o)
    k.linearize()
    src = k.to_program().src
  call = r"@llvm\.masked\.load\.v8f32\.p0\(ptr (%\w+)," if arch == "skylake-avx512" else r"@llvm\.x86\.avx\.maskload\.ps\.256\(ptr (%\w+),"
  assert "llvm.masked.load" not in src if arch == "haswell" else "llvm.x86.avx" not in src
  # the address of a masked load isn't `inbounds`: its first lanes may lie before the buffer (poison otherwise)
  ptrs = re.findall(call, src)
  assert len(ptrs) == 2 and all(re.search(rf"{p} = getelementptr float,", src) for p in ptrs)

def _np_conv(x, w, pad):
  n, c, H, W = x.shape
  xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
  Ho, Wo = H + 2 * pad - w.shape[2] + 1, W + 2 * pad - w.shape[3] + 1
  out = np.zeros((n, w.shape[0], Ho, Wo))
  for ky in range(w.shape[2]):
    for kx in range(w.shape[3]): out += np.einsum("nchw,oc->nohw", xp[:, :, ky:ky + Ho, kx:kx + Wo], w[:, :, ky, kx])
  return out

# both CPU devices build for CPU_ARCH; haswell on LLVM pins the AVX2 masked-load path (LLVM 22 gave
# int64/float64 rows with UPCAST 8 wrong there: see LLVMRenderer.avx_masked)
ARCH_DEVS = [("native", "CPU"), ("haswell", "CPU"), ("native", "LLVM"), ("haswell", "LLVM")]

@pytest.mark.parametrize("arch,dev", ARCH_DEVS)
@pytest.mark.parametrize("shape,cout,pad", [((1, 3, 9, 9), 4, 1), ((2, 5, 7, 23), 6, 1), ((1, 2, 16, 16), 8, 2), ((1, 64, 56, 56), 64, 1)])
def test_padded_conv_vs_numpy(arch, dev, shape, cout, pad) -> None:
  require_arch(arch)
  rng = np.random.default_rng(0)
  x, w = rng.standard_normal(shape).astype(np.float32), rng.standard_normal((cout, shape[1], 3, 3)).astype(np.float32)
  with Context(CPU_ARCH=arch): got = Tensor(x, device=dev).conv2d(Tensor(w, device=dev), padding=pad).numpy()
  np.testing.assert_allclose(got, _np_conv(x, w, pad), rtol=1e-4, atol=1e-4 * shape[1] * 9)

@pytest.mark.parametrize("arch,dev", ARCH_DEVS)
@pytest.mark.parametrize("width", [2, 4, 8, 16])
def test_padded_rows_every_dtype_and_width(arch, dev, width) -> None:
  """float32, int32, int64 and float64 rows padded by 3 before and 4 after, read with `width` lanes:
  the first vector of the first row starts before its buffer and the last one of the last row ends
  after it (guard zones on both sides), vs the unoptimized kernel and numpy."""
  require_arch(arch)
  e = find_entry("pad_dtypes_3x25")
  opts = [Opt(OptOps.UPCAST, 1, width)]
  k = Kernel(e.ast, opts=Device[dev].renderer)
  k.apply_opt(opts[0])
  k.linearize()
  assert {u.dtype.scalar() for u in _masked_loads(k.uops)} == {dtypes.float32, dtypes.int32, dtypes.int64, dtypes.float64}
  with Context(CPU_ARCH=arch): assert check_opts(e, opts, entry_inputs(e), dev) is None

@pytest.mark.parametrize("opts", [[Opt(OptOps.UPCAST, 0, 8)], [Opt(OptOps.UPCAST, 0, 4)], [Opt(OptOps.UPCAST, 0, 16)], [Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UPCAST, 0, 2)]])
def test_lane_mask_through_a_mod(opts) -> None:
  """A mask that repeats every 8 elements: some lanes valid, some not, in the middle of a vector."""
  e = find_entry("pad_lane_pattern_4x6")
  for dev in ("CPU", "LLVM"): assert check_opts(e, opts, entry_inputs(e), dev) is None

# ---- masked stores ---------------------------------------------------------------------------------

def _masked_stores(uops):
  return [u for u in uops if u.op is UOps.STORE and len(u.src) > 3 and u.src[3].dtype.count > 1]

@pytest.mark.parametrize("ren,arch", [(CRenderer, "native"), (LLVMRenderer, "skylake-avx512"), (LLVMRenderer, "haswell")], ids=["C", "LLVM-avx512", "LLVM-avx2"])
def test_padded_output_row_is_one_masked_vector_store(ren, arch) -> None:
  """25 outputs padded to 32 and upcast by 16: the second vector's lanes 9..15 are past the end."""
  with Context(CPU_ARCH=arch):
    k = Kernel(find_entry("ew_25").ast, opts=ren())
    for o in (Opt(OptOps.PADTO, 0, 16), Opt(OptOps.UPCAST, 0, 16)): k.apply_opt(o)
    k.linearize()
    src = k.to_program().src
  m = _masked_stores(k.uops)
  assert len(m) == 1 and m[0].src[2].dtype == dtypes.float32.vec(16) and m[0].src[3].dtype == dtypes.bool.vec(16)
  assert not any(u.op is UOps.STORE and u.src[2].dtype.count == 1 for u in k.uops)  # no lane-by-lane writes
  if ren is CRenderer: assert src.count("tc_mstore_float16(data0+") == 1 and "static inline void tc_mstore_float16(float* p, int16 m, float16 v)" in src
  elif arch == "skylake-avx512":
    assert src.count("call void @llvm.masked.store.v16f32.p0(") == 1
    p = re.search(r"@llvm\.masked\.store\.v16f32\.p0\(<16 x float> %\w+, ptr (%\w+),", src).group(1)
    assert re.search(rf"{p} = getelementptr float,", src)  # (not inbounds: the last lanes lie past the end)
  else:  # two 8-lane vmaskmov stores from one base address that is not inbounds
    assert src.count("call void @llvm.x86.avx.maskstore.ps.256(") == 2 and "llvm.masked.store" not in src
    p = re.search(r"%\w+ = getelementptr float, ptr (%\w+), i32 8\n", src).group(1)
    assert re.search(rf"{p} = getelementptr float,", src)

def test_no_masked_stores_where_the_target_has_none() -> None:
  k = Kernel(find_entry("ew_25").ast, opts=OpenCLRenderer())
  for o in (Opt(OptOps.PADTO, 0, 4), Opt(OptOps.UPCAST, 0, 4)): k.apply_opt(o)
  k.linearize()
  assert not _masked_stores(k.uops) and any(u.op is UOps.STORE and len(u.src) > 3 and u.src[2].dtype.count == 1 for u in k.uops)

@pytest.mark.parametrize("arch,dev", ARCH_DEVS)
@pytest.mark.parametrize("name", ["ew_25", "ew_broadcast_7x25", "unary_double", "sum_int32_6x17", "sum_axis0_5x7x9"])
def test_padded_outputs_every_width(arch, dev, name) -> None:
  """An output axis padded to each vector width it isn't a multiple of: the same as the unoptimized
  kernel (guard zones on both sides of each output: a masked-off lane written would show)."""
  require_arch(arch)
  e = find_entry(name)
  k0 = Kernel(e.ast, opts=Device[dev].renderer)
  ax = k0.first_reduce - 1
  n = 0
  widths = [w for w in (2, 4, 8, 16) if k0.full_shape[ax] % w]
  with Context(CPU_ARCH=arch): prebuild([(e.ast, [])] + [(e.ast, [Opt(OptOps.PADTO, ax, w), Opt(OptOps.UPCAST, ax, w)]) for w in widths], dev)
  for w in widths:
    opts = [Opt(OptOps.PADTO, ax, w), Opt(OptOps.UPCAST, ax, w)]
    k = Kernel(e.ast, opts=Device[dev].renderer)
    for o in opts: k.apply_opt(o)
    k.linearize()
    n += len(_masked_stores(k.uops))
    with Context(CPU_ARCH=arch): assert check_opts(e, opts, entry_inputs(e), dev) is None, (name, w)
  assert n > 0
