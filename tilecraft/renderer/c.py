"""C for the CPU device (`CRenderer`): gcc/clang vector extensions for vector lanes, OpenMP on the
outer loop (a plain parallel loop, or one parallel region around a blocked reduce), masked vector
loads and stores through AVX/AVX-512 helpers with a lane-by-lane fallback, vector exp2/log2
(`c_vector_math.py`), and streaming stores for large outputs (`analysis.streamable_stores`). Built
with -fwrapv (runtime/cpu.py), so signed arithmetic stays plain C.
"""
from __future__ import annotations
from typing import Any
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import DType, ImageDType, PtrDType, dtypes
from tilecraft.helpers import getenv
from tilecraft.host import cpu_target
from tilecraft.ops import BinaryOps, TernaryOps, UnaryOps
from tilecraft.renderer.analysis import STREAM_MIN_BYTES, streamable_stores
from tilecraft.renderer.c_vector_math import vector_exp2, vector_log2
from tilecraft.renderer.cstyle import _C_BINARY, C_TYPE_NAMES, CStyleLanguage

def _isa_dispatch(head: list[str], kinds: list[tuple[str, str]], fallback: str) -> list[str]:
  """A helper function's body: the first (preprocessor condition, body) of kinds the compiler's ISA
  macros satisfy, else the portable fallback; then the closing brace."""
  out = list(head)
  for i, (cond, body) in enumerate(kinds): out += [f"#{'if' if i == 0 else 'elif'} {cond}", "  " + body]
  if kinds: out.append("#else")
  out.append(fallback)
  if kinds: out.append("#endif")
  return out + ["}"]

