"""C-family renderers. `CStyleLanguage` walks linearized UOps once and prints statements; each
target (C for CPUs here; OpenCL, CUDA, Metal, HIP by subclassing) overrides the few spellings
that differ: types, vector syntax, kernel signature, thread ids, barriers, math functions.
"""
from __future__ import annotations
import functools, math
from collections import Counter
from typing import Any, Optional
import numpy as np
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import DType, ImageDType, PtrDType, bf16_bits_from_f32, dtypes
from tilecraft.helpers import getenv
from tilecraft.ops import BinaryOps, TernaryOps, UnaryOps
from tilecraft.host import cpu_target
from tilecraft.renderer import Renderer
from tilecraft.renderer.analysis import STREAM_MIN_BYTES, multiple_of, overflowing_int_alus, streamable_stores
from tilecraft.renderer.c_vector_math import vector_exp2, vector_log2

_NARROW_INTS = frozenset({dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16})

_C_BINARY = {BinaryOps.ADD: "+", BinaryOps.SUB: "-", BinaryOps.MUL: "*", BinaryOps.IDIV: "/", BinaryOps.MOD: "%",
             BinaryOps.CMPLT: "<", BinaryOps.CMPNE: "!=", BinaryOps.XOR: "^", BinaryOps.OR: "|", BinaryOps.AND: "&",
             BinaryOps.SHL: "<<", BinaryOps.SHR: ">>"}

# C's names for the scalar types (C99 with _Float16; bfloat16 is kept as its bits): the C renderer's,
# and the base of the CUDA and HIP names, which differ only where noted there
C_TYPE_NAMES = {dtypes.bool: "_Bool", dtypes.int8: "signed char", dtypes.uint8: "unsigned char", dtypes.int16: "short",
                dtypes.uint16: "unsigned short", dtypes.int32: "int", dtypes.uint32: "unsigned int", dtypes.int64: "long long",
                dtypes.uint64: "unsigned long long", dtypes.float16: "_Float16", dtypes.bfloat16: "unsigned short",
                dtypes.float32: "float", dtypes.float64: "double"}

# OpenCL C's names (also Metal's, which has no double)
CL_TYPE_NAMES = {dtypes.bool: "bool", dtypes.int8: "char", dtypes.uint8: "uchar", dtypes.int16: "short", dtypes.uint16: "ushort",
                 dtypes.int32: "int", dtypes.uint32: "uint", dtypes.int64: "long", dtypes.uint64: "ulong", dtypes.float16: "half",
                 dtypes.bfloat16: "ushort", dtypes.float32: "float", dtypes.float64: "double"}

