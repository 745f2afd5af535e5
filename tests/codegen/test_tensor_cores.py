"""Tensor cores: the vendor layouts against the vendors' own formulas, the TC opt's refusals (each
leaving the kernel unchanged), and TC kernels against numpy: use 2 (plain MUL/SUM in the TC
layout) on CPU and OPENCL, use 3 (the instruction emulated through local memory in the vendor's
register layout) on OPENCL and on CPU (one thread holds the warp, staging through a stack array). use 1 (the real instruction) runs on the PYTHON emulator
(tests/runtime) and compiles for CUDA/HIP (tests/renderer)."""
import copy
import numpy as np
import pytest
from tilecraft import Tensor
from tilecraft.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tilecraft.codegen.tensor_cores import tc_choices
from tilecraft.dtype import dtypes
from tilecraft.testing.fuzz import run_program
from tilecraft.ops import BinaryOps, BufferOps, LazyOp, MemBuffer, MetaOps, ReduceOps, UnaryOps
from tilecraft.renderer.cstyle import CRenderer, OpenCLRenderer
from tilecraft.shape.shapetracker import ShapeTracker
from tilecraft.renderer.tensor_cores import (TENSOR_CORES, Fragment, TensorCoreLayout, check_layout, fragments_to_tiles, tiles_to_fragment,
                                             wmma_warps)

ALL_TCS = [(v, tc) for v, tcs in TENSOR_CORES.items() for tc in tcs]

# ---- the layouts, against the formulas in the vendors' documentation -------------------------------

def _ptx_doc(lane: int, i: int, operand: str) -> tuple[int, int]:
  """PTX ISA, mma.m16n8k16 .f16/.bf16 fragments: (row, col) of element i of PTX's operand held by `lane`."""
  group, tig = lane >> 2, lane % 4
  if operand == "a": return group + (8 if i in (2, 3, 6, 7) else 0), tig * 2 + (i & 1) + (8 if i >= 4 else 0)
  if operand == "b": return tig * 2 + (i & 1) + (8 if i >= 2 else 0), group
  return group + (8 if i >= 2 else 0), tig * 2 + (i & 1)

def _cuda_doc(lane: int, i: int, operand: str) -> tuple[int, int]:
  """dims (8,16,16): our C^T = B^T A^T is PTX's D = A B, so our A is PTX's B transposed, and so on."""
  row, col = _ptx_doc(lane, i, {"a": "b", "b": "a", "c": "c"}[operand])
  return col, row

def _amd_doc(lane: int, i: int, operand: str) -> tuple[int, int]:
  """RDNA3 WMMA wave32: A row lane%16 / B column lane%16, element i = K index i; D[2i + lane//16][lane%16]."""
  if operand == "a": return lane % 16, i
  if operand == "b": return i, lane % 16
  return 2 * i + lane // 16, lane % 16