class CRenderer(CStyleLanguage):
  """C for the CPU device: gcc/clang vector extensions for vector lanes, OpenMP on the outer loop."""
  device = "CPU"
  has_local = False
  has_shared = False
  global_max = None
  local_max = None
  supports_float4 = True
  parallel_pragma = "#pragma omp parallel for"
  stack_arrays = True
  wraps_signed = True  # built with -fwrapv (runtime/cpu.py)
  type_names = C_TYPE_NAMES
  vector_dtypes = frozenset({dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64})
  # (RECIP: 1/v, an IEEE division of each lane (no -ffast-math), one vdivps instead of a scalar one per lane)
  vector_alu = frozenset({BinaryOps.ADD, BinaryOps.SUB, BinaryOps.MUL, UnaryOps.NEG, UnaryOps.RECIP, UnaryOps.EXP2, UnaryOps.LOG2, BinaryOps.MAX,
                          BinaryOps.CMPLT, BinaryOps.CMPNE, TernaryOps.WHERE})
  has_prefetch = True  # PREFETCH uops: __builtin_prefetch (a hint: never faults, whatever the address)
  vector_masks = True  # bool vectors are int vectors (int16 for 16 lanes): a vector compare's -1/0, or 0/1 lanes
  offset_addressing = True  # (data+x)[c] for data[x+c]: see address()
  masked_loads = True  # tc_mload_*: AVX/AVX2/AVX-512 masked loads, lane by lane elsewhere (_masked_load_helper)
  # a CPU kernel's DEFINE_LOCAL/BARRIER: TC use 3's staging of a warp held by one thread, and PACK's
  # arrays (codegen/pack.py); one thread writes and reads each, so program order is the barrier
  def render_local(self, name: str, dt: DType, size: int) -> str: return f"{self.render_dtype(dt)} {name}[{size}] __attribute__((aligned(64)));"
  def render_barrier(self) -> str: return "/* barrier: the writes above were all made by this thread, in order */"
  def render_alu(self, op: Any, srcs: list[str], dt: DType, src_dt: DType) -> str:
    if op is BinaryOps.MAX and dt.count > 1: return f"tc_max_{self.render_dtype(dt)}({srcs[0]}, {srcs[1]})"
    if op in (BinaryOps.CMPLT, BinaryOps.CMPNE) and dt.count > 1:
      cmp = f"({srcs[0]}{_C_BINARY[op]}{srcs[1]})"  # lanes of the operands' width: convert to the bool vector's int lanes
      return cmp if src_dt.scalar().itemsize == 4 else f"__builtin_convertvector({cmp}, {self.render_dtype(dt)})"
    if op is TernaryOps.WHERE and dt.count > 1: return f"tc_where_{self.render_dtype(dt)}({srcs[0]}, {srcs[1]}, {srcs[2]})"
    if op in (BinaryOps.AND, BinaryOps.OR) and dt.count > 1: return f"({srcs[0]}{_C_BINARY[op]}{srcs[1]})"  # bool vectors too: lanes 0/1/-1
    if op is UnaryOps.NEG and dt.count > 1 and dt.scalar() == dtypes.bool: return f"({srcs[0]}==0)"  # (~ would make a 1 lane -2: still true)
    return super().render_alu(op, srcs, dt, src_dt)
  def render_masked_load(self, buf: str, idx: str, mask: str, dt: DType, alt: UOp) -> str:
    if not (alt.op is UOps.VECTORIZE and all(s.op is UOps.CONST and s.arg == 0 for s in alt.src)):
      raise NotImplementedError("CRenderer: a masked load's masked-off lanes read 0")
    return f"tc_mload_{self.render_dtype(dt)}({buf}+{idx}, {mask})"
  def render_masked_store(self, buf: str, idx: str, mask: str, val: str, dt: DType) -> str: return f"tc_mstore_{self.render_dtype(dt)}({buf}+{idx}, {mask}, {val});"
  def _masked_store_helper(self, dt: DType) -> list[str]:
    """tc_mstore_<vt>(p, m, v): p[i] = v[i] where m[i] != 0; a masked-off lane is never written (nor
    its page touched): AVX-512 masked stores or AVX vmaskmov like tc_mload_*, else lane by lane."""
    vt, n, st, esz = self.render_dtype(dt), dt.count, self.type_names[dt.scalar()], dt.scalar().itemsize
    reg = {16: ("_mm", "__m128i", "__m128"), 32: ("_mm256", "__m256i", "__m256"), 64: ("_mm512", "__m512i", "__m512")}
    out = [f"static inline void tc_mstore_{vt}({st}* p, int{n} m, {vt} v) {{", "  (void)p; (void)m; (void)v;"]
    kinds: list[tuple[str, str]] = []
    if esz == 4 and dt.itemsize in reg:
      pre, ri, rf = reg[dt.itemsize]
      kinds.append(("defined(__AVX512F__)" + (" && defined(__AVX512VL__)" if dt.itemsize < 64 else ""),
                    f"{pre}_mask_storeu_ps((void*)p, {pre}_test_epi32_mask(({ri})m, ({ri})m), ({rf})v); return;"))
      if dt.itemsize < 64: kinds.append(("defined(__AVX__)", f"{pre}_maskstore_ps((float*)p, ({ri})(m != 0), ({rf})v); return;"))
    if esz == 8 and dt.itemsize in (32, 64):
      pre, rf, mpre, mri = reg[dt.itemsize][0], reg[dt.itemsize][2] + "d", *reg[dt.itemsize // 2][:2]
      kinds.append(("defined(__AVX512F__) && defined(__AVX512VL__)", f"{pre}_mask_storeu_pd((void*)p, {mpre}_test_epi32_mask(({mri})m, ({mri})m), ({rf})v); return;"))
      if dt.itemsize == 32: kinds.append(("defined(__AVX2__)", f"_mm256_maskstore_pd((double*)p, _mm256_cvtepi32_epi64((__m128i)(m != 0)), ({rf})v); return;"))
    return _isa_dispatch(out, kinds, f"  for (int i = 0; i < {n}; i++) if (m[i]) p[i] = v[i];")
  def _max_helper(self, dt: DType, vt: str, it: str) -> list[str]:
    """tc_max_<vt>(a, b): a where a > b, else b; for floats NaN-propagating like numpy (a NaN a or b gives NaN). The
    portable form is two compares, an OR and a bit blend; where the vector is one x86 register (the compiler's macros
    for CPU_ARCH pick) it is the ISA's max (b where either is NaN, or on a tie: the same lanes as the portable form)
    with a's NaN lanes blended back: 3 instructions, not 4-5 (SqueezeNet's and ResNet-50's 3x3 s2 max-pools 1.4-1.6x faster,
    AVX-512)."""
    if not dtypes.is_float(dt): return [f"static inline {vt} tc_max_{vt}({vt} a, {vt} b) {{ return tc_sel_{vt}(({it})(a > b), a, b); }}"]
    portable = f"return tc_sel_{vt}((({it})(a != a) | ({it})(a > b)), a, b);"
    sfx = {dtypes.float32: "ps", dtypes.float64: "pd"}.get(dt.scalar())
    kinds: list[tuple[str, str]] = []
    if sfx is not None and dt.itemsize in (16, 32, 64):
      pre, rt = {16: ("_mm", "__m128"), 32: ("_mm256", "__m256"), 64: ("_mm512", "__m512")}[dt.itemsize]
      rt += "d" if sfx == "pd" else ""
      mx = f"{pre}_max_{sfx}(({rt})a, ({rt})b)"
      if dt.itemsize == 64: kinds.append(("defined(__AVX512F__)", f"return ({vt}){pre}_mask_mov_{sfx}({mx}, {pre}_cmp_{sfx}_mask(({rt})a, ({rt})a, _CMP_UNORD_Q), ({rt})a);"))
      elif dt.itemsize == 32: kinds.append(("defined(__AVX__)", f"return ({vt}){pre}_blendv_{sfx}({mx}, ({rt})a, {pre}_cmp_{sfx}(({rt})a, ({rt})a, _CMP_UNORD_Q));"))
      else: kinds.append(("defined(__SSE4_1__)", f"return ({vt}){pre}_blendv_{sfx}({mx}, ({rt})a, {pre}_cmpunord_{sfx}(({rt})a, ({rt})a));"))
    return _isa_dispatch([f"static inline {vt} tc_max_{vt}({vt} a, {vt} b) {{  /* NaN-propagating */"], kinds, f"  {portable}")

  def _masked_load_helper(self, dt: DType) -> list[str]:
    """tc_mload_<vt>(p, m): lane i is p[i] where m[i] != 0, else 0; a masked-off lane is never read
    (it may lie outside the buffer). AVX-512 zero-masking loads or AVX vmaskmov where the vector is one
    register of that ISA (the compiler's macros for CPU_ARCH pick), else lane by lane."""
    vt, n, st, esz = self.render_dtype(dt), dt.count, self.type_names[dt.scalar()], dt.scalar().itemsize
    reg = {16: ("_mm", "__m128i"), 32: ("_mm256", "__m256i"), 64: ("_mm512", "__m512i")}
    out = [f"static inline {vt} tc_mload_{vt}(const {st}* p, int{n} m) {{", "  (void)p; (void)m;"]
    kinds: list[tuple[str, str]] = []
    if esz == 4 and dt.itemsize in reg:
      pre, ri = reg[dt.itemsize]
      kinds.append(("defined(__AVX512F__)" + (" && defined(__AVX512VL__)" if dt.itemsize < 64 else ""),
                    f"return ({vt}){pre}_maskz_loadu_ps({pre}_test_epi32_mask(({ri})m, ({ri})m), p);"))
      if dt.itemsize < 64: kinds.append(("defined(__AVX__)", f"return ({vt}){pre}_maskload_ps((const float*)p, ({ri})(m != 0));"))
    if esz == 8 and dt.itemsize in (32, 64):
      pre, mpre, mri = reg[dt.itemsize][0], *reg[dt.itemsize // 2]
      kinds.append(("defined(__AVX512F__) && defined(__AVX512VL__)", f"return ({vt}){pre}_maskz_loadu_pd({mpre}_test_epi32_mask(({mri})m, ({mri})m), p);"))
      if dt.itemsize == 32: kinds.append(("defined(__AVX2__)", f"return ({vt})_mm256_maskload_pd((const double*)p, _mm256_cvtepi32_epi64((__m128i)(m != 0)));"))
    return _isa_dispatch(out, kinds, f"  {vt} r = {{}}; for (int i = 0; i < {n}; i++) if (m[i]) r[i] = p[i]; return r;")
  # gcc 12's loop vectorizer miscompiles if-converted gated loads (`c ? p[i-55] : 0` turned into
  # vmaskmov loads): a padded row read the wrong elements at -O3 -march=haswell/znver3 (Debian 12's
  # gcc 12.2; clang, -O2 and AVX-512 targets were right). Our gated accesses are already explicit
  # (a branch per gate, vector lanes by masked-load helpers, whose lane-by-lane fallback is the same
  # shape), so a kernel with gated loads or stores is compiled without loop if-conversion; gcc still
  # vectorizes its loops' plain accesses, and every other kernel keeps the full -O3.
  GATED_ATTRIBUTE = '#if defined(__GNUC__) && !defined(__clang__)\n__attribute__((optimize("no-tree-loop-if-convert")))\n#endif\n'
  def function_prefix(self, uops: list[UOp]) -> str:
    gated = any((u.op is UOps.LOAD and len(u.src) >= 4 and u.src[2].dtype.scalar() == dtypes.bool) or (u.op is UOps.STORE and len(u.src) > 3) for u in uops)
    return (self.GATED_ATTRIBUTE if gated else "") + self.kernel_prefix
  @property
  def vector_width(self) -> int:
    """float32 lanes per SIMD register of the ISA the C compiler targets (`CPU_ARCH`, default native)."""
    return cpu_target().vector_width
  def render_dtype(self, dt: DType) -> str:
    if isinstance(dt, ImageDType): raise NotImplementedError("the CPU has no image types")
    if dt.count > 1 and not isinstance(dt, PtrDType):
      return {dtypes.int64: "longlong", dtypes.int32: "int", dtypes.bool: "int"}.get(dt.scalar(), dt.scalar().name) + str(dt.count)
    return super().render_dtype(dt)
  # ---- streaming stores ---------------------------------------------------------------------------
  # A kernel that writes an output much bigger than the caches (a+b over 16M floats) spends a third
  # of its memory traffic reading each output line in before overwriting it (write-allocate).
  # Non-temporal stores skip that read and the cache; they are weakly ordered, so each thread
  # fences them (sfence) before the parallel region's closing barrier. Used only for plain
  # vector stores of an x86 target to a buffer the kernel never reads, outside reduce loops, with an
  # index that is a multiple of the vector width; each store checks the address's alignment at run
  # time and falls back to a plain store (a buffer may start anywhere).
  # static schedule: the same iterations to the same thread each time (OpenMP guarantees it for
  # loops of equal trip count in one region), so a blocked reduce needs no barrier between blocks
  region_pragmas = ("#pragma omp parallel", "#pragma omp for schedule(static) nowait")
  # A plain parallel loop (a team per kernel, its iterations independent) is shared out dynamically,
  # in about PARALLEL_CHUNKS chunks: on a shared machine one core is often slower (another program,
  # a noisy neighbour), and a static split makes every kernel wait for that core's half, while
  # OpenBLAS-style fixed splits suffer the same. Matmul 1024 on AVX2, 2 threads, a busy machine:
  # 0.79x -> 0.92x of numpy, quiet: 0.97x -> 1.00x. Few chunks keep the shared counter's cost at a
  # few microseconds; loops of a symbolic length stay static.
  PARALLEL_CHUNKS = 64
  def parallel_schedule(self, start: UOp, end: UOp) -> str:
    if start.op is not UOps.CONST or end.op is not UOps.CONST or not isinstance(start.arg, int) or not isinstance(end.arg, int): return ""
    trips = end.arg - start.arg
    return f" schedule(dynamic, {-(-trips // self.PARALLEL_CHUNKS)})" if trips > 1 else ""
  store_fence = "_mm_sfence();"
  # bytes one kernel writes to a buffer from which its stores stream (a smaller output may be read
  # back from cache by the next kernel); `CPU_STREAM_MIN_BYTES` overrides it (0: whenever allowed)
  stream_min_bytes = STREAM_MIN_BYTES
  _STREAM_CHUNK = {"AVX-512": 64, "AVX2": 32, "AVX": 32, "SSE": 16}  # widest streaming store of the ISA, bytes
  _STREAM_OP = {16: ("_mm_stream_ps", "__m128"), 32: ("_mm256_stream_ps", "__m256"), 64: ("_mm512_stream_ps", "__m512")}
  def settings_key(self) -> tuple: return (cpu_target().arch, getenv("CPU_STREAM_MIN_BYTES", self.stream_min_bytes))
  def _stream_chunk(self, dt: DType) -> int:
    return min(dt.itemsize, self._STREAM_CHUNK.get(cpu_target().isa, 0))
  def streaming_stores(self, uops: list[UOp]) -> frozenset:
    if cpu_target().isa not in self._STREAM_CHUNK: return frozenset()
    return streamable_stores(uops, getenv("CPU_STREAM_MIN_BYTES", self.stream_min_bytes))
  def render_stream_store(self, buf: str, idx: str, val: str, dt: DType) -> str: return f"tc_stream_{self.render_dtype(dt)}({buf}+{idx}, {val});"
  def _stream_helper(self, dt: DType) -> list[str]:
    vt, chunk = self.render_dtype(dt), self._stream_chunk(dt)
    fn, ct = self._STREAM_OP[chunk]
    n, lanes = dt.itemsize // chunk, chunk // 4
    return [f"static inline void tc_stream_{vt}(void* p, {vt} v) {{  /* streaming where p is {chunk}-byte aligned, else a plain store */",
            f"  if ((unsigned long long)p % {chunk}) {{ *({vt}*)p = v; return; }}",
            f"  {ct} c[{n}]; __builtin_memcpy(c, &v, sizeof(v));",
            "  " + " ".join(f"{fn}((float*)p + {i * lanes}, c[{i}]);" for i in range(n)),
            "}"]

  def render_math(self, op: Any, x: str, dt: DType) -> str:
    if dt.count > 1 and op in (UnaryOps.EXP2, UnaryOps.LOG2): return f"tc_{'exp2' if op is UnaryOps.EXP2 else 'log2'}_{self.render_dtype(dt)}({x})"
    return super().render_math(op, x, dt)
  def prelude(self, uops: list[UOp]) -> list[str]:
    lines = ["#include <math.h>"]
    vecs = {u.dtype for u in uops if u.dtype.count > 1 and not isinstance(u.dtype, PtrDType)}
    exp2s = {u.dtype for u in uops if u.op is UOps.ALU and u.arg is UnaryOps.EXP2 and u.dtype.count > 1}
    log2s = {u.dtype for u in uops if u.op is UOps.ALU and u.arg is UnaryOps.LOG2 and u.dtype.count > 1}
    maxes = {u.dtype for u in uops if u.op is UOps.ALU and u.arg is BinaryOps.MAX and u.dtype.count > 1}
    wheres = {u.dtype for u in uops if u.op is UOps.ALU and u.arg is TernaryOps.WHERE and u.dtype.count > 1}
    masks = {d: dtypes.int32.vec(d.count) if d.scalar().itemsize == 4 else dtypes.int64.vec(d.count) for d in exp2s | log2s | maxes | wheres}
    vecs |= set(masks.values()) | {dtypes.int32.vec(d.count) for d in wheres}
    vecs = {dtypes.int32.vec(v.count) if v.scalar() == dtypes.bool else v for v in vecs}  # bool vectors are int vectors
    for v in sorted(vecs, key=lambda d: (d.scalar().name, d.count)):
      base = self.type_names[v.scalar()]
      # element alignment: vector loads and stores may be unaligned
      lines.append(f"typedef {base} {self.render_dtype(v)} __attribute__((vector_size({v.itemsize}), aligned({v.scalar().itemsize})));")
    if any(dtypes.is_float(d) for d in maxes): lines += ["#if defined(__SSE4_1__)", "#include <immintrin.h>", "#endif"]  # (_max_helper)
    # C has no vector ?:, so selects are bit blends with the all-ones/all-zeros lane masks of comparisons
    for d, m in sorted(masks.items(), key=lambda x: (x[0].scalar().name, x[0].count)):
      vt, it = self.render_dtype(d), self.render_dtype(m)
      lines.append(f"static inline {vt} tc_sel_{vt}({it} m, {vt} a, {vt} b) {{ return ({vt})((({it})a & m) | (({it})b & ~m)); }}")
      if d in maxes: lines += self._max_helper(d, vt, it)
      if d in wheres:  # a bool vector (any nonzero lane is true) as a full lane mask of vt's width
        lines.append(f"static inline {vt} tc_where_{vt}(int{d.count} c, {vt} a, {vt} b) {{ return tc_sel_{vt}(__builtin_convertvector(c != 0, {it}), a, b); }}")
    for d in sorted(exp2s, key=lambda d: d.count): lines += vector_exp2(self.render_dtype(d), self.render_dtype(masks[d]), d.scalar())
    for d in sorted(log2s, key=lambda d: d.count): lines += vector_log2(self.render_dtype(d), self.render_dtype(masks[d]), d.scalar())
    mloads = {u.dtype for u in uops if u.op is UOps.LOAD and len(u.src) >= 4 and u.src[2].dtype.count > 1}
    mstores = {u.src[2].dtype for u in uops if u.op is UOps.STORE and len(u.src) > 3 and u.src[3].dtype.count > 1}
    if mloads or mstores: lines += ["#if defined(__AVX__)", "#include <immintrin.h>", "#endif"]
    for d in sorted(mloads, key=lambda d: (d.scalar().name, d.count)): lines += self._masked_load_helper(d)
    for d in sorted(mstores, key=lambda d: (d.scalar().name, d.count)): lines += self._masked_store_helper(d)
    if (streams := {u.src[2].dtype for u in self.streaming_stores(uops)}):
      lines.insert(1, "#include <immintrin.h>")
      for d in sorted(streams, key=lambda d: (d.scalar().name, d.count)): lines += self._stream_helper(d)
    if any(u.dtype.scalar() == dtypes.bfloat16 or any(s.dtype.scalar() == dtypes.bfloat16 for s in u.src) for u in uops if u.op is UOps.CAST):
      lines += ["static inline float bf16_to_f32(unsigned short x) { union { unsigned int u; float f; } c = {.u = (unsigned int)x << 16}; return c.f; }",
                "static inline unsigned short f32_to_bf16(float f) { union { float f; unsigned int u; } c = {.f = f};",
                "  if ((c.u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((c.u >> 16) | 0x40u);",
                "  return (unsigned short)((c.u + 0x7fffu + ((c.u >> 16) & 1u)) >> 16); }"]
    return lines
  def render_cast(self, x: str, dt: DType, src_dt: DType) -> str:
    if dt.scalar() == dtypes.bfloat16: return f"f32_to_bf16((float)({x}))"
    if src_dt.scalar() == dtypes.bfloat16: return f"(({self.render_dtype(dt)})bf16_to_f32({x}))"
    if dt.scalar() == dtypes.bool: return f"(({x})!=0)"
    return super().render_cast(x, dt, src_dt)
