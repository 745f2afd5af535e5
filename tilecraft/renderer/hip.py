"""HIP for AMD RDNA3 (gfx1100), written for clang without any header: kernels and address spaces
by attribute, thread ids and barriers by amdgcn builtins, math from AMD's device library (ocml,
declared here and linked by the runtime's compiler), vectors as clang ext_vector_types (which
have arithmetic), half as _Float16 (native on gfx1100)."""
from __future__ import annotations
from typing import Any
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import DType, PtrDType, dtypes
from tilecraft.ops import BinaryOps, UnaryOps
from tilecraft.renderer.cstyle import C_TYPE_NAMES
from tilecraft.renderer.gpu_cstyle import GPUCStyleLanguage
from tilecraft.renderer.tensor_cores import AMD_TENSOR_CORES

_OCML = {UnaryOps.EXP2: "exp2", UnaryOps.LOG2: "log2", UnaryOps.SIN: "sin", UnaryOps.SQRT: "sqrt"}
_SUFFIX = {dtypes.float16: "f16", dtypes.float32: "f32", dtypes.float64: "f64"}

class HIPRenderer(GPUCStyleLanguage):
  """HIP for gfx1100. Limits: 1024 threads per workgroup, 64 KiB of LDS per workgroup."""
  device = "HIP"
  global_max = (2**31 - 1, 65535, 65535)
  local_max = (1024, 1024, 1024)
  shared_max = 65536
  max_threads = 1024
  type_names = {**C_TYPE_NAMES, dtypes.bool: "bool"}
  vector_dtypes = frozenset({dtypes.float32, dtypes.int32, dtypes.float16})
  vector_alu = frozenset({BinaryOps.ADD, BinaryOps.SUB, BinaryOps.MUL, UnaryOps.NEG})
  special_fmt = {"group": "__builtin_amdgcn_workgroup_id_{d}()", "local": "__builtin_amdgcn_workitem_id_{d}()",
                 "global": "(({t})__builtin_amdgcn_workgroup_id_{d}()*__builtin_amdgcn_workgroup_size_{d}()+__builtin_amdgcn_workitem_id_{d}())"}
  inf_fmt = {dtypes.float32: ("__builtin_inff()", "__builtin_nanf(\"\")"), dtypes.float64: ("__builtin_inf()", "__builtin_nan(\"\")"),
             dtypes.float16: ("((_Float16)__builtin_inff())", "((_Float16)__builtin_nanf(\"\"))")}
  helper_prefix = "static inline __attribute__((device)) "
  vector_fmt = "{vt}{{{vals}}}"

  def vector_def(self, dt: DType) -> str: return f"typedef {self.type_names[dt.scalar()]} {self.render_dtype(dt)} __attribute__((ext_vector_type({dt.count})));"
  def render_gep(self, x: str, i: int) -> str: return f"{x}[{i}]"
  def render_bits(self, x: str, dt: DType, src_dt: DType) -> str: return f"__builtin_bit_cast({self.render_dtype(dt)}, ({self.render_dtype(src_dt)})({x}))"
  def render_math(self, op: Any, x: str, dt: DType) -> str: return f"__ocml_{_OCML[op]}_{_SUFFIX[dt.scalar()]}({x})"
  def render_fmod(self, a: str, b: str, dt: DType) -> str:
    """clang's builtin: an LLVM frem, which the AMDGPU backend expands exactly (no library call)."""
    if dt.scalar() == dtypes.float64: return f"__builtin_fmod({a}, {b})"
    if dt.scalar() == dtypes.float32: return f"__builtin_fmodf({a}, {b})"
    return f"(({self.render_dtype(dt)})__builtin_fmodf((float)({a}), (float)({b})))"
  def render_barrier(self) -> str:
    return '__builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup"); __builtin_amdgcn_s_barrier(); __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");'
  def render_local(self, name: str, dt: DType, size: int) -> str: return f"__attribute__((shared, aligned(16))) {self.render_dtype(dt)} {name}[{size}];"
  def header(self, uops: list[UOp]) -> list[str]:
    used = sorted({(u.arg, u.dtype.scalar()) for u in uops if u.op is UOps.ALU and u.arg in _OCML}, key=lambda x: (_OCML[x[0]], x[1].name))
    return [f'extern "C" __attribute__((device, const)) {self.type_names[dt]} __ocml_{_OCML[op]}_{_SUFFIX[dt]}({self.type_names[dt]});' for op, dt in used]
  def render_kernel(self, name: str, body: list[str], args: list[tuple[str, DType, bool]], uops: list[UOp], prelude: list[str]) -> str:
    params = []
    for n, dt, mutable in args:
      if isinstance(dt, PtrDType): params.append(f"{'' if mutable else 'const '}{self.render_dtype(dt)} __restrict__ {n}")
      else: params.append(f"{self.arg_int_type} {n}")
    bound = self.launch_bound(uops) or self.max_threads
    attrs = f"__attribute__((global, amdgpu_flat_work_group_size(1, {bound})))"
    return "\n".join(prelude + [f'extern "C" {attrs} void {name}({", ".join(params)}) {{'] + body + ["}"]) + "\n"

  # ---- tensor cores: RDNA3 wave32 WMMA builtins (fragments in renderer/tensor_cores.py) ----
  tensor_cores = AMD_TENSOR_CORES
  def render_wmma(self, u: UOp, srcs: list[str]) -> str: return f"tc_{u.arg[0]}({', '.join(srcs)})"
  def wmma_defs(self, wmmas: list[UOp]) -> list[str]:
    out = []
    for arg in dict.fromkeys(u.arg for u in wmmas):
      name, dims, din, dout, vendor = arg[0], tuple(arg[1]), arg[2], arg[3], arg[5]
      if vendor != "AMD" or dims != (16, 16, 16) or din != dtypes.float16 or dout not in (dtypes.float32, dtypes.float16):
        raise NotImplementedError(f"HIP has no tensor core {name}")
      ta, tc = self.render_dtype(din.vec(16)), self.render_dtype(dout.vec(8))
      head = f"{self.helper_prefix}{tc} tc_{name}({ta} a, {ta} b, {tc} c) {{"
      if dout == dtypes.float32: out += [head, "  return __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(a, b, c);", "}"]
      else:  # 16-bit D: the 8 values sit in the low halves of 8 VGPRs (op_sel false), i.e. the even elements of a half16
        out += [head, f"  {ta} c2 = {{}};", "  for (int i = 0; i < 8; i++) c2[2 * i] = c[i];",
                f"  {ta} d2 = __builtin_amdgcn_wmma_f16_16x16x16_f16_w32(a, b, c2, false);",
                f"  {tc} d;", "  for (int i = 0; i < 8; i++) d[i] = d2[2 * i];", "  return d;", "}"]
    return out