def _metal_doc(lane: int, i: int, operand: str) -> tuple[int, int]:
  q = lane // 4
  return (q & 4) + (lane // 2) % 4, (q & 2) * 2 + (lane % 2) * 2 + i

DOCS = {"CUDA": _cuda_doc, "AMD": _amd_doc, "METAL": _metal_doc}

@pytest.mark.parametrize("vendor,tc", ALL_TCS, ids=[str(tc) for _, tc in ALL_TCS])
def test_layout_matches_vendor_docs(vendor, tc):
  for operand, frag, dims in (("a", tc.layout.a, "nk"), ("b", tc.layout.b, "km"), ("c", tc.layout.c, "nm")):
    for lane in range(tc.threads):
      for i in range(frag.n_regs):
        co = frag.coord(lane, i)
        assert (co[dims[0]], co[dims[1]]) == DOCS[vendor](lane, i, operand), (operand, lane, i)
        assert frag.slot(co) == (lane if None not in frag.lanes else lane % (1 << frag.lanes.index(None)), i)

@pytest.mark.parametrize("vendor,tc", ALL_TCS, ids=[str(tc) for _, tc in ALL_TCS])
def test_wmma_warps_is_a_matmul(vendor, tc, rng):
  n, m, k = tc.dims
  dt = np.float32 if tc.dtype_in == dtypes.bfloat16 else tc.dtype_in.np
  A, B = rng.uniform(-1, 1, (3, n, k)).astype(dt), rng.uniform(-1, 1, (3, k, m)).astype(dt)
  C = rng.uniform(-1, 1, (3, n, m)).astype(np.float32 if tc.dtype_out == dtypes.float32 else tc.dtype_out.np)
  fa, fb, fc = (tiles_to_fragment(f, x, tc.threads, d) for f, x, d in ((tc.layout.a, A, "nk"), (tc.layout.b, B, "km"), (tc.layout.c, C, "nm")))
  d = wmma_warps(tc, fa, fb, fc)
  got = fragments_to_tiles(tc, fa, fb, d)[2].astype(np.float64)
  np.testing.assert_allclose(got, A.astype(np.float64) @ B.astype(np.float64) + C, rtol=2e-3, atol=2e-3)
  if None in tc.layout.a.lanes:  # replicated lanes that disagree are a layout error, not a value
    fa[:, 16, 0] += 1
    with pytest.raises(ValueError, match="replicated"): wmma_warps(tc, fa, fb, fc)

def test_check_layout_rejects_bad_layouts():
  ok = TENSOR_CORES["METAL"][0].layout
  with pytest.raises(ValueError, match="cover"): check_layout((8, 8, 8), 32, TensorCoreLayout("METAL", ok.a, ok.b, Fragment(ok.c.lanes, ("n0",))))
  with pytest.raises(ValueError, match="cover"): check_layout((8, 8, 8), 64, ok)

# ---- kernels ----------------------------------------------------------------------------------------

def fake(base, vendor):
  """A renderer with a vendor's tensor cores (for use 2/3 on devices that have none)."""
  return type(f"{base.__name__}With{vendor}TC", (base,), {"tensor_cores": TENSOR_CORES[vendor]})()

def _ast(fn, *arrays):
  ts = [Tensor(a) for a in arrays]
  si = fn(*ts).schedule()[-1]
  inputs = {i: b.numpy().reshape(-1) for i, b in enumerate(si.bufs) if i >= len(si.ast.src) and b.is_allocated()}
  return si.ast, inputs

def matmul_case(rng, M, N, K, dt=np.float16, batch=None):
  sa, sb = ((batch,) if batch else ()) + (M, K), ((batch,) if batch else ()) + (K, N)
  a, b = rng.uniform(-1, 1, sa).astype(dt), rng.uniform(-1, 1, sb).astype(dt)
  ast, inputs = _ast(lambda x, y: x @ y, a, b)
  return ast, inputs, a.astype(np.float64) @ b.astype(np.float64)

def cast_case(rng, M=32, N=32, K=32, to=dtypes.float32):
  """`to` out[m, n] = sum_k to(a[m, k]) * to(b[k, n]) for half a, b: CAST(LOAD) operands."""
  a, b = rng.uniform(-1, 1, (M, K)).astype(np.float16), rng.uniform(-1, 1, (K, N)).astype(np.float16)
  sa = ShapeTracker.from_shape((M, K)).reshape((M, 1, K)).expand((M, N, K))
  sb = ShapeTracker.from_shape((K, N)).permute((1, 0)).reshape((1, N, K)).expand((M, N, K))
  ld = lambda i, st: LazyOp(UnaryOps.CAST, (LazyOp(BufferOps.LOAD, (), MemBuffer(i, dtypes.float16, st)),), to)  # noqa: E731
  red = LazyOp(ReduceOps.SUM, (LazyOp(BinaryOps.MUL, (ld(1, sa), ld(2, sb))),), (2,))
  ast = LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (red,), MemBuffer(0, to, ShapeTracker.from_shape((M, N, 1)))),))
  return ast, {1: a.reshape(-1), 2: b.reshape(-1)}, a.astype(np.float64) @ b.astype(np.float64)

