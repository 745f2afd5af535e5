"""LLVM IR for the LLVM device, from the same linearized UOps the C renderer prints.

Semantics follow the C path (tilecraft.runtime.cpu: gcc -O3 -ffp-contract=fast -fwrapv
-fno-math-errno, no -ffast-math): float adds and multiplies carry only the `contract` flag (so
a*b+c may become an FMA, as gcc does), integer arithmetic wraps (no nsw/nuw), division and modulo
are the C ones (the lowerer already turns them into floor semantics with x//0 == 0), gated loads
branch around the load exactly like C's `g ? buf[i] : alt`, and float->int casts go through the
same 32/64-bit conversions gcc uses (frozen, so an out-of-range value is a value, not poison).

Vectors are LLVM vector types (<8 x float>); exp2 on a float32 vector is the same software
polynomial the C renderer uses (scalar exp2/log2/sin/sqrt are the llvm intrinsics, i.e. libm).

Loops are phi-counted; accumulators live in allocas that the optimizer promotes to registers.
The kernel takes two trailing i32 arguments (chunk, chunks): the outermost "parallel" loop runs
only its chunk-th share of the range, so the runtime can run a kernel on every core by calling it
once per chunk from a thread pool. `@tc_parallel` (1 or 0) tells the runtime whether to.
"""
from __future__ import annotations
import platform, struct
from typing import Any
import numpy as np
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import DType, ImageDType, PtrDType, bf16_bits_from_f32, dtypes
from tilecraft.ops import BinaryOps, TernaryOps, UnaryOps
from tilecraft.renderer import Renderer
from tilecraft.renderer.c_vector_math import EXP2_POLY
from tilecraft.helpers import getenv
from tilecraft.host import CPUTarget, cpu_target, host_vector_width
from tilecraft.renderer.analysis import STREAM_MIN_BYTES, streamable_stores

_SCALAR = {dtypes.bool: "i1", dtypes.int8: "i8", dtypes.uint8: "i8", dtypes.int16: "i16", dtypes.uint16: "i16", dtypes.int32: "i32",
           dtypes.uint32: "i32", dtypes.int64: "i64", dtypes.uint64: "i64", dtypes.float16: "half", dtypes.bfloat16: "i16",
           dtypes.float32: "float", dtypes.float64: "double"}
_MATH = {UnaryOps.EXP2: "exp2", UnaryOps.LOG2: "log2", UnaryOps.SIN: "sin", UnaryOps.SQRT: "sqrt"}
_FLAGS = " contract"  # the only fast-math freedom gcc is given (-ffp-contract=fast)

def ltype(dt: DType) -> str:
  """The LLVM register type of a dtype (bool is i1; bfloat16 is its i16 bits)."""
  if isinstance(dt, ImageDType): raise NotImplementedError("LLVM has no image types")
  if isinstance(dt, PtrDType): return "ptr"
  if dt == dtypes.void: return "void"
  s = _SCALAR[dt.scalar()]
  return f"<{dt.count} x {s}>" if dt.count > 1 else s

def vdt(scalar: DType, n: int) -> DType:
  """n lanes of a scalar dtype (the scalar itself when n == 1)."""
  return scalar.vec(n) if n > 1 else scalar

def vtype(scalar: DType, n: int) -> str:
  """The LLVM type of n lanes of a scalar dtype."""
  return ltype(vdt(scalar, n))

def mtype(dt: DType) -> str:
  """The type a dtype has in memory: bool is a byte there."""
  return ltype(dt).replace("i1", "i8") if dt.scalar() == dtypes.bool else ltype(dt)

def _is_f(dt: DType) -> bool: return dt.scalar() in (dtypes.float16, dtypes.float32, dtypes.float64)
def _is_bf16(dt: DType) -> bool: return dt.scalar() == dtypes.bfloat16

def lconst(x: Any, dt: DType) -> str:
  """A scalar constant as an LLVM literal (floats in hex: exact, NaN and inf included)."""
  dt = dt.scalar()
  if dt == dtypes.bool: return "true" if x else "false"
  if dt == dtypes.bfloat16: return str(int(np.asarray(bf16_bits_from_f32(np.float32(x))).view(np.int16)))
  if dt == dtypes.float16: return f"0xH{int(np.float16(x).view(np.uint16)):04X}"
  if dt in (dtypes.float32, dtypes.float64):
    v = float(np.float32(x)) if dt == dtypes.float32 else float(x)
    return f"0x{struct.unpack('<Q', struct.pack('<d', v))[0]:016X}"
  bits = dt.itemsize * 8
  v = int(x) & ((1 << bits) - 1)
  return str(v - (1 << bits) if v >= 1 << (bits - 1) else v)