class CStyleLanguage(Renderer):
  kernel_prefix: str = ""
  buffer_prefix: str = ""
  arg_int_type: str = "long long"
  int64_suffix: str = "ll"  # the literal suffix of a 64-bit int
  # Whether signed int overflow wraps in the target's compiler (the CPU's gcc/clang -fwrapv). Where
  # it doesn't (OpenCL C, CUDA, HIP, Metal: undefined behaviour), `wrapping_alus` names the signed
  # arithmetic on data that is rendered through unsigned types, which wrap by definition.
  wraps_signed: bool = False
  type_names: dict[DType, str] = {}
  float4_ctor: str = "({vt}){{{vals}}}"
  parallel_pragma: Optional[str] = None
  # (region pragma, loop pragma): a parallel region, and the parallel loop shared out inside it
  # without a barrier at its end, by a schedule that gives each thread the same iterations every
  # time the loop runs. Used when the parallel loop is inside serial loops (`parallel_region`), and
  # for streaming stores (`streaming_stores`), which each thread fences (`store_fence`) at the end
  region_pragmas: Optional[tuple[str, str]] = None
  store_fence: str = ""
  vector_dtypes: frozenset = frozenset()
  vector_alu: frozenset = frozenset()
  # vector compares give bool vectors, held as int lane vectors (nonzero = true; a lane read out is
  # normalized to 0/1), and WHERE selects lanes by them (the lowering keeps CMPLT/CMPNE/WHERE in
  # vectors where they are in vector_alu)
  vector_masks: bool = False

  # ---- spelling -----------------------------------------------------------------------------------
  def render_dtype(self, dt: DType) -> str:
    if isinstance(dt, PtrDType): return self.render_dtype(dt.base) + "*"
    if dt.count > 1: return self.type_names.get(dt.scalar(), dt.scalar().name).replace(" ", "") + str(dt.count)
    return self.type_names.get(dt, dt.name)

  def render_const(self, x: Any, dt: DType) -> str:
    dt = dt.scalar()
    if dt == dtypes.bfloat16: return f"(({self.render_dtype(dt)}){int(bf16_bits_from_f32(np.float32(x)))})"  # held as its bits
    if dtypes.is_float(dt):
      if math.isnan(x): v = "NAN"
      elif math.isinf(x): v = "INFINITY" if x > 0 else "-INFINITY"
      else: v = repr(float(x)) + ("f" if dt != dtypes.float64 else "")
      if v.endswith("f") and "e" not in v and "." not in v: v = v[:-1] + ".0f"
      return v if dt in (dtypes.float32, dtypes.float64) else f"(({self.render_dtype(dt)}){v})"
    if dt == dtypes.bool: return "1" if x else "0"
    if dt == dtypes.int64: return f"{int(x)}{self.int64_suffix}" if x != -2**63 else f"(-9223372036854775807{self.int64_suffix}-1)"
    if dt == dtypes.uint64: return f"{int(x)}u{self.int64_suffix}"
    if dt in (dtypes.uint32,): return f"{int(x)}u"
    if dt == dtypes.int32 and x == -2**31: return "(-2147483647-1)"
    return str(int(x)) if dt == dtypes.int32 else f"(({self.render_dtype(dt)}){int(x)})"

  def render_cast(self, x: str, dt: DType, src_dt: DType) -> str: return f"(({self.render_dtype(dt)})({x}))"
  def render_bitcast(self, x: str, dt: DType, src_dt: DType) -> str:
    return f"((union {{ {self.render_dtype(src_dt)} a; {self.render_dtype(dt)} b; }}){{.a = {x}}}).b"
  def render_vectorize(self, vals: list[str], dt: DType) -> str:
    return self.float4_ctor.format(vt=self.render_dtype(dt), vals=",".join(vals))

  def render_alu(self, op: Any, srcs: list[str], dt: DType, src_dt: DType) -> str:
    a = srcs
    if op is UnaryOps.NEG: return f"(!{a[0]})" if dt.scalar() == dtypes.bool else f"(-{a[0]})"
    if op is UnaryOps.RECIP: return f"(1/{a[0]})"
    if op in (UnaryOps.EXP2, UnaryOps.LOG2, UnaryOps.SIN, UnaryOps.SQRT): return self.render_math(op, a[0], dt)
    if op is BinaryOps.MAX:
      if dtypes.is_float(dt): return f"((({a[0]})!=({a[0]}))||({a[0]})>({a[1]})?({a[0]}):({a[1]}))"  # NaN-propagating like numpy
      return f"(({a[0]})>({a[1]})?({a[0]}):({a[1]}))"
    if op is TernaryOps.WHERE: return f"({a[0]}?{a[1]}:{a[2]})"
    if op is TernaryOps.MULACC: return f"(({a[0]}*{a[1]})+{a[2]})"
    if op is BinaryOps.MOD and dtypes.is_float(dt): return self.render_fmod(a[0], a[1], dt)
    sym = _C_BINARY[op]
    if dt.scalar() == dtypes.bool and op in (BinaryOps.AND, BinaryOps.OR): sym *= 2
    return f"({a[0]}{sym}{a[1]})"

  # ---- signed overflow ----------------------------------------------------------------------------
  # numpy wraps int32/int64 arithmetic; C-style kernel languages make signed overflow undefined, and
  # their compilers use that (PoCL folded (a+b)<a to b<0 and (a+1)>a to true, wrong for INT_MAX).
  # So signed add, sub, mul, neg, shl and int mulacc on loaded data -- and whatever is computed from
  # it, accumulators included -- run in the unsigned type of the same width (wraps by definition)
  # and convert back (two's complement on every target here). Index math (ids, loop counters,
  # constants) stays signed, so its nsw-based optimizations stay: the lowerer gives it a width it
  # can't overflow (int64 wherever a value can pass 2^31). Values computed from ids alone that can
  # still overflow (arange(n) * 2**30) are found by interval arithmetic (analysis.overflowing_int_alus).
  _WRAPPING_OPS = frozenset({BinaryOps.ADD, BinaryOps.SUB, BinaryOps.MUL, BinaryOps.SHL, UnaryOps.NEG, TernaryOps.MULACC})
  def wrapping_alus(self, uops: list[UOp]) -> frozenset:
    """The ALUs to render with wrapping arithmetic (see above): none where signed overflow wraps."""
    if self.wraps_signed: return frozenset()
    data: set[UOp] = set()
    out: set[UOp] = set()
    for u in uops:
      if u.op is UOps.LOAD or (u.op not in (UOps.STORE, UOps.DEFINE_ACC) and any(s in data for s in u.src)): data.add(u)
      if u.op is UOps.PHI and u.src[1] in data: data.add(u.src[0])  # the accumulator holds data from here on
      if u.op is UOps.ALU and u.arg in self._WRAPPING_OPS and u.dtype.scalar() in (dtypes.int32, dtypes.int64) and u in data: out.add(u)
    # and values computed without data that can still overflow (arange(n) * 2**30 in int32)
    return frozenset(out) | overflowing_int_alus(uops, self._WRAPPING_OPS)
  def render_as(self, x: str, dt: DType, src_dt: DType) -> str:
    """x (src_dt) as dt, an int type of the same width: the same bits (a C cast, modular on every target here)."""
    return f"(({self.render_dtype(dt)})({x}))"
  def render_wrapping_alu(self, op: Any, srcs: list[str], dt: DType) -> str:
    udt = unsigned_of(dt)
    a = [self.render_as(x, udt, dt) for x in srcs]
    if op is UnaryOps.NEG: e = f"({self.render_const(0, udt.scalar())}-{a[0]})"
    elif op is TernaryOps.MULACC: e = f"(({a[0]}*{a[1]})+{a[2]})"
    elif op is BinaryOps.SHL: e = f"({a[0]}<<({srcs[1]}))"
    else: e = f"({a[0]}{_C_BINARY[op]}{a[1]})"
    return self.render_as(e, dt, udt)

  def render_math(self, op: Any, x: str, dt: DType) -> str:
    fn = {UnaryOps.EXP2: "exp2", UnaryOps.LOG2: "log2", UnaryOps.SIN: "sin", UnaryOps.SQRT: "sqrt"}[op]
    if dt.scalar() == dtypes.float64: return f"{fn}({x})"
    if dt.scalar() == dtypes.float32: return f"{fn}f({x})"
    return f"(({self.render_dtype(dt)}){fn}f((float)({x})))"

  def render_fmod(self, a: str, b: str, dt: DType) -> str:
    """A float MOD: C's fmod, the exact remainder with the dividend's sign (the frontend's numpy % is built on it)."""
    if dt.scalar() == dtypes.float64: return f"fmod({a}, {b})"
    if dt.scalar() == dtypes.float32: return f"fmodf({a}, {b})"
    return f"(({self.render_dtype(dt)})fmodf((float)({a}), (float)({b})))"

  # a load's or store's (pointer, index) as rendered: the buffer and its index, unless offset_addressing
  offset_addressing = False
  def address(self, buf: UOp, idx: UOp, r: dict) -> tuple[str, str]:
    """With offset_addressing, an index `x + c` (c a constant) is written as the pointer `(buf+x)` and
    the index c: pointer arithmetic, which the compiler folds into one base + displacement address,
    where an int sum must wrap under -fwrapv and costs an add and a sign extension per access. The
    lowerer sizes index math so that x + c can't overflow, so both name the same element."""
    if self.offset_addressing and idx.op is UOps.ALU and idx.arg is BinaryOps.ADD and idx.src[1].op is UOps.CONST and idx.dtype.count == 1:
      return f"({r[buf]}+{r[idx.src[0]]})", r[idx.src[1]]
    return r[buf], r[idx]

  # `aligned`: a vector access whose index is a provable multiple of its width (see multiple_of)
  def render_load(self, buf: str, idx: str, dt: DType, buf_dt: DType, aligned: bool = False) -> str:
    if dt.count > 1: return f"(*(({self.render_dtype(dt)}*)({buf}+{idx})))"
    return f"{buf}[{idx}]"
  def render_store(self, buf: str, idx: str, val: str, dt: DType, buf_dt: DType, aligned: bool = False) -> str:
    if dt.count > 1: return f"*(({self.render_dtype(dt)}*)({buf}+{idx})) = {val};"
    return f"{buf}[{idx}] = {val};"

  def render_masked_load(self, buf: str, idx: str, mask: str, dt: DType, alt: UOp) -> str:
    """A vector load gated per lane by the bool vector `mask` (masked_loads targets; alt is 0)."""
    raise NotImplementedError(f"{type(self).__name__} has no masked vector loads")

  def render_masked_store(self, buf: str, idx: str, mask: str, val: str, dt: DType) -> str:
    """A vector store gated per lane by the bool vector `mask` (masked_loads targets)."""
    raise NotImplementedError(f"{type(self).__name__} has no masked vector stores")

  def render_gep(self, x: str, i: int) -> str: return f"{x}[{i}]"
  def render_special(self, u: UOp) -> str: raise NotImplementedError(f"{type(self).__name__} has no thread ids")
  def render_barrier(self) -> str: raise NotImplementedError(f"{type(self).__name__} has no barriers")
  def render_local(self, name: str, dt: DType, size: int) -> str: raise NotImplementedError(f"{type(self).__name__} has no local memory")
  def render_wmma(self, u: UOp, srcs: list[str]) -> str:
    """The hook for a tensor-core UOp (arg: the TensorCore); targets with tensor cores override it."""
    raise NotImplementedError(f"{type(self).__name__} has no tensor cores (WMMA)")

  def render_kernel(self, name: str, body: list[str], args: list[tuple[str, DType, bool]], uops: list[UOp], prelude: list[str]) -> str:
    params = []
    for n, dt, mutable in args:
      if isinstance(dt, PtrDType): params.append(f"{self.buffer_prefix}{'' if mutable else 'const '}{self.render_dtype(dt)} restrict {n}")
      elif isinstance(dt, ImageDType): params.append(self.render_image_param(n, dt, mutable))
      else: params.append(f"{self.arg_int_type} {n}")
    return "\n".join(prelude + [f"{self.function_prefix(uops)}void {name}({', '.join(params)}) {{"] + body + ["}"]) + "\n"

  def function_prefix(self, uops: list[UOp]) -> str:
    """What precedes the kernel function's return type (qualifiers, attributes)."""
    return self.kernel_prefix

  def prelude(self, uops: list[UOp]) -> list[str]: return []
  def parallel_schedule(self, start: UOp, end: UOp) -> str:
    """The schedule clause of a plain parallel loop (parallel_pragma) from start to end: none here."""
    return ""
  def parallel_region(self, uops: list[UOp], streams: frozenset) -> Optional[tuple[UOp, UOp]]:
    """(the RANGE the parallel region opens at, the parallel RANGE), when the kernel runs one region
    (region_pragmas): the parallel loop nested in serial loops (a BLOCKed reduce with one output
    loop), or streaming stores. Every thread runs the serial loops around the parallel one, so what
    they hold outside it must be thread-safe: index math and loads of buffers nobody writes. None:
    a plain parallel loop (a new team each time it runs)."""
    if self.region_pragmas is None: return None
    stack: list[UOp] = []
    opener, inner = None, None
    for u in uops:
      if u.op is UOps.RANGE:
        if u.arg[0] == "parallel": opener, inner = (stack[0] if stack else u), u
        stack.append(u)
      elif u.op is UOps.ENDRANGE: stack.pop()
      if inner is not None: break
    if inner is None or opener is None or (opener is inner and not streams): return None
    stored = {u.src[0] for u in uops if u.op is UOps.STORE}
    inside = False  # in the region's loops but outside the parallel loop: run by every thread
    for u in uops:
      if u is inner: inside = False
      elif u is opener: inside = True
      elif u.op is UOps.ENDRANGE and u.src[0] is opener: break
      elif u.op is UOps.ENDRANGE and u.src[0] is inner: inside = True
      elif inside and (u.op not in (UOps.RANGE, UOps.ENDRANGE, UOps.CONST, UOps.ALU, UOps.CAST, UOps.BITCAST, UOps.GEP, UOps.VECTORIZE, UOps.LOAD) or
                       (u.op is UOps.LOAD and u.src[0] in stored)): return None
    return opener, inner
  def streaming_stores(self, uops: list[UOp]) -> frozenset:
    """The STOREs to render as streaming (non-temporal) stores, which bypass the caches: none by default."""
    return frozenset()
  def render_stream_store(self, buf: str, idx: str, val: str, dt: DType) -> str:
    raise NotImplementedError(f"{type(self).__name__} has no streaming stores")
  def render_image_param(self, name: str, dt: ImageDType, mutable: bool) -> str: raise NotImplementedError(f"{type(self).__name__} has no image types")

  # ---- the walk -----------------------------------------------------------------------------------
  def render(self, name: str, uops: list[UOp]) -> str:
    r: dict[UOp, str] = {}
    args: list[tuple[str, DType, bool]] = []
    stored = {u.src[0] for u in uops if u.op is UOps.STORE}
    uses = Counter(s for u in uops for s in u.src)
    # depth of each uop, so single-use expressions are inlined only within their own loop level
    depth_of: dict[UOp, int] = {}
    d = 0
    for u in uops:
      if u.op is UOps.ENDRANGE: d -= 1
      depth_of[u] = d
      if u.op is UOps.RANGE: d += 1
    inline_at: dict[UOp, int] = {}
    for u in uops:
      for s in u.src: inline_at.setdefault(s, depth_of[u])
    body: list[str] = []
    depth = 1
    streams = self.streaming_stores(uops)
    region = self.parallel_region(uops, streams)
    # each thread must fence its own streaming stores: only where the kernel runs one region, or no threads
    if region is None and any(u.op is UOps.RANGE and u.arg[0] == "parallel" for u in uops): streams = frozenset()
    wrapping = self.wrapping_alus(uops)
    counts: Counter = Counter()
    arrays: list[str] = []  # DEFINE_LOCALs so far
    def fresh(prefix: str) -> str:
      counts[prefix] += 1
      return f"{prefix}{counts[prefix] - 1}"
    def emit(line: str) -> None: body.append("  " * depth + line)
    def define(u: UOp, expr: str, prefix: str) -> None:
      if uses[u] == 1 and inline_at.get(u) == depth_of[u] and u.op in (UOps.ALU, UOps.CAST, UOps.GEP, UOps.VECTORIZE, UOps.BITCAST) \
          and not (u.op is UOps.ALU and len(expr) > 200):
        r[u] = expr
      else:
        n = fresh(prefix)
        emit(f"{self.render_dtype(u.dtype)} {n} = {expr};")
        r[u] = n
    for u in uops:
      op, dt, src = u.op, u.dtype, u.src
      if op is UOps.DEFINE_GLOBAL:
        r[u] = f"data{u.arg}"
        args.append((r[u], dt, u in stored))
      elif op is UOps.DEFINE_VAR:
        r[u] = u.arg.expr
        args.append((r[u], dt, False))
      elif op is UOps.DEFINE_LOCAL:
        r[u] = u.arg[0]
        arrays.append(u.arg[0])
        emit(self.render_local(u.arg[0], dt.base if isinstance(dt, PtrDType) else dt, u.arg[1]))
      elif op is UOps.CONST: r[u] = self.render_const(u.arg, dt)
      elif op is UOps.SPECIAL:
        r[u] = u.arg[0]
        emit(f"{self.render_dtype(dt)} {u.arg[0]} = {self.render_special(u)};")
      elif op is UOps.RANGE:
        n = fresh("ridx" if u.arg[0] == "reduce" else "gidx")
        r[u] = n
        private = f" private({', '.join(arrays)})" if arrays else ""  # arrays declared outside the threads are per-thread
        if region is not None and u is region[0]:
          assert self.region_pragmas is not None
          body.append(self.region_pragmas[0] + private)
          emit("{")
          depth += 1
        if region is not None and u is region[1]: body.append(self.region_pragmas[1])  # type: ignore[index]
        elif u.arg[0] == "parallel" and self.parallel_pragma: body.append(self.parallel_pragma + private + self.parallel_schedule(src[0], src[1]))
        emit(f"for ({self.render_dtype(dt)} {n} = {r[src[0]]}; {n} < {r[src[1]]}; {n}++) {{")
        depth += 1
      elif op is UOps.ENDRANGE:
        depth -= 1
        emit("}")
        if region is not None and src[0] is region[0]:
          if streams: emit(self.store_fence)
          depth -= 1
          emit("}")
      elif op is UOps.IF:
        emit(f"if ({r[src[0]]}) {{")
        depth += 1
      elif op is UOps.ENDIF:
        depth -= 1
        emit("}")
      elif op is UOps.BARRIER: emit(self.render_barrier())
      elif op is UOps.DEFINE_ACC:
        n = fresh("acc")
        emit(f"{self.render_dtype(dt)} {n} = {r[src[0]]};")
        r[u] = n
      elif op is UOps.PHI:
        emit(f"{r[src[0]]} = {r[src[1]]};")
        r[u] = r[src[0]]
      elif op is UOps.ACCREAD: r[u] = r[src[0]]
      elif op is UOps.LOAD:
        at = self.address(src[0], src[1], r)
        if len(src) >= 4 and src[2].dtype.count > 1:
          # a lane-free part of the gate (a conv's row mask) is a branch around the load: the lanes' mask
          # (the same in every iteration of the loops inside the one that sets it) stays loop-invariant
          free, lanes = _split_splat(src[2])
          val = self.render_masked_load(*at, r[lanes], dt, src[3])
          if free is not None: val = f"({r[free]}?{val}:{r[src[3]]})"
        else: val = self.render_load(*at, dt, src[0].dtype, multiple_of(src[1], dt.count))
        if len(src) >= 4 and src[2].dtype == dtypes.bool: val = f"({r[src[2]]}?{val}:{r[src[3]]})"
        define(u, val, "val")
      elif op is UOps.PREFETCH: emit(f"__builtin_prefetch({r[src[0]]}+{r[src[1]]});")
      elif op is UOps.STORE:
        at = self.address(src[0], src[1], r)
        if len(src) > 3 and src[3].dtype.count > 1: emit(self.render_masked_store(*at, r[src[3]], r[src[2]], src[2].dtype))
        else:
          if u in streams: line = self.render_stream_store(*at, r[src[2]], src[2].dtype)
          else: line = self.render_store(*at, r[src[2]], src[2].dtype, src[0].dtype, multiple_of(src[1], src[2].dtype.count))
          emit(f"if ({r[src[3]]}) {line}" if len(src) > 3 else line)
      elif op is UOps.ALU:
        if u in wrapping: expr = self.render_wrapping_alu(u.arg, [r[s] for s in src], dt)
        else: expr = self.render_alu(u.arg, [r[s] for s in src], dt, src[0].dtype)
        # C computes narrow ints in int: wrap each result back to its type, as numpy does
        if dt.count == 1 and dt in _NARROW_INTS and u.arg not in (BinaryOps.CMPLT, BinaryOps.CMPNE): expr = f"(({self.render_dtype(dt)}){expr})"
        define(u, expr, "alu")
      elif op is UOps.CAST: define(u, self.render_cast(r[src[0]], dt, src[0].dtype), "cast")
      elif op is UOps.BITCAST: define(u, self.render_bitcast(r[src[0]], dt, src[0].dtype), "cast")
      elif op is UOps.VECTORIZE: define(u, self.render_vectorize([r[s] for s in src], dt), "vec")
      elif op is UOps.GEP:
        g = self.render_gep(r[src[0]], u.arg)
        define(u, f"({g}!=0)" if dt == dtypes.bool and self.vector_masks else g, "gep")
      elif op is UOps.WMMA: define(u, self.render_wmma(u, [r[s] for s in src]), "wmma")
      elif op in (UOps.SINK,): pass
      else: raise NotImplementedError(f"{type(self).__name__} can't render {op}")
    if streams: emit(self.store_fence)  # this thread's own streaming stores (the serial case); threads fenced theirs above
    # the signature: buffers by index, then symbolic values by name (the order CompiledRunner passes)
    order = {r[u]: (0, u.arg, "") if u.op is UOps.DEFINE_GLOBAL else (1, 0, u.arg.expr) for u in uops if u.op in (UOps.DEFINE_GLOBAL, UOps.DEFINE_VAR)}
    args.sort(key=lambda a: order[a[0]])
    return self.render_kernel(name, body, args, uops, self.prelude(uops))

