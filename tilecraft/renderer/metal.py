"""Metal Shading Language for Apple GPUs. There is no Metal compiler here: `check_metal` checks the
source's structure instead (see runtime/metal.py). Metal has no float64."""
from __future__ import annotations
from typing import Any
from tilecraft.codegen.uops import UOp
from tilecraft.dtype import DType, PtrDType, dtypes
from tilecraft.ops import UnaryOps
from tilecraft.renderer.cstyle import GPUCStyleLanguage

class MetalRenderer(GPUCStyleLanguage):
  """Metal (Apple GPUs). Limits: 1024 threads per threadgroup, 32 KiB of threadgroup memory."""
  device = "METAL"
  global_max = (2**31 - 1, 65535, 65535)
  local_max = (1024, 1024, 1024)
  shared_max = 32768
  max_threads = 1024
  type_names = {dtypes.bool: "bool", dtypes.int8: "char", dtypes.uint8: "uchar", dtypes.int16: "short", dtypes.uint16: "ushort",
                dtypes.int32: "int", dtypes.uint32: "uint", dtypes.int64: "long", dtypes.uint64: "ulong", dtypes.float16: "half",
                dtypes.bfloat16: "ushort", dtypes.float32: "float"}
  special_fmt = {"group": "gid.{d}", "local": "lid.{d}", "global": "gpos.{d}"}
  _SPECIAL_ARGS = {"group": "uint3 gid [[threadgroup_position_in_grid]]", "local": "uint3 lid [[thread_position_in_threadgroup]]",
                   "global": "uint3 gpos [[thread_position_in_grid]]"}
  inf_fmt = {dtypes.float32: ("INFINITY", "NAN"), dtypes.float16: ("((half)INFINITY)", "((half)NAN)")}
  int64_suffix = "l"
  helper_prefix = "static inline "
  align_fmt = "alignas({})"
  arg_int_type = "long"

  def space(self, buf_dt: DType) -> str: return "threadgroup " if isinstance(buf_dt, PtrDType) and buf_dt.local else "device "
  def render_bits(self, x: str, dt: DType, src_dt: DType) -> str: return f"as_type<{self.render_dtype(dt)}>(({self.render_dtype(src_dt)})({x}))"
  def render_math(self, op: Any, x: str, dt: DType) -> str:
    fn = {UnaryOps.EXP2: "exp2", UnaryOps.LOG2: "log2", UnaryOps.SIN: "sin", UnaryOps.SQRT: "sqrt"}[op]
    return f"precise::{fn}({x})" if dt.scalar() == dtypes.float32 else f"{fn}({x})"
  def render_barrier(self) -> str: return "threadgroup_barrier(mem_flags::mem_threadgroup);"
  def render_local(self, name: str, dt: DType, size: int) -> str: return f"threadgroup {self.render_dtype(dt)} {name}[{size}];"
  def header(self, uops: list[UOp]) -> list[str]: return ["#include <metal_stdlib>", "using namespace metal;"]
  def render_kernel(self, name: str, body: list[str], args: list[tuple[str, DType, bool]], uops: list[UOp], prelude: list[str]) -> str:
    params = []
    for i, (n, dt, mutable) in enumerate(args):
      if isinstance(dt, PtrDType): params.append(f"{'' if mutable else 'const '}device {self.render_dtype(dt)} {n} [[buffer({i})]]")
      else: params.append(f"constant {self.arg_int_type}& {n} [[buffer({i})]]")
    kinds = {u.arg[3] for u in uops if u.op.name == "SPECIAL"}
    params += [a for k, a in self._SPECIAL_ARGS.items() if k in kinds]
    bound = self.launch_bound(uops)
    head = ([f"[[max_total_threads_per_threadgroup({bound})]]"] if bound is not None else []) + [f"kernel void {name}({', '.join(params)}) {{"]
    return "\n".join(prelude + head + body + ["}"]) + "\n"
