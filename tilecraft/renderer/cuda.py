"""CUDA C for NVIDIA GPUs, compiled by NVRTC or nvcc without any header.

half has no type without cuda_fp16.h, so half values live in float registers holding exactly
representable halves: memory holds the 16-bit patterns (converted with the PTX `cvt` instructions
on load and store), and every half operation rounds its float result to half, which gives IEEE
half results (float's 24 bits are enough that rounding twice equals rounding once for + - * / sqrt).
bfloat16 is computed in float by the lowerer; the renderer only converts its bits.
"""
from __future__ import annotations
from typing import Any
import numpy as np
from tilecraft.codegen.uops import UOp
from tilecraft.dtype import DType, PtrDType, dtypes
from tilecraft.ops import BinaryOps, TernaryOps, UnaryOps
from tilecraft.renderer.cstyle import C_TYPE_NAMES
from tilecraft.renderer.gpu_cstyle import GPUCStyleLanguage
from tilecraft.renderer.tensor_cores import CUDA_TENSOR_CORES

_H = dtypes.float16
_ROUNDED = frozenset({BinaryOps.ADD, BinaryOps.SUB, BinaryOps.MUL, UnaryOps.RECIP})  # half ops whose float result must round

class CUDARenderer(GPUCStyleLanguage):
  """CUDA C (sm_80+). Limits: 1024 threads per block (z at most 64), 48 KiB of static shared memory
  per block, grids of 2^31-1 x 65535 x 65535 blocks."""
  device = "CUDA"
  global_max = (2**31 - 1, 65535, 65535)
  local_max = (1024, 1024, 64)
  shared_max = 49152
  max_threads = 1024
  type_names = {**C_TYPE_NAMES, dtypes.bool: "bool", dtypes.float16: "float"}  # halves compute in float registers
  special_fmt = {"group": "blockIdx.{d}", "local": "threadIdx.{d}", "global": "(({t})blockIdx.{d}*blockDim.{d}+threadIdx.{d})"}
  inf_fmt = {dtypes.float32: ("__int_as_float(0x7f800000)", "__int_as_float(0x7fc00000)"), _H: ("__int_as_float(0x7f800000)", "__int_as_float(0x7fc00000)"),
             dtypes.float64: ("__longlong_as_double(0x7ff0000000000000ll)", "__longlong_as_double(0x7ff8000000000000ll)")}
  helper_prefix = "__device__ __forceinline__ "
  align_fmt = "__align__({})"

  def render_dtype(self, dt: DType) -> str:
    if isinstance(dt, PtrDType) and dt.base == _H and not dt.local: return "unsigned short*"  # global halves: the bits
    return super().render_dtype(dt)
  def render_const(self, x: Any, dt: DType) -> str:
    if dt == _H: return self.render_const(float(np.float16(x)), dtypes.float32)  # a float holding the half value
    return super().render_const(x, dt)
  def render_cast(self, x: str, dt: DType, src_dt: DType) -> str:
    if dt == _H:
      if src_dt == _H: return x
      if src_dt == dtypes.bfloat16: return f"tc_rh(tc_bf16_to_f32({x}))"  # bfloat16's range is float's: round into half's
      return f"tc_rh_d({x})" if src_dt == dtypes.float64 else f"tc_rh((float)({x}))"
    return super().render_cast(x, dt, src_dt)
  def render_bits(self, x: str, dt: DType, src_dt: DType) -> str:
    d, s = dt.scalar(), src_dt.scalar()
    fn = {(dtypes.float32, dtypes.int32): "__int_as_float", (dtypes.float32, dtypes.uint32): "__uint_as_float",
          (dtypes.int32, dtypes.float32): "__float_as_int", (dtypes.uint32, dtypes.float32): "__float_as_uint",
          (dtypes.float64, dtypes.int64): "__longlong_as_double", (dtypes.int64, dtypes.float64): "__double_as_longlong"}.get((d, s))
    if fn is not None: return f"{fn}({x})"
    if (d, s) == (dtypes.float64, dtypes.uint64): return f"__longlong_as_double((long long)({x}))"
    if (d, s) == (dtypes.uint64, dtypes.float64): return f"((unsigned long long)__double_as_longlong({x}))"
    if d == _H: return f"tc_h2f((unsigned short)({x}))"
    if s == _H: return f"(({self.render_dtype(d)})tc_f2h({x}))"
    if not dtypes.is_float(d) and not dtypes.is_float(s) or dtypes.bfloat16 in (d, s): return f"(({self.render_dtype(d)})({x}))"  # same-size ints
    raise NotImplementedError(f"CUDA: no bitcast from {s.name} to {d.name}")
  def render_alu(self, op: Any, srcs: list[str], dt: DType, src_dt: DType) -> str:
    if dt == _H and op is TernaryOps.MULACC: return f"tc_rh(tc_rh({srcs[0]}*{srcs[1]})+{srcs[2]})"
    expr = super().render_alu(op, srcs, dt, src_dt)
    return f"tc_rh({expr})" if dt == _H and op in _ROUNDED else expr
  def render_math(self, op: Any, x: str, dt: DType) -> str:
    fn = {UnaryOps.EXP2: "exp2", UnaryOps.LOG2: "log2", UnaryOps.SIN: "sin", UnaryOps.SQRT: "sqrt"}[op]
    if dt == dtypes.float64: return f"{fn}({x})"
    return f"{fn}f({x})" if dt == dtypes.float32 else f"tc_rh({fn}f({x}))"
  def render_fmod(self, a: str, b: str, dt: DType) -> str:
    if dt == dtypes.float64: return f"fmod({a}, {b})"
    return f"fmodf({a}, {b})" if dt == dtypes.float32 else f"tc_rh(fmodf({a}, {b}))"  # (exact: the rounding keeps it)
  def render_load(self, buf: str, idx: str, dt: DType, buf_dt: DType, aligned: bool = False) -> str:
    if isinstance(buf_dt, PtrDType) and buf_dt.base == _H and not buf_dt.local: return f"tc_h2f({buf}[{idx}])"
    return super().render_load(buf, idx, dt, buf_dt, aligned)
  def render_store(self, buf: str, idx: str, val: str, dt: DType, buf_dt: DType, aligned: bool = False) -> str:
    if isinstance(buf_dt, PtrDType) and buf_dt.base == _H and not buf_dt.local: return f"{buf}[{idx}] = tc_f2h({val});"
    return super().render_store(buf, idx, val, dt, buf_dt, aligned)
  def render_barrier(self) -> str: return "__syncthreads();"
  def render_local(self, name: str, dt: DType, size: int) -> str: return f"__shared__ __align__(16) {self.render_dtype(dt)} {name}[{size}];"
  def header(self, uops: list[UOp]) -> list[str]:
    if not any(u.dtype.scalar() == _H or (isinstance(u.dtype, PtrDType) and u.dtype.base == _H) for u in uops): return []
    p = self.helper_prefix
    return [f'{p}float tc_h2f(unsigned short h) {{ float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }}',
            f'{p}unsigned short tc_f2h(float f) {{ unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }}',
            f'{p}float tc_rh(float f) {{ return tc_h2f(tc_f2h(f)); }}  /* round to the nearest half */',
            f'{p}float tc_rh_d(double d) {{ unsigned short h; asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(d)); return tc_h2f(h); }}']
  def render_kernel(self, name: str, body: list[str], args: list[tuple[str, DType, bool]], uops: list[UOp], prelude: list[str]) -> str:
    params = []
    for n, dt, mutable in args:
      if isinstance(dt, PtrDType): params.append(f"{'' if mutable else 'const '}{self.render_dtype(dt)} __restrict__ {n}")
      else: params.append(f"{self.arg_int_type} {n}")
    bound = self.launch_bound(uops)
    lb = f"__launch_bounds__({bound}) " if bound is not None else ""
    return "\n".join(prelude + [f'extern "C" __global__ void {lb}{name}({", ".join(params)}) {{'] + body + ["}"]) + "\n"

  # ---- tensor cores: mma.sync.aligned.m16n8k16.row.col (PTX ISA; fragments in renderer/tensor_cores.py) ----
  tensor_cores = CUDA_TENSOR_CORES
  def render_wmma(self, u: UOp, srcs: list[str]) -> str: return f"tc_{u.arg[0]}({', '.join(srcs)})"
  def wmma_defs(self, wmmas: list[UOp]) -> list[str]:
    out = []
    for arg in dict.fromkeys(u.arg for u in wmmas):
      name, dims, din, dout, vendor = arg[0], tuple(arg[1]), arg[2], arg[3], arg[5]
      if vendor != "CUDA" or dims != (8, 16, 16) or dout != dtypes.float32 or din not in (_H, dtypes.bfloat16):
        raise NotImplementedError(f"CUDA has no tensor core {name}")
      # each .b32 register holds two 16-bit elements, the lower-numbered one in the low half
      bits = (lambda x: f"(unsigned int)tc_f2h({x})") if din == _H else (lambda x: f"(unsigned int)({x})")
      pk = lambda v, j: f"{bits(f'{v}.v[{2 * j}]')} | ({bits(f'{v}.v[{2 * j + 1}]')} << 16)"  # noqa: E731
      # our C^T = B^T A^T is PTX's D = A B: PTX's A registers come from our B, PTX's B from our A
      ta, tb, tc = self.render_dtype(din.vec(4)), self.render_dtype(din.vec(8)), self.render_dtype(dout.vec(4))
      ty = "f16" if din == _H else "bf16"
      out += [f"{self.helper_prefix}{tc} tc_{name}({ta} a, {tb} b, {tc} c) {{",
              "  unsigned int " + ", ".join(f"a{j} = {pk('b', j)}" for j in range(4)) + ";",
              "  unsigned int " + ", ".join(f"b{j} = {pk('a', j)}" for j in range(2)) + ";",
              f'  asm("mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32 {{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, {{%8, %9}}, {{%0, %1, %2, %3}};"',
              '      : "+f"(c.v[0]), "+f"(c.v[1]), "+f"(c.v[2]), "+f"(c.v[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));',
              "  return c;", "}"]
    return out
