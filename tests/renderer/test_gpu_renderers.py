"""The CUDA, HIP and Metal renderers: capabilities, the render-only devices, vector alignment, half on
CUDA, launch bounds, batch compile errors, Metal's structural checks and the CUDA runtime's failure
modes without a GPU. (Whole-corpus compile checks: test_gpu_compile.py.)"""
import re
import numpy as np
import pytest
from tilecraft.codegen.kernel import Kernel, Opt, OptOps
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.device import Buffer, CompileError, CompiledRunner, Device, DeviceUnavailable
from tilecraft.dtype import dtypes
from tilecraft.ops import BinaryOps
from tilecraft.renderer.analysis import multiple_of
from tilecraft.renderer.cuda import CUDARenderer
from tilecraft.renderer.hip import HIPRenderer
from tilecraft.renderer.metal import MetalRenderer
from tilecraft.testing.corpus import corpus

F32, I32 = dtypes.float32, dtypes.int32

def cuda_compiler(arch="sm_80"):
  """(tests calling this take the cuda_compiler_ok fixture: conftest.py here)"""
  from tilecraft.runtime.cuda import CUDACompiler
  return CUDACompiler(arch)

def hip_compiler():
  """(tests calling this take the hip_clang_ok fixture)"""
  from tilecraft.runtime.hip import HIPCompiler
  return HIPCompiler()

@pytest.mark.parametrize("ci", ["false", "true"])
@pytest.mark.parametrize("fixture,module,attr,gone", [("cuda_compiler_ok", "cuda", "cuda_compiler_missing", lambda: "no NVRTC, no nvcc"),
                                                      ("hip_clang_ok", "hip", "find_hip_clang", lambda: None)])
def test_compiler_fixtures_follow_the_ci_rule(request, monkeypatch, ci, fixture, module, attr, gone):
  """A missing GPU compiler skips the test, except in CI (CI=true), which installs them: there it fails."""
  import importlib
  monkeypatch.setattr(importlib.import_module(f"tilecraft.runtime.{module}"), attr, gone)
  monkeypatch.setenv("CI", ci)
  with pytest.raises(pytest.fail.Exception if ci == "true" else pytest.skip.Exception): request.getfixturevalue(fixture)

def test_capabilities():
  c, h, m = CUDARenderer(), HIPRenderer(), MetalRenderer()
  assert (c.shared_max, h.shared_max, m.shared_max) == (48 * 1024, 64 * 1024, 32 * 1024)
  assert c.local_max == (1024, 1024, 64) and h.local_max == m.local_max == (1024, 1024, 1024)
  for r in (c, h, m):
    assert r.has_local and r.has_shared and r.supports_float4 and r.max_threads == 1024 and r.global_max == (2**31 - 1, 65535, 65535)
  assert dtypes.float64 not in m.type_names and dtypes.float64 in c.type_names and dtypes.float64 in h.type_names
  for name, cls in (("CUDA", CUDARenderer), ("HIP", HIPRenderer), ("METAL", MetalRenderer)):
    assert isinstance(Device[name].renderer, cls)

def test_render_only_devices():
  for name in ("HIP", "METAL") + (("CUDA",) if Device["CUDA"].render_only else ()):
    dev = Device[name]
    assert dev.render_only and name not in Device.available()
    with pytest.raises(DeviceUnavailable, match=f"{name} is render \\+ compile-check only"): Buffer(name, 4, F32).allocate()
  k = Kernel(corpus()["ew_7"].ast, opts=Device["METAL"].renderer)
  with pytest.raises(DeviceUnavailable, match="METAL is render \\+ compile-check only"): CompiledRunner(k.to_program())
  from tilecraft.cli.devices import probe
  rec = probe("HIP")
  assert rec["mode"] == "render + compile-check only" and not rec["usable"] and rec["caps"]["shared_max"] == 65536

def test_cuda_without_a_driver(monkeypatch):
  """No libcuda (here) or no cuda-python: the device opens render-only and says why."""
  from tilecraft.runtime import cuda as rt
  class NoLibcuda:
    def cuInit(self, flags): raise RuntimeError("Failed to dlopen libcuda.so.1")
  monkeypatch.setattr(rt, "_driver", lambda: NoLibcuda())
  rt._context.cache_clear()
  try:
    dev = rt.open_cuda()
    assert dev.render_only is not None and "libcuda" in dev.render_only and isinstance(dev.renderer, CUDARenderer)
    def missing(): raise DeviceUnavailable("the CUDA runtime needs cuda-python")
    monkeypatch.setattr(rt, "_driver", missing)
    rt._context.cache_clear()
    assert "cuda-python" in rt.open_cuda().render_only
  finally: rt._context.cache_clear()

def test_cuda_launch_geometry():
  from tilecraft.runtime.cuda import _block_for
  assert _block_for(1024) == 256 and _block_for(50257) == 29 and _block_for(65521) == 1 and _block_for(7 * 25) == 175 and _block_for(1) == 1

