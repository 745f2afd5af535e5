"""Every accepted tensor-core kernel of the TC test cases (tilecraft/testing/tc_cases.py: every core,
size, padding, batch, conv and axis choice) renders to CUDA C with inline `mma.sync` that compiles
for sm_80 and sm_90, to HIP that compiles for gfx1100 with `v_wmma` in the assembly, and to Metal
with `simdgroup_multiply_accumulate` that passes the structural checks. Batched, disk-cached."""
import functools
import pytest
from tilecraft.testing.tc_cases import tc_kernels

@functools.lru_cache(maxsize=None)
def sources(target):
  if target == "CUDA": from tilecraft.renderer.cuda import CUDARenderer as R
  elif target == "AMD": from tilecraft.renderer.hip import HIPRenderer as R
  else: from tilecraft.renderer.metal import MetalRenderer as R
  ren = R()
  out = []
  for i, tc in enumerate(ren.tensor_cores):
    for j, (name, ax, *_, k) in enumerate(tc_kernels(ren, tc, seed=i)):
      out.append(k.to_program(name_override=f"tc{i}_{j}_{name.replace('x', '_')}_axis{ax}").src)
  return out

@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cuda_tc_kernels_compile(arch, cuda_compiler_ok):
  from tilecraft.runtime.cuda import CUDACompiler
  srcs = sources("CUDA")
  assert len(srcs) >= 12 and all("mma.sync.aligned.m16n8k16.row.col.f32" in s for s in srcs)
  assert CUDACompiler(arch).compile_batch(srcs)[:4] == b"\x7fELF"

def test_hip_tc_kernels_compile_to_v_wmma(hip_clang_ok):
  from tilecraft.runtime.hip import HIPCompiler
  srcs = sources("AMD")
  asm = HIPCompiler().compile_batch(srcs).decode()
  assert asm.count(".amdhsa_kernel ") == len(srcs) >= 12
  assert "v_wmma_f32_16x16x16_f16" in asm and "v_wmma_f16_16x16x16_f16" in asm

def test_metal_tc_kernels_structure():
  from tilecraft.runtime.metal import metal_problems
  srcs = sources("METAL")
  assert len(srcs) >= 15 and all("simdgroup_multiply_accumulate" in s and not metal_problems(s) for s in srcs)
