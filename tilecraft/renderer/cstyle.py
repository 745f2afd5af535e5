"""The C-family renderers' common walk. `CStyleLanguage` walks linearized UOps once and prints
statements (inlining single-use expressions at their own loop depth); each target overrides the few
spellings that differ: types, vector syntax, kernel signature, thread ids, barriers, math functions.
Signed int arithmetic that can overflow (on data, or provably leaving its type: renderer/analysis.py)
renders through unsigned types where the target's compiler doesn't wrap signed overflow.

The targets, a file each: C for the CPU (`renderer/c.py`), OpenCL C (`renderer/opencl.py`), and the
GPU dialects' shared base (`renderer/gpu_cstyle.py`) with CUDA, HIP and Metal (`cuda.py`, `hip.py`,
`metal.py`). Their classes are also reachable here, lazily (`from tilecraft.renderer.cstyle import
CRenderer` keeps working), so nothing here imports them.
"""
from __future__ import annotations
import math
from collections import Counter
from typing import Any, Optional
import numpy as np
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import DType, ImageDType, PtrDType, bf16_bits_from_f32, dtypes
from tilecraft.ops import BinaryOps, TernaryOps, UnaryOps
from tilecraft.renderer import Renderer
from tilecraft.renderer.analysis import multiple_of, overflowing_int_alus

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
    # a negative constant after a minus is parenthesized: x-(-3.75f), -(-3.75f); "x--3.75f" lexes as a decrement
    if op in (BinaryOps.SUB, UnaryOps.NEG) and a[-1][:1] == "-": a = [*a[:-1], f"({a[-1]})"]
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
    they hold outside it must be thread-safe: index math, loads of buffers nobody writes, and the
    copy into a stack array (DEFINE_LOCAL: private to each thread, so each thread fills its own, as
    a PACK of a BLOCKed reduce's panel does once per block). None: a plain parallel loop (a new team
    each time it runs)."""
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
      elif inside and not (u.op in (UOps.STORE, UOps.LOAD) and u.src[0].op is UOps.DEFINE_LOCAL) and u.op is not UOps.BARRIER and \
          (u.op not in (UOps.RANGE, UOps.ENDRANGE, UOps.CONST, UOps.ALU, UOps.CAST, UOps.BITCAST, UOps.GEP, UOps.VECTORIZE, UOps.LOAD) or
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
      elif op is UOps.PREFETCH: emit((f"if ({r[src[2]]}) " if len(src) > 2 else "") + f"__builtin_prefetch({r[src[0]]}+{r[src[1]]});")
      elif op is UOps.STORE:
        at = self.address(src[0], src[1], r)
        if len(src) > 3 and src[3].dtype.count > 1: emit(self.render_masked_store(*at, r[src[3]], r[src[2]], src[2].dtype))
        else:
          if u in streams: line = self.render_stream_store(*at, r[src[2]], src[2].dtype)
          else: line = self.render_store(*at, r[src[2]], src[2].dtype, src[0].dtype, multiple_of(src[1], src[2].dtype.count))
          emit(f"if ({r[src[3]]}) {line}" if len(src) > 3 else line)
      elif op is UOps.ALU:
        if u in wrapping: expr = self.render_wrapping_alu(u.arg, [r[s] for s in src], dt)
        # a vector WHERE on one condition of the loop indices for every lane (BLOCK's last-block epilogue, a
        # concat's source) is C's ?:, which evaluates only the side it picks: a costly epilogue inlined
        # there runs in the last block only. (A condition from loaded data stays a blend: a branch on it
        # could be mispredicted.)
        elif u.arg is TernaryOps.WHERE and dt.count > 1 and (c := _splat_bool(src[0])) is not None and \
             not any(x.op is UOps.LOAD for x in c.toposort()):
          expr = f"({r[c]}?{r[src[1]]}:{r[src[2]]})"
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

def _splat_bool(u: UOp) -> Optional[UOp]:
  """s where bool vector `u` is splat(s) (every lane the same scalar bool), else None."""
  return u.src[0] if u.op is UOps.VECTORIZE and u.src[0].dtype == dtypes.bool and all(x is u.src[0] for x in u.src) else None

def _split_splat(gate: UOp) -> tuple[Optional[UOp], UOp]:
  """A bool-vector gate `splat(s) & m` as (s, m); (None, gate) for any other gate."""
  if gate.op is UOps.ALU and gate.arg is BinaryOps.AND and len(gate.src) == 2:
    for a, b in (gate.src, gate.src[::-1]):
      if (s := _splat_bool(a)) is not None: return s, b
  return None, gate

def unsigned_of(dt: DType) -> DType:
  """The unsigned int type (vector) of int32/int64 dtype dt's width."""
  u = dtypes.uint32 if dt.scalar() == dtypes.int32 else dtypes.uint64
  return u.vec(dt.count) if dt.count > 1 else u

# the targets that subclass CStyleLanguage, by the module that defines each
_TARGETS = {"CRenderer": "c", "OpenCLRenderer": "opencl", "GPUCStyleLanguage": "gpu_cstyle", "CUDARenderer": "cuda", "HIPRenderer": "hip",
            "MetalRenderer": "metal"}

def __getattr__(name: str) -> Any:
  """The targets live in a file each (see the module docstring) and import this one; `cstyle.CRenderer`,
  `cstyle.CUDARenderer` etc. still resolve, lazily."""
  if (mod := _TARGETS.get(name)) is None: raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  import importlib
  return getattr(importlib.import_module(f"tilecraft.renderer.{mod}"), name)