def _vec_copy(offset: int):
  """data0[4*i + offset + 0..3] = data1[same]: a float4 copy, aligned only when offset is a multiple of 4."""
  g0, g1 = UOp(UOps.DEFINE_GLOBAL, F32.ptr(), (), 0), UOp(UOps.DEFINE_GLOBAL, F32.ptr(), (), 1)
  sp = UOp(UOps.SPECIAL, I32, (), ("gidx0", 8, 0, "group"))
  idx = UOp.alu(BinaryOps.ADD, UOp.alu(BinaryOps.MUL, sp, UOp.const(I32, 4)), UOp.const(I32, offset))
  ld = UOp(UOps.LOAD, F32.vec(4), (g1, idx))
  st = UOp(UOps.STORE, dtypes.void, (g0, idx, ld))
  return [g0, g1, sp, UOp.const(I32, 4), idx.src[0], UOp.const(I32, offset), idx, ld, st], idx

def test_vector_accesses_are_split_unless_aligned(cuda_compiler_ok):
  for off, aligned in ((0, True), (8, True), (1, False), (6, False)):
    uops, idx = _vec_copy(off)
    assert multiple_of(idx, 4) == aligned and multiple_of(idx, 2) == (off % 2 == 0)
    for ren in (CUDARenderer(), HIPRenderer(), MetalRenderer()):
      src = ren.render("copy", uops)
      assert (f"{ren.render_dtype(F32.vec(4))}*)(data1+" in src) == aligned, (type(ren).__name__, off, src)
      if not aligned: assert "(alu0)+3]" in src or ")+3]" in src
  srcs = [CUDARenderer().render(f"copy{off}", _vec_copy(off)[0]) for off in (0, 1)]
  cuda_compiler().compile_batch(srcs)

def test_half_on_cuda_rounds_every_op(cuda_compiler_ok):
  e = corpus()["arith_half"]
  src = Kernel(e.ast, opts=CUDARenderer()).to_program().src
  assert "cuda_fp16" not in src and "#include" not in src
  assert "tc_h2f(data1[" in src and "= tc_f2h(" in src and src.count("tc_rh(") >= 2  # mul and add each round
  cuda_compiler("sm_90").compile(src)
  assert "tc_rh(tc_bf16_to_f32(" in Kernel(corpus()["cast_bfloat16"].ast, opts=CUDARenderer()).to_program().src  # bf16 -> half rounds

def test_launch_bounds():
  e = corpus()["sum_axis1_5x7x9"]
  for ren, attr in ((CUDARenderer(), "__launch_bounds__(63)"), (HIPRenderer(), "amdgpu_flat_work_group_size(1, 63)"),
                    (MetalRenderer(), "[[max_total_threads_per_threadgroup(63)]]")):
    k = Kernel(e.ast, opts=ren)
    k.apply_opt(Opt(OptOps.LOCAL, 1, 9))
    k.apply_opt(Opt(OptOps.GROUP, 0, 7))
    src = k.to_program().src
    assert attr in src and ren.render_barrier() in src, src
  hip = Kernel(e.ast, opts=HIPRenderer()).to_program().src
  assert "amdgpu_flat_work_group_size(1, 1024)" in hip  # no local ids: the launch may pick any block

def test_constants_need_no_headers():
  c, h = CUDARenderer(), HIPRenderer()
  assert c.render_const(float("inf"), F32) == "__int_as_float(0x7f800000)" and "INFINITY" not in c.render_const(float("-inf"), dtypes.float64)
  assert c.render_const(-2**63, dtypes.int64) == "(-9223372036854775807ll-1)" and h.render_const(float("nan"), F32) == '__builtin_nanf("")'
  assert c.render_const(0.1, dtypes.float16) == repr(float(np.float16(0.1))) + "f"  # a float holding the half value
  assert MetalRenderer().render_const(5, dtypes.int64) == "5l"

def test_wmma_hook_refuses_without_tensor_cores():
  from tilecraft.renderer.cstyle import GPUCStyleLanguage, OpenCLRenderer
  for ren in (GPUCStyleLanguage(), OpenCLRenderer()):
    with pytest.raises(NotImplementedError, match="tensor cores"): ren.render_wmma(UOp(UOps.WMMA, F32), [])

def test_batch_compile_error_names_the_kernel(cuda_compiler_ok, hip_clang_ok):
  good = [Kernel(corpus()[n].ast, opts=HIPRenderer()).to_program().src for n in ("ew_7", "sum_all_7x25", "matmul_16x16x16")]
  broken = good[1].replace("acc0 = ", "acc0 = undeclared_thing + ", 1)
  hip = hip_compiler()
  hip.compile_batch(good)
  with pytest.raises(CompileError, match="1 of 3 kernels in a batch failed") as ei: hip.compile_batch([good[0], broken, good[2]])
  assert ei.value.src == broken and "undeclared_thing" in ei.value.stderr
  cgood = [Kernel(corpus()[n].ast, opts=CUDARenderer()).to_program().src for n in ("ew_7", "sum_all_7x25")]
  with pytest.raises(CompileError, match="kernels \\[1\\]") as ei:
    cuda_compiler().compile_batch([cgood[0], cgood[1].replace("acc0 = ", "acc0 = undeclared_thing + ", 1)])
  assert "undeclared_thing" in ei.value.src