def conv_case(rng, dt=np.float16, cin=16):
  x, w = rng.uniform(-1, 1, (2, cin, 18, 18)).astype(dt), rng.uniform(-1, 1, (16, cin, 3, 3)).astype(dt)
  ast, inputs = _ast(lambda a, b: a.conv2d(b), x, w)
  xd, wd = x.astype(np.float64), w.astype(np.float64)
  win = np.lib.stride_tricks.sliding_window_view(xd, (3, 3), axis=(2, 3))  # n c oh ow kh kw
  return ast, inputs, np.einsum("ncijkl,ockl->noij", win, wd)

def run_tc(ast, inputs, ren, device, use, axis, tc_opt, extra=()):
  k = Kernel(ast, opts=ren)
  k.apply_tensor_cores(use, extra_opts=list(extra), axis=axis, tc_opt=tc_opt)
  p = k.to_program()
  p.device = device
  return k, run_program(ast, p, inputs, device)[0]

def _tol(ast):
  return dict(rtol=2e-2, atol=3e-2) if ast.src[0].arg.dtype == dtypes.float16 else dict(rtol=1e-4, atol=1e-4)

def accepted_axes(ast, ren, tc_opt):
  n = len(tc_choices(Kernel(ast, opts=ren), tc_opt)[3])
  return [ax for ax in range(n) if Kernel(ast, opts=ren).apply_tensor_cores(2, axis=ax, tc_opt=tc_opt)]

VENDOR_DT = {"CUDA": np.float16, "AMD": np.float16, "METAL": np.float32}

@pytest.mark.parametrize("vendor", ["CUDA", "AMD", "METAL"])
def test_use2_cpu_every_axis(vendor, rng):
  """use 2 on CPU (no workgroups: the lanes are loops): matmul, padded non-multiples, conv and CAST operands."""
  ren = fake(CRenderer, vendor)
  dt = VENDOR_DT[vendor]
  for (ast, inputs, want), tc_opt in [(matmul_case(rng, 64, 64, 64, dt), 0), (matmul_case(rng, 61, 67, 45, dt), 2),
                                      (conv_case(rng, dt), 1), (cast_case(rng), 1)]:
    axes = accepted_axes(ast, ren, tc_opt)
    assert axes, "no TC axis accepted"
    for ax in axes:
      k, got = run_tc(ast, inputs, ren, "CPU", 2, ax, tc_opt)
      np.testing.assert_allclose(got.astype(np.float64).reshape(want.shape), want, **_tol(ast), err_msg=f"axis {ax} {k.colored_shape()}")

@pytest.mark.parametrize("vendor,every_axis", [pytest.param("CUDA", False, marks=pytest.mark.slow), pytest.param("AMD", False, marks=pytest.mark.slow),
                                               ("METAL", False), pytest.param("METAL", True, marks=pytest.mark.slow)])
def test_use3_cpu_one_thread_holds_the_warp(vendor, every_axis, rng):
  """use 3 on CPU (no threads): the lane axes are expanded lanes, so one thread holds the whole warp,
  stages every lane's fragments through a stack array (private to each OpenMP thread) and reads back
  what each lane's C registers need from where the vendor layout puts it. Metal on every case (every
  accepted axis of the plain matmul; of the others, the first by default and all in the slow tier);
  CUDA and AMD (a 2048 / 4096 multiply-add step, 15-30 s of C compile: slow tier; their layouts'
  use 3 runs by default through local memory on OPENCL and on the emulator) on one parallel matmul."""
  ren = fake(CRenderer, vendor)
  dt = VENDOR_DT[vendor]
  todo = [(matmul_case(rng, 32, 32, 32, dt), 0, [])]
  if vendor == "METAL":  # extra opts: a second C tile in registers (UPCAST) and two K tiles per step (UNROLL)
    todo += [(matmul_case(rng, 32, 32, 32, dt), 0, [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UNROLL, 0, 2)]), (matmul_case(rng, 61, 67, 45, dt), 2, []),
             (conv_case(rng, dt), 1, []), (cast_case(rng), 1, [])]
  for i, ((ast, inputs, want), tc_opt, extra) in enumerate(todo):
    axes = accepted_axes(ast, ren, tc_opt)
    for ax in axes if vendor == "METAL" and (i == 0 or every_axis) and not extra else axes[:1]:
      k, got = run_tc(ast, inputs, ren, "CPU", 3, ax, tc_opt, extra)
      src = k.to_program().src
      assert "#pragma omp" not in src or "private(tc" in src, "a stack array shared by OpenMP threads"
      np.testing.assert_allclose(got.astype(np.float64).reshape(want.shape), want, **_tol(ast), err_msg=f"axis {ax} {k.colored_shape()}")