def _vector_exp2(n: int) -> list[str]:
  """exp2 on <n x float> without library calls, the C renderer's algorithm (c_vector_math.vector_exp2):
  2^x = 2^k * 2^f with k = round(x) (adding 1.5*2^23 leaves k in the low mantissa bits), |f| <= 1/2,
  2^f by EXP2_POLY, and 2^k built in the exponent bits of two factors (exact into subnormals and up
  to inf). NaN stays NaN (it passes the clamps and every step after them)."""
  vt, it = f"<{n} x float>", f"<{n} x i32>"
  def splat(t: str, c: str) -> str: return "<" + ", ".join([f"{t} {c}"] * n) + ">"
  f = lambda c: splat("float", lconst(c, dtypes.float32))  # noqa: E731
  i = lambda c: splat("i32", str(c))  # noqa: E731
  coef = EXP2_POLY
  lines = [f"define internal {vt} @tc_exp2_v{n}({vt} %x) alwaysinline nounwind {{",
           f"  %lo = fcmp olt {vt} %x, {f(-150.0)}", f"  %x1 = select <{n} x i1> %lo, {vt} {f(-150.0)}, {vt} %x",
           f"  %hi = fcmp ogt {vt} %x1, {f(129.0)}", f"  %xc = select <{n} x i1> %hi, {vt} {f(129.0)}, {vt} %x1",
           f"  %t = fadd {vt} %xc, {f(12582912.0)}", f"  %kf = fsub {vt} %t, {f(12582912.0)}", f"  %fr = fsub {vt} %xc, %kf",
           f"  %tb = bitcast {vt} %t to {it}", f"  %k = sub {it} %tb, {i(1262485504)}",
           f"  %p6 = fmul{_FLAGS} {vt} {f(coef[6])}, %fr"]
  prev = "%p6"
  for k in range(5, -1, -1):
    lines.append(f"  %a{k} = fadd{_FLAGS} {vt} {prev}, {f(coef[k])}")
    prev = f"%a{k}"
    if k: lines.append(f"  %m{k} = fmul{_FLAGS} {vt} %a{k}, %fr"); prev = f"%m{k}"
  lines += [f"  %k2 = ashr {it} %k, {i(1)}", f"  %k1 = sub {it} %k, %k2",
            f"  %e1 = add {it} %k1, {i(127)}", f"  %b1 = shl {it} %e1, {i(23)}", f"  %s1 = bitcast {it} %b1 to {vt}",
            f"  %e2 = add {it} %k2, {i(127)}", f"  %b2 = shl {it} %e2, {i(23)}", f"  %s2 = bitcast {it} %b2 to {vt}",
            f"  %r1 = fmul{_FLAGS} {vt} {prev}, %s1", f"  %r = fmul{_FLAGS} {vt} %r1, %s2", f"  ret {vt} %r", "}"]
  return lines

class LLVMRenderer(Renderer):
  """LLVM IR for CPUs: no workgroups or local memory; vector lanes are LLVM vectors; the outermost
  global loop is split across cores by the runtime (see the module docstring)."""
  device = "LLVM"
  suffix = "ll"
  has_local = False
  has_shared = False
  global_max = None
  local_max = None
  supports_float4 = True
  # the same vector shapes the C renderer asks the lowerer for, so both run the same algorithms
  vector_dtypes = frozenset({dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64})
  vector_alu = frozenset({BinaryOps.ADD, BinaryOps.SUB, BinaryOps.MUL, UnaryOps.NEG, UnaryOps.EXP2, BinaryOps.MAX})
  masked_loads = True  # llvm.masked.load
  @property
  def vector_width(self) -> int:
    """float32 lanes per SIMD register of the CPU the JIT targets (`CPU_ARCH`, default native)."""
    return llvm_target().vector_width
  def settings_key(self) -> tuple: return (llvm_target().arch, getenv("CPU_STREAM_MIN_BYTES", STREAM_MIN_BYTES))
  def render(self, name: str, uops: list) -> str:
    # streaming stores as the C renderer makes them (x86 hosts): `!nontemporal` stores, taken where the
    # address is aligned to the store (x86 streams only aligned ones), and a fence before returning
    streams = streamable_stores(uops, getenv("CPU_STREAM_MIN_BYTES", STREAM_MIN_BYTES)) if platform.machine() in ("x86_64", "AMD64") else frozenset()
    return _Writer(name, uops, streams, llvm_target()).render()

def llvm_target() -> CPUTarget:
  """The CPU the LLVM device builds for (`CPU_ARCH`, default native) as the C compiler reports that
  -march; without a C compiler, the host's vector width and no known extensions."""
  try: return cpu_target()
  except RuntimeError: return CPUTarget("native", "unknown", host_vector_width())

def _masked_intrinsic(kind: str, dt: DType) -> str:
  """The name of llvm.masked.load/store ("load" or "store") for vector dtype dt."""
  st = ltype(dt.scalar())
  return f"llvm.masked.{kind}.v{dt.count}{ {'float': 'f32', 'double': 'f64', 'half': 'f16'}.get(st, st)}.p0"