def test_metal_structural_checks():
  from tilecraft.runtime.metal import MetalCompiler, metal_problems
  src = Kernel(corpus()["matmul_16x16x16"].ast, opts=MetalRenderer()).to_program().src
  assert metal_problems(src) == [] and MetalCompiler().compile(src) == src.encode()
  assert any("never closed" in p for p in metal_problems(src.rstrip()[:-1]))
  assert any("__syncthreads" in p for p in metal_problems(src.replace("{\n", "{\n  __syncthreads();\n", 1)))
  assert any("buffer indices" in p for p in metal_problems(src.replace("[[buffer(1)]]", "[[buffer(7)]]")))
  assert any("not a complete statement" in p for p in metal_problems(src.replace(";\n", "\n", 2)))
  with pytest.raises(CompileError, match="structural checks"): MetalCompiler().compile(src.replace("kernel void", "void"))
  with pytest.raises(NotImplementedError, match="no double"): Kernel(corpus()["unary_double"].ast, opts=MetalRenderer()).to_program()

def test_metal_64bit_ints_are_long_with_l_literals():
  """Metal's 64-bit ints are long / ulong (no long long): index math past 2^31 renders `long` and
  l / ul literals, and the structural checks refuse an ll literal."""
  from tilecraft import Context, Tensor
  from tilecraft.runtime.metal import metal_problems
  ren = MetalRenderer()
  assert [ren.render_const(x, dt) for x, dt in ((5, dtypes.int64), (-2**63, dtypes.int64), (2**64 - 1, dtypes.uint64))] == \
         ["5l", "(-9223372036854775807l-1)", "18446744073709551615ul"]
  M, S = 10**9 + 7, 7 * 10**8 + 1  # offsets past 2^31 through a stride over a tiny buffer (tests/codegen/test_lowerer.py)
  strided = Tensor(np.array([3., 5., 7.], np.float32), device="CPU").reshape(3, 1).expand(3, M).reshape(3 * M)[::S] + 0
  big = Tensor.empty(2**31 + 5, dtype=dtypes.uint8, device="CPU")
  srcs = {}
  with Context(SPLIT_REDUCE=0): count = Tensor.ones(2**32 + 6, dtype=dtypes.int64, device="CPU").sum()  # (one kernel, its loop past int32)
  for name, t in (("strided", strided), ("index", big[2**31 + 3] + 1), ("count", count)):
    k = Kernel(t.schedule()[-1].ast, opts=ren)
    for opts in ("required", "hand"):
      src = (k.copy().required_optimizations() if opts == "required" else k.copy().hand_coded_optimizations()).to_program().src
      assert metal_problems(src) == [] and "long long" not in src and not re.search(r"\d(ll|LL)\b", src), (name, opts, src)
      srcs[name, opts] = src
  assert "(long)" in srcs["strided", "hand"] and "[2147483651l]" in srcs["index", "required"], srcs
  assert re.search(r"\b\d{10,}l\b", srcs["count", "required"]), srcs["count", "required"]
  bad = srcs["index", "required"].replace("[2147483651l]", "[2147483651ll]")
  assert any("ll suffix" in p for p in metal_problems(bad)), metal_problems(bad)
  assert any("ll suffix" in p for p in metal_problems(bad.replace("2147483651ll", "0x80000003ull")))

@pytest.mark.opencl
def test_grids_fit_the_targets_limits():
  """A global dim past 65535 can't be CUDA's grid y or z: such kernels launch on fewer dims (x has
  2^31-1), and their ids still address every element (run on OPENCL, whose limits are the same)."""
  from tilecraft.shape.shapetracker import ShapeTracker
  from tilecraft.testing import fuzz
  from tilecraft.testing.corpus import kernel, ld, store, ST
  rng = np.random.default_rng(0)
  for shape, perm in (((3, 70000), (1, 0)), ((3, 70000, 5), (1, 0, 2)), ((70000, 3, 5), (2, 1, 0))):
    out = tuple(shape[i] for i in perm)
    ast = kernel(store(0, F32, ST(out), ld(1, F32, ShapeTracker.from_shape(shape).permute(perm))))
    for ren in (CUDARenderer(), HIPRenderer(), MetalRenderer(), Device["OPENCL"].renderer):
      gs = Kernel(ast, opts=ren).to_program().global_size
      assert all(g <= m for g, m in zip(gs, ren.global_max)), (type(ren).__name__, shape, perm, gs)
    x = rng.random(shape, dtype=np.float32)
    assert np.array_equal(fuzz.run_ast(ast, {1: x}, [], "OPENCL")[0].reshape(out), x.transpose(perm))