@pytest.mark.slow
@pytest.mark.fuzz
def test_fuzz_tc_cpu_use2_use3():
  """The TC fuzzer on CPU (use 2 and 3; use 1 is refused there): random TC-first opt sequences vs numpy.
  Slow: every use-3 kernel is a big basic block for the C compiler."""
  from tilecraft.testing.tc_cases import fuzz_tc
  n, fails = fuzz_tc(fake(CRenderer, "METAL"), "CPU", 30, seed=1)
  assert n == 30 and not fails, "\n".join(fails[:5])

@pytest.mark.opencl
@pytest.mark.parametrize("vendor,case", [("AMD", "61x67x45"), ("CUDA", "conv")])
def test_use2_opencl(vendor, case, rng):
  """use 2 on OPENCL (the lanes are real work-items): padded non-multiples (tc_opt 2), a conv with
  several reduce axes (tc_opt 1), on the last accepted axis."""
  ren = fake(OpenCLRenderer, vendor)
  (ast, inputs, want), tc_opt = (matmul_case(rng, 61, 67, 45), 2) if case == "61x67x45" else (conv_case(rng), 1)
  k, got = run_tc(ast, inputs, ren, "OPENCL", 2, accepted_axes(ast, ren, tc_opt)[-1], tc_opt)
  assert k.local_dims == 5
  np.testing.assert_allclose(got.astype(np.float64).reshape(want.shape), want, **_tol(ast), err_msg=k.colored_shape())

@pytest.mark.opencl
@pytest.mark.parametrize("vendor,extra", [("METAL", [Opt(OptOps.LOCAL, 0, 2), Opt(OptOps.UPCAST, 1, 2)]), ("CUDA", [])])
def test_use3_opencl_through_local_memory(vendor, extra, rng):
  """use 3 on OPENCL (PoCL: real workgroups, local memory and barriers), Metal with a second warp and an
  extra register tile. (PoCL compiles these slowly: the PYTHON emulator carries the wide coverage.)"""
  ren = fake(OpenCLRenderer, vendor)
  ast, inputs, want = matmul_case(rng, 32, 32, 32, VENDOR_DT[vendor])
  k, got = run_tc(ast, inputs, ren, "OPENCL", 3, 0, 0, extra)
  np.testing.assert_allclose(got.astype(np.float64).reshape(want.shape), want, **_tol(ast), err_msg=k.colored_shape())

@pytest.mark.parametrize("device", ["CPU", pytest.param("OPENCL", marks=pytest.mark.opencl)])
def test_use3_catches_a_wrong_operand_layout(device, rng, monkeypatch):
  """use 3 reads A and B back where the vendor layout says they are: a kernel that gathers A's fragment
  in another layout (two of A's lane bits swapped) gives wrong results there, while use 2 doesn't notice."""
  import tilecraft.codegen.tensor_cores as tcm
  ast, inputs, want = matmul_case(rng, 32, 32, 32, np.float32)
  ren = fake(OpenCLRenderer if device == "OPENCL" else CRenderer, "METAL")
  good = tcm._operand_view
  def swapped(k, frag, other):
    perm, regs = good(k, frag, other)
    if other == "m":
      lanes = k.tc_axes()[0]
      perm[lanes[-1]], perm[lanes[-2]] = perm[lanes[-2]], perm[lanes[-1]]
    return perm, regs
  monkeypatch.setattr(tcm, "_operand_view", swapped)
  _, got = run_tc(ast, inputs, ren, device, 2, 0, 0)
  np.testing.assert_allclose(got.astype(np.float64).reshape(want.shape), want, **_tol(ast))
  _, got = run_tc(ast, inputs, ren, device, 3, 0, 0)
  assert not np.allclose(got.astype(np.float64).reshape(want.shape), want, **_tol(ast))

