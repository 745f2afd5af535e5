"""Metal Shading Language for Apple GPUs. There is no Metal compiler here: `check_metal` checks the
source's structure instead (see runtime/metal.py). Metal has no float64."""
from __future__ import annotations
from typing import Any
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import DType, PtrDType, dtypes
from tilecraft.ops import UnaryOps
from tilecraft.renderer.cstyle import CL_TYPE_NAMES
from tilecraft.renderer.gpu_cstyle import GPUCStyleLanguage
from tilecraft.renderer.tensor_cores import METAL_TENSOR_CORES

class MetalRenderer(GPUCStyleLanguage):
  """Metal (Apple GPUs). Limits: 1024 threads per threadgroup, 32 KiB of threadgroup memory."""
  device = "METAL"
  global_max = (2**31 - 1, 65535, 65535)
  local_max = (1024, 1024, 1024)
  shared_max = 32768
  max_threads = 1024
  type_names = {dt: name for dt, name in CL_TYPE_NAMES.items() if dt != dtypes.float64}  # Metal has no double
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
  def render_fmod(self, a: str, b: str, dt: DType) -> str:
    return f"precise::fmod({a}, {b})" if dt.scalar() == dtypes.float32 else f"fmod({a}, {b})"  # the fast fmod is x - y*trunc(x/y)
  def render_barrier(self) -> str: return "threadgroup_barrier(mem_flags::mem_threadgroup);"
  def render_local(self, name: str, dt: DType, size: int) -> str: return f"threadgroup {self.render_dtype(dt)} {name}[{size}];"
  def header(self, uops: list[UOp]) -> list[str]: return ["#include <metal_stdlib>", "using namespace metal;"]
  def render_kernel(self, name: str, body: list[str], args: list[tuple[str, DType, bool]], uops: list[UOp], prelude: list[str]) -> str:
    params = []
    for i, (n, dt, mutable) in enumerate(args):
      if isinstance(dt, PtrDType): params.append(f"{'' if mutable else 'const '}device {self.render_dtype(dt)} {n} [[buffer({i})]]")
      else: params.append(f"constant {self.arg_int_type}& {n} [[buffer({i})]]")
    kinds = {u.arg[3] for u in uops if u.op is UOps.SPECIAL}
    params += [a for k, a in self._SPECIAL_ARGS.items() if k in kinds]
    bound = self.launch_bound(uops)
    head = ([f"[[max_total_threads_per_threadgroup({bound})]]"] if bound is not None else []) + [f"kernel void {name}({', '.join(params)}) {{"]
    return "\n".join(prelude + head + body + ["}"]) + "\n"

  # ---- tensor cores: simdgroup_matrix 8x8 (thread_elements layout in renderer/tensor_cores.py) ----
  tensor_cores = METAL_TENSOR_CORES
  def render_wmma(self, u: UOp, srcs: list[str]) -> str: return f"tc_{u.arg[0]}({', '.join(srcs)})"
  def wmma_defs(self, wmmas: list[UOp]) -> list[str]:
    out = []
    for arg in dict.fromkeys(u.arg for u in wmmas):
      name, dims, din, dout, vendor = arg[0], tuple(arg[1]), arg[2], arg[3], arg[5]
      if vendor != "METAL" or dims != (8, 8, 8) or (din, dout) not in ((dtypes.float32,) * 2, (dtypes.float16, dtypes.float32), (dtypes.float16,) * 2):
        raise NotImplementedError(f"Metal has no tensor core {name}")
      ta, tc = self.render_dtype(din.vec(2)), self.render_dtype(dout.vec(2))
      mi, mo = f"simdgroup_{self.type_names[din]}8x8", f"simdgroup_{self.type_names[dout]}8x8"
      out += [f"{self.helper_prefix}{tc} tc_{name}({ta} a, {ta} b, {tc} c) {{", f"  {mi} ma, mb; {mo} mc;",
              "  ma.thread_elements()[0] = a.v[0]; ma.thread_elements()[1] = a.v[1];",
              "  mb.thread_elements()[0] = b.v[0]; mb.thread_elements()[1] = b.v[1];",
              "  mc.thread_elements()[0] = c.v[0]; mc.thread_elements()[1] = c.v[1];",
              "  simdgroup_multiply_accumulate(mc, ma, mb, mc);",
              f"  return {self.render_vectorize(['mc.thread_elements()[0]', 'mc.thread_elements()[1]'], dout.vec(2))};", "}"]
    return out