class _Writer:
  """One walk over the linearized UOps, printing SSA instructions into basic blocks."""
  def __init__(self, name: str, uops: list[UOp], streams: frozenset, target: CPUTarget):
    self.name, self.uops, self.streams, self.target = name, uops, streams, target
    self.f16c = "f16c" in target.features  # float <-> half conversion instructions
    self.streamed = False
    self.r: dict[UOp, str] = {}
    self.lines: list[str] = []
    self.allocas: list[str] = []
    self.decls: set[str] = set()
    self.helpers: dict[str, list[str]] = {}
    self.n = 0
    self.block = "entry"
    self.loops: dict[UOp, tuple[str, str, str]] = {}  # RANGE -> (counter, head label, exit label)
    self.ifs: list[str] = []
    self.parallel = False

  # ---- emission helpers -------------------------------------------------------------------------
  def tmp(self, prefix: str = "v") -> str:
    self.n += 1
    return f"%{prefix}{self.n}"
  def emit(self, line: str) -> None: self.lines.append("  " + line)
  def val(self, expr: str, prefix: str = "v") -> str:
    n = self.tmp(prefix)
    self.emit(f"{n} = {expr}")
    return n
  def label(self, name: str) -> None:
    self.lines.append(f"{name}:")
    self.block = name
  def new_label(self, kind: str) -> str:
    self.n += 1
    return f"{kind}{self.n}"

  def typed(self, u: UOp) -> str: return f"{ltype(u.dtype)} {self.r[u]}"

  def splat(self, x: str, scalar_t: str, n: int) -> str:
    one = self.val(f"insertelement <{n} x {scalar_t}> poison, {scalar_t} {x}, i32 0")
    return self.val(f"shufflevector <{n} x {scalar_t}> {one}, <{n} x {scalar_t}> poison, <{n} x i32> zeroinitializer")

  # ---- the walk -----------------------------------------------------------------------------------
  def render(self) -> str:
    args: list[tuple[int, Any, str]] = []  # (kind, sort key, "type %name")
    for u in self.uops:
      op, dt, src = u.op, u.dtype, u.src
      if op is UOps.DEFINE_GLOBAL:
        self.r[u] = f"%data{u.arg}"
        args.append((0, u.arg, f"ptr noalias {self.r[u]}"))
      elif op is UOps.DEFINE_VAR:
        self.r[u] = f'%"var.{u.arg.expr}"'
        args.append((1, u.arg.expr, f"i64 {self.r[u]}"))
      elif op is UOps.CONST: self.r[u] = lconst(u.arg, dt)
      elif op is UOps.RANGE: self.range(u)
      elif op is UOps.ENDRANGE: self.endrange(u)
      elif op is UOps.IF:
        then, end = self.new_label("if"), self.new_label("endif")
        self.emit(f"br i1 {self.r[src[0]]}, label %{then}, label %{end}")
        self.label(then)
        self.ifs.append(end)
      elif op is UOps.ENDIF:
        end = self.ifs.pop()
        self.emit(f"br label %{end}")
        self.label(end)
      elif op is UOps.DEFINE_ACC:
        p = self.tmp("acc")
        self.allocas.append(f"  {p} = alloca {ltype(dt)}, align {dt.scalar().itemsize}")
        self.r[u] = p
        self.emit(f"store {self.typed(src[0])}, ptr {p}")
      elif op is UOps.PHI:
        self.emit(f"store {self.typed(src[1])}, ptr {self.r[src[0]]}")
        self.r[u] = self.r[src[1]]
      elif op is UOps.ACCREAD: self.r[u] = self.val(f"load {ltype(dt)}, ptr {self.r[src[0]]}")
      elif op is UOps.LOAD: self.load(u)
      elif op is UOps.STORE: self.store(u)
      elif op is UOps.ALU: self.r[u] = self.alu(u)
      elif op is UOps.CAST: self.r[u] = self.cast(self.r[src[0]], src[0].dtype, dt)
      elif op is UOps.BITCAST:
        if ltype(src[0].dtype) == ltype(dt): self.r[u] = self.r[src[0]]
        else: self.r[u] = self.val(f"bitcast {self.typed(src[0])} to {ltype(dt)}")
      elif op is UOps.VECTORIZE: self.r[u] = self.vectorize(u)
      elif op is UOps.GEP: self.r[u] = self.val(f"extractelement {self.typed(src[0])}, i32 {u.arg}")
      elif op is UOps.SINK: pass
      elif op in (UOps.SPECIAL, UOps.DEFINE_LOCAL, UOps.BARRIER, UOps.WMMA):
        raise NotImplementedError(f"the LLVM renderer targets CPUs: it has no {op.name}")
      else: raise NotImplementedError(f"LLVMRenderer can't render {op}")
    if self.loops or self.ifs: raise RuntimeError("LLVMRenderer: unbalanced RANGE/ENDRANGE or IF/ENDIF in the uops")
    # the signature: buffers by index, then symbolic values by name (the order CompiledRunner passes), then the chunk
    params = [a[2] for a in sorted(args, key=lambda a: (a[0], a[1]))] + ["i32 %chunk", "i32 %chunks"]
    out = [f"; tilecraft kernel {self.name}", f"@tc_parallel = constant i32 {int(self.parallel)}"]
    out += sorted(self.decls)
    for h in self.helpers.values(): out += h
    # streaming stores are weakly ordered: this thread's must be visible before the kernel returns
    end = ["  fence seq_cst"] if self.streamed else []
    out += [f'define void @"{self.name}"({", ".join(params)}) nounwind {{', "entry:"] + self.allocas + self.lines + end + ["  ret void", "}"]
    if self.streamed: out.append("!0 = !{i32 1}")
    return "\n".join(out) + "\n"

  # ---- control flow -------------------------------------------------------------------------------
  def range(self, u: UOp) -> None:
    it = ltype(u.dtype)
    start, end = self.r[u.src[0]], self.r[u.src[1]]
    if u.arg[0] == "parallel" and not self.parallel:
      # this chunk's share [start + total*chunk/chunks, start + total*(chunk+1)/chunks) in 64 bits
      self.parallel = True
      s64, e64 = (self.cast(x, u.dtype, dtypes.int64) for x in (start, end))
      total = self.val(f"sub i64 {e64}, {s64}")
      c, cs = self.val("sext i32 %chunk to i64"), self.val("sext i32 %chunks to i64")
      c1 = self.val(f"add i64 {c}, 1")
      lo, hi = self.val(f"mul i64 {total}, {c}"), self.val(f"mul i64 {total}, {c1}")
      lo, hi = self.val(f"sdiv i64 {lo}, {cs}"), self.val(f"sdiv i64 {hi}, {cs}")
      lo, hi = self.val(f"add i64 {s64}, {lo}"), self.val(f"add i64 {s64}, {hi}")
      start, end = self.cast(lo, dtypes.int64, u.dtype), self.cast(hi, dtypes.int64, u.dtype)
    pre = self.block
    head, body, latch, exit_ = (self.new_label(k) for k in ("loop", "body", "latch", "exit"))
    ctr = self.tmp("ridx" if u.arg[0] == "reduce" else "gidx")
    self.emit(f"br label %{head}")
    self.label(head)
    self.emit(f"{ctr} = phi {it} [{start}, %{pre}], [{ctr}.next, %{latch}]")
    cond = self.val(f"icmp slt {it} {ctr}, {end}")
    self.emit(f"br i1 {cond}, label %{body}, label %{exit_}")
    self.label(body)
    self.r[u] = ctr
    self.loops[u] = (ctr, head, latch, exit_)  # type: ignore[assignment]

  def endrange(self, u: UOp) -> None:
    rng = u.src[0]
    ctr, head, latch, exit_ = self.loops.pop(rng)  # type: ignore[misc]
    it = ltype(rng.dtype)
    self.emit(f"br label %{latch}")
    self.label(latch)
    self.emit(f"{ctr}.next = add {it} {ctr}, 1")
    self.emit(f"br label %{head}")
    self.label(exit_)

  # ---- memory -------------------------------------------------------------------------------------
  def address(self, buf: UOp, idx: UOp, inbounds: bool = True) -> str:
    """A pointer to element idx of buf. `inbounds` (the address is inside the buffer, else poison) is left
    off for a masked vector access, whose start may lie outside the buffer when its first lanes are off."""
    base = buf.dtype.base if isinstance(buf.dtype, PtrDType) else buf.dtype
    return self.val(f"getelementptr {'inbounds ' if inbounds else ''}{mtype(base.scalar())}, ptr {self.r[buf]}, {self.typed(idx)}", "p")

  # LLVM (at least 20-22) miscompiles llvm.masked.load/store on AVX and AVX2 targets when a vector
  # wider than a register is split and a part's mask is known false (after unrolling, or a padded
  # row's constant lane mask): the part becomes a plain load of the masked-off lanes, or an assertion
  # aborts the process. On those targets, 4- and 8-byte lanes use the vmaskmov intrinsics directly,
  # in register-sized pieces, with a mask instcombine can't turn back into llvm.masked.* (the sign of
  # each lane comes from a bitcast of half-width lanes, not a sext of the bool vector).
  def avx_masked(self, dt: DType) -> bool:
    return self.target.isa in ("AVX", "AVX2") and dt.scalar().itemsize in (4, 8) and dt.scalar() != dtypes.bool

  def avx_masked_access(self, dt: DType, p: str, mask: str, value: str = "") -> str:
    """vmaskmov load (value == "": returns the loaded vector, 0 in masked-off lanes) or store of
    value, of vector dtype dt at p under the <n x i1> mask, in pieces of 8 or 4 float / 4 or 2 double lanes."""
    n, size = dt.count, dt.scalar().itemsize
    ft, it, half, suffix = ("float", "i32", "i16", "ps") if size == 4 else ("double", "i64", "i32", "pd")
    dup = ", ".join(f"i32 {i // 2}" for i in range(2 * n))
    wide = self.val(f"sext <{2 * n} x i1> {self.val(f'shufflevector <{n} x i1> {mask}, <{n} x i1> poison, <{2 * n} x i32> <{dup}>')} to <{2 * n} x {half}>")
    imask = self.val(f"bitcast <{2 * n} x {half}> {wide} to <{n} x {it}>")
    fvec = f"<{n} x {ft}>"
    if value: value = value if _is_f(dt) else self.val(f"bitcast {ltype(dt)} {value} to {fvec}")
    per, out = 32 // size, "zeroinitializer" if not value else ""
    for start in range(0, n, per):
      w = per if n - start > per // 2 else per // 2  # the piece's lanes (past n: mask 0)
      name = f"llvm.x86.avx.mask{'store' if value else 'load'}.{suffix}{'.256' if w * size == 32 else ''}"
      pick = ", ".join(f"i32 {start + i if start + i < n else n}" for i in range(w))
      m = self.val(f"shufflevector <{n} x {it}> {imask}, <{n} x {it}> zeroinitializer, <{w} x i32> <{pick}>")
      q = self.val(f"getelementptr {ft}, ptr {p}, i32 {start}", "p")
      if value:
        self.decls.add(f"declare void @{name}(ptr, <{w} x {it}>, <{w} x {ft}>)")
        piece = self.val(f"shufflevector {fvec} {value}, {fvec} poison, <{w} x i32> <{pick}>")
        self.emit(f"call void @{name}(ptr {q}, <{w} x {it}> {m}, <{w} x {ft}> {piece})")
        continue
      self.decls.add(f"declare <{w} x {ft}> @{name}(ptr, <{w} x {it}>)")
      piece = self.val(f"call <{w} x {ft}> @{name}(ptr {q}, <{w} x {it}> {m})")
      for i in range(min(w, n - start)):
        out = self.val(f"insertelement {fvec} {out}, {ft} {self.val(f'extractelement <{w} x {ft}> {piece}, i32 {i}')}, i32 {start + i}")
    if value or _is_f(dt): return out
    return self.val(f"bitcast {fvec} {out} to {ltype(dt)}")

  def plain_load(self, u: UOp) -> str:
    dt, align = u.dtype, max(u.dtype.scalar().itemsize, 1)
    p = self.address(u.src[0], u.src[1])
    v = self.val(f"load {mtype(dt)}, ptr {p}, align {align}")
    if dt.scalar() == dtypes.bool: v = self.val(f"icmp ne {mtype(dt)} {v}, {'zeroinitializer' if dt.count > 1 else '0'}")
    return v

  def load(self, u: UOp) -> None:
    src = u.src
    if len(src) >= 4 and src[2].dtype.scalar() == dtypes.bool:
      if src[2].dtype.count > 1:  # per lane: llvm.masked.load reads only the lanes whose mask bit is set
        if src[2].dtype.count != u.dtype.count or u.dtype.scalar() == dtypes.bool: raise NotImplementedError(f"LLVMRenderer: a {u.dtype} load gated by {src[2].dtype}")
        t, n, name = ltype(u.dtype), u.dtype.count, _masked_intrinsic("load", u.dtype)
        p = self.address(src[0], src[1], inbounds=False)
        if self.avx_masked(u.dtype):
          v = self.avx_masked_access(u.dtype, p, self.r[src[2]])
          self.r[u] = v if src[3].op is UOps.CONST and not src[3].arg else self.val(f"select {self.typed(src[2])}, {t} {v}, {self.typed(src[3])}")
          return
        self.decls.add(f"declare {t} @{name}(ptr, i32 immarg, <{n} x i1>, {t})")
        self.r[u] = self.val(f"call {t} @{name}(ptr {p}, i32 {u.dtype.scalar().itemsize}, {self.typed(src[2])}, {self.typed(src[3])})")
        return
      # like C's g ? buf[i] : alt, the load only happens when the gate is true (i may be out of bounds otherwise)
      pre, then, join = self.block, self.new_label("ld"), self.new_label("ldjoin")
      self.emit(f"br i1 {self.r[src[2]]}, label %{then}, label %{join}")
      self.label(then)
      v = self.plain_load(u)
      self.emit(f"br label %{join}")
      self.label(join)
      self.r[u] = self.val(f"phi {ltype(u.dtype)} [{v}, %{then}], [{self.r[src[3]]}, %{pre}]")
    else: self.r[u] = self.plain_load(u)

  def store(self, u: UOp) -> None:
    buf, idx, v = u.src[0], u.src[1], u.src[2]
    join = None
    if len(u.src) > 3 and u.src[3].dtype.count > 1:  # per lane: llvm.masked.store writes only the lanes whose mask bit is set
      if u.src[3].dtype.count != v.dtype.count or v.dtype.scalar() == dtypes.bool: raise NotImplementedError(f"LLVMRenderer: a {v.dtype} store gated by {u.src[3].dtype}")
      t, n, name = ltype(v.dtype), v.dtype.count, _masked_intrinsic("store", v.dtype)
      if self.avx_masked(v.dtype):
        self.avx_masked_access(v.dtype, self.address(buf, idx, inbounds=False), self.r[u.src[3]], self.r[v])
        return
      self.decls.add(f"declare void @{name}({t}, ptr, i32 immarg, <{n} x i1>)")
      self.emit(f"call void @{name}({t} {self.r[v]}, ptr {self.address(buf, idx, inbounds=False)}, i32 {v.dtype.scalar().itemsize}, {self.typed(u.src[3])})")
      return
    if len(u.src) > 3:
      then, join = self.new_label("st"), self.new_label("stjoin")
      self.emit(f"br i1 {self.r[u.src[3]]}, label %{then}, label %{join}")
      self.label(then)
    val, dt = self.r[v], v.dtype
    if dt.scalar() == dtypes.bool: val = self.val(f"zext {ltype(dt)} {val} to {mtype(dt)}")
    p = self.address(buf, idx)
    if u in self.streams and join is None:
      # a streaming store where p is aligned to it (up to one SIMD register), else a plain one
      align = min(dt.itemsize, 4 * self.target.vector_width)
      addr = self.val(f"ptrtoint ptr {p} to i64")
      low = self.val(f"and i64 {addr}, {align - 1}")
      aligned = self.val(f"icmp eq i64 {low}, 0")
      nt, plain, done = self.new_label("nt"), self.new_label("st"), self.new_label("stjoin")
      self.emit(f"br i1 {aligned}, label %{nt}, label %{plain}")
      self.label(nt)
      self.emit(f"store {mtype(dt)} {val}, ptr {p}, align {align}, !nontemporal !0")
      self.emit(f"br label %{done}")
      self.label(plain)
      self.emit(f"store {mtype(dt)} {val}, ptr {p}, align {max(dt.scalar().itemsize, 1)}")
      self.emit(f"br label %{done}")
      self.label(done)
      self.streamed = True
      return
    self.emit(f"store {mtype(dt)} {val}, ptr {p}, align {max(dt.scalar().itemsize, 1)}")
    if join is not None:
      self.emit(f"br label %{join}")
      self.label(join)

  # ---- values -------------------------------------------------------------------------------------
  def vectorize(self, u: UOp) -> str:
    n, st = u.dtype.count, ltype(u.dtype.scalar())
    if all(s.op is UOps.CONST for s in u.src): return "<" + ", ".join(f"{st} {self.r[s]}" for s in u.src) + ">"
    if all(s is u.src[0] for s in u.src): return self.splat(self.r[u.src[0]], st, n)
    acc = "poison"
    for i, s in enumerate(u.src): acc = self.val(f"insertelement <{n} x {st}> {acc}, {st} {self.r[s]}, i32 {i}")
    return acc

  def math(self, op: Any, x: str, dt: DType) -> str:
    t = ltype(dt)
    if op is UnaryOps.EXP2 and dt.count > 1 and dt.scalar() == dtypes.float32:
      self.helpers.setdefault(f"exp2_{dt.count}", _vector_exp2(dt.count))
      return self.val(f"call {t} @tc_exp2_v{dt.count}({t} {x})")
    if dt.scalar() == dtypes.float16:  # like C: computed in float, rounded back to half
      f32 = dtypes.float32.vec(dt.count)
      return self.cast(self.math(op, self.cast(x, dt, f32), f32), f32, dt)
    suffix = ("v" + str(dt.count) if dt.count > 1 else "") + {dtypes.float32: "f32", dtypes.float64: "f64"}[dt.scalar()]
    fn = f"llvm.{_MATH[op]}.{suffix}"
    self.decls.add(f"declare {t} @{fn}({t})")
    return self.val(f"call {t} @{fn}({t} {x})")

  def alu(self, u: UOp) -> str: return self.alu_op(u.arg, u.dtype, [self.r[s] for s in u.src], [s.dtype for s in u.src])

  def alu_op(self, op: Any, dt: DType, a: list[str], dts: list[DType]) -> str:
    """op of dtype dt on the values a (of dtypes dts)."""
    sdt = dts[0]
    t, st = ltype(dt), ltype(sdt)
    is_bool, fl, signed = sdt.scalar() == dtypes.bool, _is_f(sdt), not dtypes.is_unsigned(sdt)
    if _is_bf16(sdt) or (_is_bf16(dt) and op not in (BinaryOps.CMPLT, BinaryOps.CMPNE)):
      raise NotImplementedError("LLVMRenderer: bfloat16 arithmetic (the lowerer computes it in float32)")
    if any(d.scalar() == dtypes.float16 for d in dts) and op not in _MATH and op is not TernaryOps.WHERE:
      # like C: each op computed in float and rounded back to half (x86 without AVX512-FP16 has no half
      # arithmetic, and without F16C LLVM would call compiler-runtime helpers the JIT can't resolve)
      widen = lambda d: d.scalar() == dtypes.float16  # noqa: E731
      f32 = vdt(dtypes.float32, dt.count)
      fa = [self.cast(x, d, f32) if widen(d) else x for x, d in zip(a, dts)]
      r = self.alu_op(op, f32 if widen(dt) else dt, fa, [f32 if widen(d) else d for d in dts])
      return self.cast(r, f32, dt) if widen(dt) else r
    if op is UnaryOps.NEG:
      if is_bool: return self.val(f"xor {t} {a[0]}, {self.ones(dt)}")
      return self.val(f"fneg{_FLAGS} {t} {a[0]}" if fl else f"sub {t} {self.zero(dt)}, {a[0]}")
    if op is UnaryOps.RECIP:
      if not fl: raise NotImplementedError(f"LLVMRenderer: RECIP of {dt}")
      return self.val(f"fdiv{_FLAGS} {t} {self.splat_const(1.0, dt)}, {a[0]}")
    if op in _MATH:
      if not fl: raise NotImplementedError(f"LLVMRenderer: {op} of {dt}")
      return self.math(op, a[0], dt)
    if op is TernaryOps.WHERE: return self.val(f"select {ltype(dts[0])} {a[0]}, {ltype(dts[1])} {a[1]}, {ltype(dts[2])} {a[2]}")
    if op is TernaryOps.MULACC:
      if not fl: return self.val(f"add {t} {self.val(f'mul {t} {a[0]}, {a[1]}')}, {a[2]}")
      return self.val(f"fadd{_FLAGS} {t} {self.val(f'fmul{_FLAGS} {t} {a[0]}, {a[1]}')}, {a[2]}")
    if op is BinaryOps.MAX:
      if is_bool: return self.val(f"or {t} {a[0]}, {a[1]}")
      if fl:  # numpy's maximum: NaN in a propagates (C: (a != a) || a > b ? a : b)
        nan = self.val(f"fcmp uno {st} {a[0]}, {a[0]}")
        gt = self.val(f"fcmp ogt {st} {a[0]}, {a[1]}")
        c = self.val(f"or {ltype(dtypes.bool.vec(dt.count))} {nan}, {gt}")
      else: c = self.val(f"icmp {'sgt' if signed else 'ugt'} {st} {a[0]}, {a[1]}")
      return self.val(f"select {ltype(dtypes.bool.vec(dt.count))} {c}, {t} {a[0]}, {t} {a[1]}")
    if op is BinaryOps.CMPLT:
      if fl: return self.val(f"fcmp olt {st} {a[0]}, {a[1]}")
      return self.val(f"icmp {'ult' if is_bool or not signed else 'slt'} {st} {a[0]}, {a[1]}")
    if op is BinaryOps.CMPNE: return self.val(f"fcmp une {st} {a[0]}, {a[1]}" if fl else f"icmp ne {st} {a[0]}, {a[1]}")
    if fl:
      fop = {BinaryOps.ADD: "fadd", BinaryOps.SUB: "fsub", BinaryOps.MUL: "fmul", BinaryOps.MOD: "frem"}.get(op)  # frem: C's fmod, exact
      if fop is None: raise NotImplementedError(f"LLVMRenderer: {op} on {dt}")
      return self.val(f"{fop}{_FLAGS} {t} {a[0]}, {a[1]}")
    if is_bool:  # C computes bools in int and converts back: + is |, * is &, - is ^
      iop = {BinaryOps.ADD: "or", BinaryOps.MUL: "and", BinaryOps.SUB: "xor", BinaryOps.XOR: "xor", BinaryOps.OR: "or", BinaryOps.AND: "and"}.get(op)
      if iop is None: raise NotImplementedError(f"LLVMRenderer: {op} on bool")
      return self.val(f"{iop} {t} {a[0]}, {a[1]}")
    iop = {BinaryOps.ADD: "add", BinaryOps.SUB: "sub", BinaryOps.MUL: "mul", BinaryOps.XOR: "xor", BinaryOps.OR: "or", BinaryOps.AND: "and",
           BinaryOps.SHL: "shl", BinaryOps.IDIV: "sdiv" if signed else "udiv", BinaryOps.MOD: "srem" if signed else "urem",
           BinaryOps.SHR: "ashr" if signed else "lshr"}.get(op)
    if iop is None: raise NotImplementedError(f"LLVMRenderer: {op} on {dt}")
    return self.val(f"{iop} {t} {a[0]}, {a[1]}")

  def zero(self, dt: DType) -> str: return "zeroinitializer" if dt.count > 1 else ("0.0" if _is_f(dt) else "false" if dt == dtypes.bool else "0")
  def ones(self, dt: DType) -> str: return self.splat_const(True, dt)
  def splat_const(self, x: Any, dt: DType) -> str:
    c = lconst(x, dt)
    return c if dt.count == 1 else "<" + ", ".join([f"{ltype(dt.scalar())} {c}"] * dt.count) + ">"

  # ---- half conversions -------------------------------------------------------------------------
  # x86 converts float <-> half in hardware only with F16C, and never double -> half; LLVM would
  # otherwise call compiler-runtime helpers (__truncdfhf2, __extendhfsf2, ...) that the JIT may not
  # find. So: every conversion goes through float; float <-> half is one instruction with F16C and
  # integer arithmetic without; double -> float rounds to odd first, so the second rounding (to half,
  # 13 bits shorter) is the one correctly rounded result.
  def half_cast(self, x: str, src: DType, dst: DType) -> str:
    n, s = dst.count, src.scalar()
    f32 = vdt(dtypes.float32, n)
    if s == dtypes.float16:
      f = self.val(f"fpext {ltype(src)} {x} to {ltype(f32)}") if self.f16c else self.f16_to_f32(x, n)
      return self.cast(f, f32, dst)
    if s == dtypes.float64: x = self.f64_to_f32_odd(x, n)
    elif s != dtypes.float32: x = self.cast(x, src, f32)  # ints: exact below 2**24, and anything larger is inf in half anyway
    return self.val(f"fptrunc {ltype(f32)} {x} to {ltype(dst)}") if self.f16c else self.f32_to_f16(x, n)

  def _bit_types(self, n: int) -> tuple[str, str, str, Any]:
    """(int32, float32 and bool types of n lanes, a maker of int32 constants of n lanes): what the bit-level conversions work in."""
    return vtype(dtypes.int32, n), vtype(dtypes.float32, n), vtype(dtypes.bool, n), lambda v: self.splat_const(v, vdt(dtypes.int32, n))

  def f32_to_f16(self, x: str, n: int) -> str:
    """float -> half, round to nearest even, by integer arithmetic on the bits."""
    i, f, b, c = self._bit_types(n)
    u = self.val(f"bitcast {f} {x} to {i}")
    sign = self.val(f"and {i} {self.val(f'lshr {i} {u}, {c(16)}')}, {c(0x8000)}")
    a = self.val(f"and {i} {u}, {c(0x7FFFFFFF)}")
    # normal halves: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even
    odd = self.val(f"and {i} {self.val(f'lshr {i} {a}, {c(13)}')}, {c(1)}")
    rebiased = self.val(f"sub {i} {a}, {c(0x38000000)}")
    bias = self.val(f"add {i} {odd}, {c(0xFFF)}")
    norm = self.val(f"lshr {i} {self.val(f'add {i} {rebiased}, {bias}')}, {c(13)}")
    # below 2**-14 (subnormal halves): adding 0.5 lines the value up with float's ulp at 0.5, which is
    # half's 2**-24, and the float add rounds to nearest even; what is above 0.5 is the half's bits
    small = self.val(f"fadd {f} {self.val(f'bitcast {i} {a} to {f}')}, {self.splat_const(0.5, vdt(dtypes.float32, n))}")
    sub = self.val(f"sub {i} {self.val(f'bitcast {f} {small} to {i}')}, {c(0x3F000000)}")
    h = self.val(f"select {b} {self.val(f'icmp ult {i} {a}, {c(0x38800000)}')}, {i} {sub}, {i} {norm}")
    h = self.val(f"select {b} {self.val(f'icmp uge {i} {a}, {c(0x477FF000)}')}, {i} {c(0x7C00)}, {i} {h}")  # 65520 and up: inf
    payload = self.val(f"and {i} {self.val(f'lshr {i} {a}, {c(13)}')}, {c(0x3FF)}")
    nan = self.val(f"or {i} {payload}, {c(0x7E00)}")
    h = self.val(f"select {b} {self.val(f'icmp ugt {i} {a}, {c(0x7F800000)}')}, {i} {nan}, {i} {h}")
    t16 = vtype(dtypes.int16, n)
    bits = self.val(f"trunc {i} {self.val(f'or {i} {h}, {sign}')} to {t16}")
    return self.val(f"bitcast {t16} {bits} to {vtype(dtypes.float16, n)}")

  def f16_to_f32(self, x: str, n: int) -> str:
    """half -> float (exact), by integer arithmetic on the bits."""
    i, f, b, c = self._bit_types(n)
    t16 = vtype(dtypes.int16, n)
    h = self.val(f"zext {t16} {self.val(f'bitcast {vtype(dtypes.float16, n)} {x} to {t16}')} to {i}")
    sign = self.val(f"shl {i} {self.val(f'and {i} {h}, {c(0x8000)}')}, {c(16)}")
    em = self.val(f"and {i} {h}, {c(0x7FFF)}")
    exp = self.val(f"and {i} {h}, {c(0x7C00)}")
    shifted = self.val(f"shl {i} {em}, {c(13)}")
    norm = self.val(f"add {i} {shifted}, {c(0x38000000)}")  # rebias 15 -> 127
    special = self.val(f"add {i} {shifted}, {c(0x70000000)}")  # inf and NaN keep their payload
    scaled = self.val(f"fmul {f} {self.val(f'uitofp {i} {em} to {f}')}, {self.splat_const(2.0 ** -24, vdt(dtypes.float32, n))}")
    sub = self.val(f"bitcast {f} {scaled} to {i}")
    r = self.val(f"select {b} {self.val(f'icmp eq {i} {exp}, {c(0)}')}, {i} {sub}, {i} {norm}")
    r = self.val(f"select {b} {self.val(f'icmp eq {i} {exp}, {c(0x7C00)}')}, {i} {special}, {i} {r}")
    return self.val(f"bitcast {i} {self.val(f'or {i} {r}, {sign}')} to {f}")

  def f64_to_f32_odd(self, x: str, n: int) -> str:
    """double -> float rounded to odd: truncated toward zero, lowest bit set when inexact."""
    d = vtype(dtypes.float64, n)
    i, f, b, c = self._bit_types(n)
    fabs = f"llvm.fabs.{'v' + str(n) if n > 1 else ''}f64"
    self.decls.add(f"declare {d} @{fabs}({d})")
    r = self.val(f"fptrunc {d} {x} to {f}")
    back = self.val(f"fpext {f} {r} to {d}")
    inexact = self.val(f"fcmp une {d} {back}, {x}")
    abs_back, abs_x = self.val(f"call {d} @{fabs}({d} {back})"), self.val(f"call {d} @{fabs}({d} {x})")
    away = self.val(f"fcmp ogt {d} {abs_back}, {abs_x}")
    u = self.val(f"bitcast {f} {r} to {i}")
    trunc = self.val(f"select {b} {away}, {i} {self.val(f'sub {i} {u}, {c(1)}')}, {i} {u}")
    odd = self.val(f"select {b} {inexact}, {i} {self.val(f'or {i} {trunc}, {c(1)}')}, {i} {u}")
    return self.val(f"bitcast {i} {odd} to {f}")

  def cast(self, x: str, src: DType, dst: DType) -> str:
    """C's conversion of x from src to dst (elementwise for vectors)."""
    if src.count != dst.count: raise NotImplementedError(f"LLVMRenderer: cast {src} -> {dst} changes the lane count")
    n = dst.count
    vec = (lambda d: d.vec(n)) if n > 1 else (lambda d: d)  # noqa: E731
    s, d = src.scalar(), dst.scalar()
    if s == d: return x
    ts, td = ltype(src), ltype(dst)
    if s == dtypes.bfloat16:  # the bits are the high half of a float32
      w = self.val(f"zext {ts} {x} to {ltype(vec(dtypes.uint32))}")
      w = self.val(f"shl {ltype(vec(dtypes.uint32))} {w}, {self.splat_const(16, vec(dtypes.uint32))}")
      return self.cast(self.val(f"bitcast {ltype(vec(dtypes.uint32))} {w} to {ltype(vec(dtypes.float32))}"), vec(dtypes.float32), dst)
    if d == dtypes.bfloat16:
      if n > 1: raise NotImplementedError("LLVMRenderer: vector casts to bfloat16")
      f = self.cast(x, src, dtypes.float32)
      u = self.val(f"bitcast float {f} to i32")
      mag = self.val(f"and i32 {u}, 2147483647")
      nan = self.val(f"icmp ugt i32 {mag}, 2139095040")
      qnan = self.val(f"or i32 {self.val(f'lshr i32 {u}, 16')}, 64")
      odd = self.val(f"and i32 {self.val(f'lshr i32 {u}, 16')}, 1")
      biased = self.val(f"add i32 {u}, 32767")
      rounded = self.val(f"lshr i32 {self.val(f'add i32 {biased}, {odd}')}, 16")
      return self.val(f"trunc i32 {self.val(f'select i1 {nan}, i32 {qnan}, i32 {rounded}')} to i16")
    if d == dtypes.float16 or s == dtypes.float16: return self.half_cast(x, src, dst)
    if d == dtypes.bool:
      if _is_f(src): return self.val(f"fcmp une {ts} {x}, {self.zero(src)}")
      return self.val(f"icmp ne {ts} {x}, {self.zero(src)}")
    if _is_f(src) and _is_f(dst):
      return self.val(f"{'fpext' if d.itemsize > s.itemsize else 'fptrunc'} {ts} {x} to {td}")
    if _is_f(src):
      # gcc converts through a 32-bit signed conversion for narrower ints and through 64 bits for uint32
      if s == dtypes.float16: x, src, ts = self.cast(x, src, vec(dtypes.float32)), vec(dtypes.float32), ltype(vec(dtypes.float32))
      if d == dtypes.uint64: mid = vec(dtypes.uint64)
      elif d in (dtypes.int64, dtypes.uint32): mid = vec(dtypes.int64)
      else: mid = vec(dtypes.int32)
      conv = "fptoui" if mid.scalar() == dtypes.uint64 else "fptosi"
      v = self.val(f"freeze {ltype(mid)} {self.val(f'{conv} {ts} {x} to {ltype(mid)}')}")
      return self.cast(v, mid, dst) if mid.scalar() != d else v
    if _is_f(dst):
      signed = not dtypes.is_unsigned(src) and s != dtypes.bool
      return self.val(f"{'sitofp' if signed else 'uitofp'} {ts} {x} to {td}")
    # int -> int: truncate, or extend by the source's signedness (bool is 0/1)
    if s.itemsize == d.itemsize and s != dtypes.bool: return x
    if d.itemsize < s.itemsize: return self.val(f"trunc {ts} {x} to {td}")
    ext = "zext" if dtypes.is_unsigned(src) or s == dtypes.bool else "sext"
    return self.val(f"{ext} {ts} {x} to {td}")