# ---- refusals: apply_opt raises KernelOptError, apply_tensor_cores returns False; kernel unchanged ----

def _state(k):
  return (k.sts, k.local_dims, k.upcasted, k.group_for_reduces, k.dont_use_locals, k.tensor_core, k.use_tensor_cores, k.applied_opts)

def refuse(k, fn, match):
  before = copy.deepcopy(_state(k))
  with pytest.raises(KernelOptError, match=match): fn(k)
  assert _state(k) == before

def declines(k, match, use=1, axis=0, tc_opt=0, extra=None):
  """apply_tensor_cores answers False (as the reference does) and leaves k unchanged; apply_opt of the
  same TC opt (or, with `extra`, of the refused extra opt after it) raises KernelOptError matching `match`."""
  from tilecraft.helpers import Context
  before = copy.deepcopy(_state(k))
  assert k.apply_tensor_cores(use, extra_opts=extra, axis=axis, tc_opt=tc_opt) is False
  assert _state(k) == before
  with Context(TC=use):
    if extra is None: refuse(k, lambda k: k.apply_opt(Opt(OptOps.TC, axis, tc_opt)), match)
    else:
      kc = k.copy()
      kc.apply_opt(Opt(OptOps.TC, axis, tc_opt))
      for o in extra[:-1]: kc.apply_opt(o)
      refuse(kc, lambda k: k.apply_opt(extra[-1]), match)

def _mm(rng, M=32, N=32, K=32, dt=np.float16): return matmul_case(rng, M, N, K, dt)[0]

def test_refuse_no_tensor_cores(rng):
  refuse(Kernel(_mm(rng), opts=OpenCLRenderer()), lambda k: k.apply_opt(Opt(OptOps.TC, 0, 0)), "has no tensor cores")
  declines(Kernel(_mm(rng), opts=CRenderer()), "has no tensor cores")

def test_refuse_not_mul_of_loads(rng):
  ren = fake(OpenCLRenderer, "CUDA")
  a = rng.uniform(-1, 1, (32, 32)).astype(np.float16)
  declines(Kernel(_ast(lambda x: x.sum(-1), a)[0], opts=ren), r"must be SUM\(MUL")
  declines(Kernel(_ast(lambda x: (x.reshape(32, 1, 32) + x.T.reshape(1, 32, 32)).sum(-1), a)[0], opts=ren), r"must be SUM\(MUL")
  mm = cast_case(rng)[0]  # STORE(SUM(MUL(CAST(LOAD), CAST(LOAD))))
  mul = mm.src[0].src[0].src[0]
  exp_op = LazyOp(mm.op, (LazyOp(mm.src[0].op, (LazyOp(ReduceOps.SUM, (LazyOp(BinaryOps.MUL, (LazyOp(UnaryOps.EXP2, (mul.src[0],)), mul.src[1])),), (2,)),),
                                 mm.src[0].arg),))
  declines(Kernel(exp_op, opts=ren), "LOAD", tc_opt=1)
  declines(Kernel(_ast(lambda x: x.max(-1), a)[0], opts=ren), "SUM")
  # CAST(LOAD) operands need tc_opt 1, except half/bfloat16 widened to float32 (the frontend's matmul: DESIGN 12)
  declines(Kernel(cast_case(rng, to=dtypes.float64)[0], opts=ren), "tc_opt 1", use=2)
  assert Kernel(cast_case(rng)[0], opts=ren).apply_tensor_cores(2, tc_opt=0)

