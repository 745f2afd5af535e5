"""OpenCL C (`OpenCLRenderer`): `__kernel`/`__global`/`__local` qualifiers, vload/vstore for vectors,
image2d arguments read and written a texel at a time through one sampler, and signed overflow wrapped
through `as_<type>` bitcasts. Without cl_khr_fp16 (PoCL on CPUs) half is a storage type only.
"""
from __future__ import annotations
from typing import Any, Optional
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import DType, ImageDType, PtrDType, dtypes
from tilecraft.ops import BinaryOps, UnaryOps
from tilecraft.renderer.cstyle import CL_TYPE_NAMES, CStyleLanguage

class OpenCLRenderer(CStyleLanguage):
  """OpenCL C. Without cl_khr_fp16 (PoCL on CPUs), half is a storage type: loads and stores go
  through vload_half/vstore_half and arithmetic runs in float."""
  device = "OPENCL"
  kernel_prefix = "__kernel "
  buffer_prefix = "__global "
  arg_int_type = "long"
  int64_suffix = "l"  # long is 64-bit in OpenCL C (long long is reserved)
  float4_ctor = "({vt})({vals})"
  global_max = (2**31 - 1, 65535, 65535)
  local_max = (1024, 1024, 1024)
  shared_max = 32768
  type_names = CL_TYPE_NAMES
  vector_dtypes = frozenset({dtypes.float32, dtypes.int32})
  vector_alu = frozenset({BinaryOps.ADD, BinaryOps.SUB, BinaryOps.MUL, UnaryOps.NEG})
  supports_images = True  # the runtime sets both from the device (8192: the OpenCL 1.2 minimum where images are supported)
  image_max = (8192, 8192)
  def __init__(self, half_arith: bool = False, local_max: Optional[tuple] = None, shared_max: Optional[int] = None):
    self.half_arith = half_arith
    if local_max is not None: self.local_max = local_max
    if shared_max is not None: self.shared_max = shared_max
  def render_dtype(self, dt: DType) -> str:
    if isinstance(dt, PtrDType):
      base = dt.base
      if base.scalar() == dtypes.bool: return "uchar*"  # bool is not allowed in kernel arguments
      return (self.type_names.get(base, base.name) if base.count == 1 else super().render_dtype(base)) + "*"
    if dt.scalar() == dtypes.float16 and not self.half_arith: return "float" + (str(dt.count) if dt.count > 1 else "")
    return super().render_dtype(dt)
  def render_const(self, x: Any, dt: DType) -> str:
    if dt.scalar() == dtypes.float16 and not self.half_arith: return self.render_const(x, dtypes.float32)
    return super().render_const(x, dt)
  def render_cast(self, x: str, dt: DType, src_dt: DType) -> str:
    if dt.scalar() == dtypes.bfloat16: return f"f32_to_bf16((float)({x}))"
    if src_dt.scalar() == dtypes.bfloat16: return f"(({self.render_dtype(dt)})bf16_to_f32({x}))"
    if dt.scalar() == dtypes.float16 and not self.half_arith: return f"round_half((float)({x}))"
    if dt.scalar() == dtypes.bool: return f"(({x})!=0)"
    return super().render_cast(x, dt, src_dt)
  def render_math(self, op: Any, x: str, dt: DType) -> str:
    fn = {UnaryOps.EXP2: "exp2", UnaryOps.LOG2: "log2", UnaryOps.SIN: "sin", UnaryOps.SQRT: "sqrt"}[op]
    return f"{fn}({x})"
  def render_fmod(self, a: str, b: str, dt: DType) -> str: return f"fmod({a}, {b})"  # exact in OpenCL C (0 ulp)
  def render_vectorize(self, vals: list[str], dt: DType) -> str: return f"(({self.render_dtype(dt)})({','.join(vals)}))"
  def render_image_param(self, name: str, dt: ImageDType, mutable: bool) -> str: return f"{'write_only' if mutable else 'read_only'} image2d_t {name}"
  def render_load(self, buf: str, idx: str, dt: DType, buf_dt: DType, aligned: bool = False) -> str:
    if isinstance(buf_dt, ImageDType): return f"read_image{'h' if dt.scalar() == dtypes.float16 else 'f'}({buf}, smp, {idx})"  # idx: int2 (x, y)
    base = buf_dt.base if isinstance(buf_dt, PtrDType) else buf_dt
    if base.scalar() == dtypes.float16 and not self.half_arith: return f"vload_half({idx}, {buf})"
    if dt.count > 1: return f"vload{dt.count}(0, {buf}+{idx})"
    return f"{buf}[{idx}]"
  def render_store(self, buf: str, idx: str, val: str, dt: DType, buf_dt: DType, aligned: bool = False) -> str:
    if isinstance(buf_dt, ImageDType): return f"write_image{'h' if dt.scalar() == dtypes.float16 else 'f'}({buf}, {idx}, {val});"
    base = buf_dt.base if isinstance(buf_dt, PtrDType) else buf_dt
    if base.scalar() == dtypes.float16 and not self.half_arith: return f"vstore_half({val}, {idx}, {buf});"
    if dt.count > 1: return f"vstore{dt.count}({val}, 0, {buf}+{idx});"
    return f"{buf}[{idx}] = {val};"
  def render_gep(self, x: str, i: int) -> str: return f"{x}.s{'0123456789abcdef'[i]}"
  def render_special(self, u: UOp) -> str:
    fn = {"group": "get_group_id", "local": "get_local_id", "global": "get_global_id"}[u.arg[3]]
    return f"{fn}({u.arg[2]})"
  def render_barrier(self) -> str: return "barrier(CLK_LOCAL_MEM_FENCE);"
  def render_local(self, name: str, dt: DType, size: int) -> str: return f"__local {self.render_dtype(dt)} {name}[{size}];"
  def prelude(self, uops: list[UOp]) -> list[str]:
    lines = []
    if any(u.dtype.scalar() == dtypes.float64 for u in uops): lines.append("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
    if self.half_arith and any(u.dtype.scalar() == dtypes.float16 for u in uops): lines.append("#pragma OPENCL EXTENSION cl_khr_fp16 : enable")
    if any(u.op is UOps.DEFINE_GLOBAL and isinstance(u.dtype, ImageDType) for u in uops):  # texel reads: integer coords, outside the image reads 0
      lines.append("__constant sampler_t smp = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_CLAMP | CLK_FILTER_NEAREST;")
    if not self.half_arith and any(u.op is UOps.CAST and u.dtype.scalar() == dtypes.float16 for u in uops):
      lines.append("float round_half(float x) { ushort h; vstore_half(x, 0, (__private half*)&h); return vload_half(0, (__private half*)&h); }")
    if any(u.op is UOps.CAST and (u.dtype.scalar() == dtypes.bfloat16 or any(s.dtype.scalar() == dtypes.bfloat16 for s in u.src)) for u in uops):
      lines += ["float bf16_to_f32(ushort x) { return as_float((uint)x << 16); }",
                "ushort f32_to_bf16(float f) { uint u = as_uint(f); if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u);",
                "  return (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); }"]
    return lines
  def render_bitcast(self, x: str, dt: DType, src_dt: DType) -> str: return f"as_{self.render_dtype(dt)}({x})"
  def render_as(self, x: str, dt: DType, src_dt: DType) -> str: return self.render_bitcast(x, dt, src_dt)  # vectors too