def _split_splat(gate: UOp) -> tuple[Optional[UOp], UOp]:
  """A bool-vector gate `splat(s) & m` as (s, m); (None, gate) for any other gate."""
  if gate.op is UOps.ALU and gate.arg is BinaryOps.AND and len(gate.src) == 2:
    for a, b in (gate.src, gate.src[::-1]):
      if a.op is UOps.VECTORIZE and a.src[0].dtype == dtypes.bool and all(x is a.src[0] for x in a.src): return a.src[0], b
  return None, gate

def unsigned_of(dt: DType) -> DType:
  """The unsigned int type (vector) of int32/int64 dtype dt's width."""
  u = dtypes.uint32 if dt.scalar() == dtypes.int32 else dtypes.uint64
  return u.vec(dt.count) if dt.count > 1 else u

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
  vector_alu = frozenset({BinaryOps.ADD, BinaryOps.SUB, BinaryOps.MUL, UnaryOps.NEG, UnaryOps.EXP2, UnaryOps.LOG2, BinaryOps.MAX,
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
    # C has no vector ?:, so selects are bit blends with the all-ones/all-zeros lane masks of comparisons
    for d, m in sorted(masks.items(), key=lambda x: (x[0].scalar().name, x[0].count)):
      vt, it = self.render_dtype(d), self.render_dtype(m)
      lines.append(f"static inline {vt} tc_sel_{vt}({it} m, {vt} a, {vt} b) {{ return ({vt})((({it})a & m) | (({it})b & ~m)); }}")
      if d in maxes:
        keep_a = f"(({it})(a != a) | ({it})(a > b))" if dtypes.is_float(d) else f"({it})(a > b)"
        lines.append(f"static inline {vt} tc_max_{vt}({vt} a, {vt} b) {{ return tc_sel_{vt}({keep_a}, a, b); }}  /* NaN-propagating */")
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

_GPU_TARGETS = {"CUDARenderer": "cuda", "HIPRenderer": "hip", "MetalRenderer": "metal"}

def __getattr__(name: str) -> Any:
  """The GPU targets live in a file each (renderer/cuda.py, hip.py, metal.py) and import this one;
  `cstyle.CUDARenderer` etc. still resolve, lazily."""
  if (mod := _GPU_TARGETS.get(name)) is None: raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  import importlib
  return getattr(importlib.import_module(f"tilecraft.renderer.{mod}"), name)