def test_refuse_dtypes_without_a_core(rng):
  declines(Kernel(_mm(rng, dt=np.float32), opts=fake(OpenCLRenderer, "CUDA")), "no tensor core on .* takes dtypes.float")
  declines(Kernel(_mm(rng, dt=np.int32), opts=fake(OpenCLRenderer, "METAL")), r"no tensor core|must be SUM\(MUL|LOAD", tc_opt=2)

def test_refuse_non_multiples_without_tc_opt_2(rng):
  ren = fake(OpenCLRenderer, "CUDA")
  for tc_opt in (0, 1): declines(Kernel(_mm(rng, 61, 67, 45), opts=ren), "not a multiple", tc_opt=tc_opt)
  declines(Kernel(_mm(rng, 16, 8, 3), opts=ren), "4x the work or more", tc_opt=2)
  assert Kernel(_mm(rng, 61, 67, 45), opts=ren).apply_tensor_cores(1, tc_opt=2)

def test_refuse_several_reduce_axes_without_tc_opt_1(rng):
  declines(Kernel(conv_case(rng)[0], opts=fake(OpenCLRenderer, "CUDA")), "reduce axes need tc_opt")

def test_refuse_tc_not_first_and_bad_axis(rng):
  ren = fake(OpenCLRenderer, "CUDA")
  k = Kernel(_mm(rng), opts=ren)
  k.apply_opt(Opt(OptOps.UPCAST, 0, 2))
  refuse(k, lambda k: k.apply_opt(Opt(OptOps.TC, 0, 0)), "TC must be the first opt")
  refuse(Kernel(_mm(rng), opts=ren), lambda k: k.apply_opt(Opt(OptOps.TC, 5, 0)), "not one of the 1")
  refuse(Kernel(_mm(rng), opts=ren), lambda k: k.apply_opt(Opt(OptOps.TC, 0, 3)), "tc_opt must be")
  declines(Kernel(_mm(rng), opts=CRenderer()), "no tensor cores")
  declines(Kernel(_mm(rng), opts=fake(CRenderer, "CUDA")), "needs a target with workgroups")
  from tilecraft.renderer.llvmir import LLVMRenderer  # no workgroups and no stack arrays: use 3 has nowhere to stage
  declines(Kernel(_mm(rng), opts=fake(LLVMRenderer, "CUDA")), "use 3 needs local memory", use=3)
  class NoShared(OpenCLRenderer): has_shared, tensor_cores = False, TENSOR_CORES["CUDA"]
  declines(Kernel(_mm(rng), opts=NoShared()), "use 3 needs local memory", use=3)
  # a refused extra opt undoes the TC opt too
  declines(Kernel(_mm(rng), opts=ren), "does not divide", extra=[Opt(OptOps.UPCAST, 0, 7)])
  # TC after another opt: False too (the reference's apply_opt refuses it)
  k = Kernel(_mm(rng), opts=ren)
  k.apply_opt(Opt(OptOps.UPCAST, 0, 2))
  declines(k, "TC must be the first opt")
  # the axis numbers the choices: one past the last is declined, not an error
  declines(Kernel(_mm(rng), opts=ren), "not one of the 1", axis=1)

def test_apply_tensor_cores_raises_only_for_invalid_arguments(rng):
  """Invalid arguments are the caller's bug: ValueError, naming the argument (kernel unchanged)."""
  k = Kernel(_mm(rng), opts=fake(OpenCLRenderer, "CUDA"))
  before = copy.deepcopy(_state(k))
  for kw, name in (({"use_tensor_cores": 4}, "use_tensor_cores"), ({"use_tensor_cores": True}, "use_tensor_cores"), ({"tc_opt": 3}, "tc_opt"),
                   ({"axis": -1}, "axis"), ({"axis": 0.0}, "axis"), ({"extra_opts": [("UPCAST", 0, 2)]}, "extra_opts")):
    with pytest.raises(ValueError, match=name): k.apply_tensor_cores(**kw)
    assert _state(k) == before
  # on a target without tensor cores too (the arguments are checked first)
  with pytest.raises(ValueError, match="tc_opt"): Kernel(_mm(rng), opts=CRenderer()).apply_tensor_cores(1, tc_opt=-1)
  assert k.apply_tensor_cores(1) is True

