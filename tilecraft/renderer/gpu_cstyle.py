"""The GPU C dialects' shared base (`GPUCStyleLanguage`, subclassed by CUDA, HIP and Metal in
`cuda.py`, `hip.py`, `metal.py`): thread ids from a format table, local memory and barriers, launch
bounds, vectors as aligned structs, bfloat16 conversion helpers, and the hook for tensor-core
helper definitions. A vector access at an index not provably a multiple of its width is split into lanes.
"""
from __future__ import annotations
import functools, math
from typing import Any, Optional
import numpy as np
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import DType, ImageDType, PtrDType, bf16_bits_from_f32, dtypes
from tilecraft.renderer.cstyle import CStyleLanguage, unsigned_of

class GPUCStyleLanguage(CStyleLanguage):
  """What the GPU dialects (CUDA, HIP, Metal) share: a grid of workgroups of threads, local memory,
  barriers, launch bounds, and vector values as aligned types. A vector load or store whose index is
  not a provable multiple of its width (`multiple_of`) is split into lanes: GPUs fault on misaligned
  vector accesses. Targets fill in the spellings (`special_fmt`, `vector_fmt`, ...)."""
  has_local = True
  has_shared = True
  supports_float4 = True
  global_max = (2**31 - 1, 65535, 65535)
  local_max = (1024, 1024, 64)
  max_threads = 1024
  vector_dtypes = frozenset({dtypes.float32, dtypes.int32})
  vector_alu: frozenset = frozenset()
  arg_int_type = "long long"
  helper_prefix = "static inline "  # how helper functions in the prelude are declared
  special_fmt: dict[str, str] = {}  # SPECIAL kind (group/local/global) -> expression, {d} = x/y/z, {t} = the id's type
  inf_fmt: dict[DType, tuple[str, str]] = {}  # float dtype -> (infinity, nan)

  # ---- types and values ---------------------------------------------------------------------------
  def vector_name(self, dt: DType) -> str:
    return f"tc_{self.type_names[dt.scalar()].replace(' ', '_')}{dt.count}"
  def render_dtype(self, dt: DType) -> str:
    if isinstance(dt, ImageDType): raise NotImplementedError(f"{type(self).__name__} has no image types")
    if isinstance(dt, PtrDType): return self.render_dtype(dt.base) + "*"
    if dt.scalar() not in self.type_names: raise NotImplementedError(f"{type(self).__name__}: the target has no {dt.scalar().name} type")
    return self.vector_name(dt) if dt.count > 1 else self.type_names[dt]
  def render_const(self, x: Any, dt: DType) -> str:
    sc = dt.scalar()
    if dt.count > 1: return self.render_vectorize([self.render_const(x, sc)] * dt.count, dt)
    if sc == dtypes.bfloat16: return f"(({self.type_names[sc]}){int(bf16_bits_from_f32(np.float32(x)))})"  # the bits
    if dtypes.is_float(sc) and (math.isinf(x) or math.isnan(x)):
      inf, nan = self.inf_fmt[sc]
      return nan if math.isnan(x) else inf if x > 0 else f"(-{inf})"
    return super().render_const(x, dt)
  def render_cast(self, x: str, dt: DType, src_dt: DType) -> str:
    if dt.scalar() == dtypes.bfloat16: return f"tc_f32_to_bf16((float)({x}))"
    if src_dt.scalar() == dtypes.bfloat16: return f"(({self.render_dtype(dt)})tc_bf16_to_f32({x}))"
    if dt.scalar() == dtypes.bool: return f"(({x})!=0)"
    return super().render_cast(x, dt, src_dt)
  def render_bits(self, x: str, dt: DType, src_dt: DType) -> str:
    """Reinterpret the bits of x (src_dt) as dt, same size."""
    raise NotImplementedError
  def render_bitcast(self, x: str, dt: DType, src_dt: DType) -> str:
    if dt.itemsize != src_dt.itemsize: raise NotImplementedError(f"bitcast between {src_dt.name} and {dt.name}: sizes differ")
    return self.render_bits(x, dt, src_dt)

  # ---- vectors ------------------------------------------------------------------------------------
  vector_fmt = "{vt}{{{{{vals}}}}}"  # struct-of-array vectors: tc_float4{{a,b,c,d}}
  def render_vectorize(self, vals: list[str], dt: DType) -> str: return self.vector_fmt.format(vt=self.render_dtype(dt), vals=",".join(vals))
  def render_gep(self, x: str, i: int) -> str: return f"{x}.v[{i}]"
  def vector_def(self, dt: DType) -> str:
    align = min(dt.itemsize, 16)
    return f"struct {self.align_fmt.format(align)} {self.render_dtype(dt)} {{ {self.type_names[dt.scalar()]} v[{dt.count}]; }};"
  align_fmt = "__attribute__((aligned({})))"
  def space(self, buf_dt: DType) -> str: return ""  # address-space qualifier of a pointer cast (Metal: device/threadgroup)
  def render_load(self, buf: str, idx: str, dt: DType, buf_dt: DType, aligned: bool = False) -> str:
    if dt.count == 1: return f"{buf}[{idx}]"
    if aligned: return f"(*((const {self.space(buf_dt)}{self.render_dtype(dt)}*)({buf}+{idx})))"
    return self.render_vectorize([f"{buf}[({idx})+{i}]" for i in range(dt.count)], dt)
  def render_store(self, buf: str, idx: str, val: str, dt: DType, buf_dt: DType, aligned: bool = False) -> str:
    if dt.count == 1: return f"{buf}[{idx}] = {val};"
    if aligned: return f"*(({self.space(buf_dt)}{self.render_dtype(dt)}*)({buf}+{idx})) = {val};"
    return f"{{ {self.render_dtype(dt)} tc_v = {val}; " + " ".join(f"{buf}[({idx})+{i}] = {self.render_gep('tc_v', i)};" for i in range(dt.count)) + " }"

  # ---- threads ------------------------------------------------------------------------------------
  def render_special(self, u: UOp) -> str: return self.special_fmt[u.arg[3]].format(d="xyz"[u.arg[2]], t=self.render_dtype(u.dtype))
  @staticmethod
  def launch_bound(uops: list[UOp]) -> Optional[int]:
    """Threads per workgroup when the kernel fixes it (its local ids), for the launch-bounds attribute."""
    sizes = [u.arg[1] for u in uops if u.op is UOps.SPECIAL and u.arg[3] == "local"]
    if not sizes or not all(isinstance(s, int) for s in sizes): return None
    return functools.reduce(lambda a, b: a * b, sizes, 1)

  # ---- prelude ------------------------------------------------------------------------------------
  def prelude(self, uops: list[UOp]) -> list[str]:
    lines = self.header(uops)
    vecs = {u.dtype for u in uops if u.dtype.count > 1 and not isinstance(u.dtype, PtrDType)}
    vecs |= {unsigned_of(u.dtype) for u in self.wrapping_alus(uops) if u.dtype.count > 1}  # what vector arithmetic on data wraps in
    # one definition per rendered name (CUDA holds half values in float registers: half4 and float4 are one type)
    lines += list(dict.fromkeys(self.vector_def(v) for v in sorted(vecs, key=lambda d: (d.scalar().name, d.count))
                                if not any(self.render_dtype(w) == self.render_dtype(v) and (w.scalar().name, w.count) < (v.scalar().name, v.count) for w in vecs)))
    if any(u.op is UOps.CAST and (u.dtype.scalar() == dtypes.bfloat16 or any(s.dtype.scalar() == dtypes.bfloat16 for s in u.src)) for u in uops):
      u32, f32 = self.type_names[dtypes.uint32], dtypes.float32
      lines += [f"{self.helper_prefix}float tc_bf16_to_f32({self.type_names[dtypes.uint16]} x) {{ return {self.render_bits(f'(({u32})x << 16)', f32, dtypes.uint32)}; }}",
                f"{self.helper_prefix}{self.type_names[dtypes.uint16]} tc_f32_to_bf16(float f) {{ {u32} u = {self.render_bits('f', dtypes.uint32, f32)};",
                f"  if ((u & 0x7fffffffu) > 0x7f800000u) return ({self.type_names[dtypes.uint16]})((u >> 16) | 0x40u);  /* NaN stays quiet NaN */",
                f"  return ({self.type_names[dtypes.uint16]})((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); }}"]
    wmmas = [u for u in uops if u.op is UOps.WMMA]
    if wmmas: lines += self.wmma_defs(wmmas)
    return lines
  def header(self, uops: list[UOp]) -> list[str]: return []
  def wmma_defs(self, wmmas: list[UOp]) -> list[str]:
    """Definitions the WMMA UOps need (helper functions around the instruction): the tensor-core hook."""
    return []