def test_refuse_later_opts_on_tc_axes(rng):
  ren = fake(OpenCLRenderer, "CUDA")
  k = Kernel(_mm(rng, 64, 64, 64), opts=ren)
  k.apply_tensor_cores(1)
  lanes = list(range(k.first_reduce - 5, k.first_reduce))
  for ax in lanes:
    refuse(k, lambda k: k.apply_opt(Opt(OptOps.UPCAST, ax, 2)), "tensor-core")
    refuse(k, lambda k: k.apply_opt(Opt(OptOps.LOCAL, ax, 2)), "not a global axis|tensor-core")
    refuse(k, lambda k: k.apply_opt(Opt(OptOps.PADTO, ax, 4)), "tensor-core")
  for ax in range(k.first_upcast, k.shape_len):
    refuse(k, lambda k: k.apply_opt(Opt(OptOps.UPCAST, ax, 2)), "tensor-core|reduce axis")
    refuse(k, lambda k: k.apply_opt(Opt(OptOps.UNROLL, ax - k.first_reduce, 2)), "upcast")
  refuse(k, lambda k: k.apply_opt(Opt(OptOps.GROUP, 0, 2)), "tensor cores")
  refuse(k, lambda k: k.apply_opt(Opt(OptOps.NOLOCALS)), "locals")
  # a LOCAL of another axis goes outside the lanes: they stay the innermost local axes
  k.apply_opt(Opt(OptOps.LOCAL, 0, 2))
  assert k.full_shape[k.first_reduce - 5:k.first_reduce] == (2,) * 5 and k.local_dims == 6

def test_tc_setting_zero_is_off(rng):
  k = Kernel(_mm(rng), opts=fake(OpenCLRenderer, "CUDA"))
  assert k.apply_tensor_cores(0) is False and k.applied_opts == []
  from tilecraft.helpers import Context
  with Context(TC=0): refuse(k, lambda k: k.apply_opt(Opt(OptOps.TC, 0, 0)), "use_tensor_cores must be")

def test_optimized_ast_has_wmma(rng):
  ast = _mm(rng, 64, 64, 64)
  for use, want in ((1, ReduceOps.WMMA), (3, ReduceOps.WMMA), (2, ReduceOps.SUM)):
    k = Kernel(ast, opts=fake(OpenCLRenderer, "AMD"))
    k.apply_tensor_cores(use)
    ops = [x.op for x in k.get_optimized_ast().lazyops]
    assert want in ops and (ReduceOps.WMMA in ops) == (use != 2)
  assert any(x.op is BinaryOps.MUL for x in k.get_optimized_ast().lazyops)
  # a half reduce on CUDA runs on the half->float core and is cast back to half once
  k = Kernel(ast, opts=fake(OpenCLRenderer, "CUDA"))
  k.apply_tensor_cores(1)
  assert str(k.tensor_core) == "WMMA_8_16_16_half_float" and isinstance(k.get_optimized_ast().src[0].src[0], LazyOp)

# ---- search and fuzzer ----------------------------------------------------------------------------

def test_beam_actions_offer_tc_on_targets_with_tensor_cores(rng):
  from tilecraft.engine.search.actions import get_kernel_actions
  ast = _mm(rng, 64, 64, 64)
  tc_kernels = [k for i, k in get_kernel_actions(Kernel(ast, opts=fake(OpenCLRenderer, "AMD"))).items() if i and k.applied_opts[0].op is OptOps.TC]
  assert tc_kernels and all(k.tensor_core is not None for k in tc_kernels)
  assert not any(i and k.applied_opts[0].op is OptOps.TC for i, k in get_kernel_actions(Kernel(ast, opts=OpenCLRenderer())).items())
  k = Kernel(ast, opts=fake(OpenCLRenderer, "AMD"))
  k.apply_opt(Opt(OptOps.UPCAST, 0, 2))
  assert not any(k2.applied_opts[-1].op is OptOps.TC for k2 in get_kernel_actions(k, include_0=False).values()), "TC only as the first opt"

@pytest.mark.parametrize("vendor", ["CUDA", "METAL"])
def test_beam_actions_offer_every_tc_candidate_of_a_conv(vendor, rng):
  """A 3x3 conv has 9 (N, M, reduce) candidates (3 N axes x 1 M axis x 3 reduce axes): the search
  offers each one that applies (with some tc_opt), not only the first few."""
  from tilecraft.engine.search.actions import get_kernel_actions, signature
  k = Kernel(conv_case(rng)[0], opts=fake(OpenCLRenderer, vendor))
  n = len(tc_choices(k, 2)[3])
  assert n == 9
  want = set()
  for ax in range(n):
    for tc_opt in (0, 1, 2):
      kc = k.copy()
      try: kc.apply_opt(Opt(OptOps.TC, ax, tc_opt))
      except KernelOptError: continue
      want.add(signature(kc))
  offered = {signature(k2) for k2 in get_kernel_actions(k, include_0=False).values() if k2.applied_opts[0].op is OptOps.TC}
  assert offered == want and max(k2.applied_opts[0].axis for k2 in get_kernel_actions(k, include_0=False).values()
                                 if k2.applied_opts[0].op is OptOps.TC) >= 3

def test_fuzzer_samples_tc_first_and_they_match(rng):
  """random_opts starts with a TC opt on targets with tensor cores; the sequences run right (use 2, CPU)."""
  from tilecraft.testing.opt_sampler import random_opts
  ren = fake(CRenderer, "CUDA")
  ast, inputs, want = matmul_case(rng, 32, 32, 32)
  n_tc = 0
  for _ in range(6):
    seq = random_opts(Kernel(ast, opts=ren), rng, max_opts=2, tc=1.0, tc_use=2)
    assert seq.error is None, seq.error
    if not seq or seq[0].op is not OptOps.TC: continue
    n_tc += 1
    assert seq.tc_use == 2 and all(o.op is not OptOps.TC for o in seq[1:])
    p = seq.kernel.to_program()
    p.device = "CPU"
    got = run_program(ast, p, inputs, "CPU")[0]
    np.testing.assert_allclose(got.astype(np.float64).reshape(want.shape), want, **_tol(ast), err_msg=str(list(seq)))
  assert n_tc >= 5

def test_full_unroll_keeps_the_local_region(rng):
  """A fully unrolled reduce axis leaves a size-1 remnant right before first_reduce: it must not be
  counted as a local axis (that turned a TC lane axis into a global one; found by the TC fuzzer)."""
  k = Kernel(_mm(rng, 32, 32, 4), opts=OpenCLRenderer())
  k.apply_opt(Opt(OptOps.LOCAL, 0, 4))
  k.apply_opt(Opt(OptOps.UNROLL, 0, 0))
  assert k.local_dims == 1 and k.full_shape[k.global_dims] == 4
  k = Kernel(_mm(rng, 64, 64, 32), opts=fake(OpenCLRenderer, "AMD"))
  k.apply_tensor_cores(1, tc_opt=0, extra_opts=[Opt(OptOps.UNROLL, 0, 0)])
  assert k.local_dims == 5 and k.full_shape[k.global_dims:k.first_reduce] == (2,) * 5

def test_locals_after_tc_fit_the_launch_limits(rng):
  """Thread dims beyond 3 fold into launch dims that fit the target (CUDA's z is at most 64): a LOCAL
  after TC goes outside the lanes, and the launch still fits (the emulator's launch check found one)."""
  from tilecraft.codegen.lower_state import kernel_layout, launch_dims
  from tilecraft.renderer.cuda import CUDARenderer
  ren = CUDARenderer()
  k = Kernel(_mm(rng, 256, 64, 64), opts=ren)
  k.apply_tensor_cores(1, extra_opts=[Opt(OptOps.LOCAL, 0, 16)])
  _, local = launch_dims(kernel_layout(k.get_optimized_ast()), ren)
  assert all(d <= m for d, m in zip(local, ren.local_max)) and int(np.prod(local)) == 512
