"""The PYTHON device: runs the linearized UOps of a Program in an emulator with GPU semantics
(runtime/emulate.py), so workgroups, local memory, barriers, grouped reduces and the GPU-only
opts are tested on any machine.

Source: `PythonRenderer.render` writes the UOps as a listing, one instruction per line

    %7 = ALU dtypes.float.vec(4) (%5, %6) BinaryOps.ADD

(`%i = OP dtype (sources) arg`), which is readable (DEBUG=4 shows it), is what the compile cache
keys on, and parses back exactly (`parse_listing`, a whitelist evaluator, never `eval`). The
renderer hands the instructions it wrote straight to the compiler and runtime (no parse on the
hot path); a listing from anywhere else is parsed. Compiling checks that every instruction has a
handler in the emulator.

Targets: `EMULATE=CUDA|METAL|AMD` gives the renderer that target's capabilities (launch limits,
shared memory, threads per workgroup, vector types, tensor cores); unset is a generic GPU. The
device opens once per process, but its `renderer` is looked up per access, keyed by the current
EMULATE value (environment or `Context(EMULATE=...)`), so a test switches targets with
`with Context(EMULATE="CUDA"): Kernel(ast, opts=Device["PYTHON"].renderer)`. A Kernel keeps the
renderer it was built with; programs run the same on any target (only WMMA lane layouts, which
travel in the instruction, are vendor-specific). Launches are checked against the limits of the
target the program was rendered for.
"""
from __future__ import annotations
import ast as pyast, collections, functools
from enum import Enum
from typing import Any, Optional
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.device import CompileError, Compiled, Compiler
from tilecraft.dtype import DType, PtrDType, dtypes
from tilecraft.helpers import getenv
from tilecraft.ops import BinaryOps, ReduceOps, TernaryOps, UnaryOps
from tilecraft.renderer import Renderer
from tilecraft.runtime.emulate import EmulatorError, Executable, Ins, launch, np_memory_dtype
from tilecraft.shape.symbolic import Variable

# ---- targets -----------------------------------------------------------------------------------------

# the capabilities (declared fields of Renderer) the PYTHON renderer takes from the target it emulates
_CAPS = ("has_local", "has_shared", "global_max", "local_max", "shared_max", "max_threads", "supports_float4", "vector_dtypes",
         "vector_alu", "tensor_cores", "supports_images", "image_max")
EMULATED_TARGETS = ("CUDA", "METAL", "AMD")

class _GenericGPU(Renderer):
  """The emulator's own target: a GPU with OpenCL-like limits and vectors of float32, float16 and int32."""
  device = "PYTHON"
  global_max = (2**31 - 1, 65535, 65535)
  local_max = (1024, 1024, 64)
  shared_max = 32768
  max_threads = 1024
  vector_dtypes = frozenset({dtypes.float32, dtypes.float16, dtypes.int32})
  vector_alu = frozenset({BinaryOps.ADD, BinaryOps.SUB, BinaryOps.MUL, UnaryOps.NEG, BinaryOps.MAX})
  supports_images, image_max = True, (16384, 16384)  # OpenCL images, emulated (emulate.py: _texels)

def target_renderer(target: str) -> Renderer:
  """The renderer whose capabilities EMULATE=target takes (the real CUDA / HIP / Metal renderers)."""
  if target == "": return _GenericGPU()
  if target == "CUDA":
    from tilecraft.renderer.cuda import CUDARenderer
    return CUDARenderer()
  if target == "METAL":
    from tilecraft.renderer.metal import MetalRenderer
    return MetalRenderer()
  if target == "AMD":
    from tilecraft.renderer.hip import HIPRenderer
    return HIPRenderer()
  raise ValueError(f"EMULATE={target!r}: the PYTHON device emulates {', '.join(EMULATED_TARGETS)} (or nothing: a generic GPU)")

class PythonRenderer(Renderer):
  """Renders UOps as the emulator's listing; capabilities come from the emulated target."""
  device = "PYTHON"
  def __init__(self, target: str = ""):
    self.target = target
    self.base = target_renderer(target)
    for a in _CAPS: setattr(self, a, getattr(self.base, a))
  def render(self, name: str, uops: list) -> str:
    src, ins = _render(name, uops, self.target)
    try: _remember(src, Executable(name, ins))  # so compiling and loading it need no parse
    except EmulatorError: pass  # e.g. an instruction without a handler: compiling it says so
    return src
  def __repr__(self) -> str: return f"<PythonRenderer target={self.target or 'generic GPU'}>"

@functools.lru_cache(maxsize=None)
def python_renderer(target: str) -> PythonRenderer:
  """One renderer per target, so kernels and caches see a stable object."""
  return PythonRenderer(target)

def current_target() -> str:
  t = str(getenv("EMULATE", "")).strip().upper()
  if t and t not in EMULATED_TARGETS: raise ValueError(f"EMULATE={t!r}: the PYTHON device emulates {', '.join(EMULATED_TARGETS)} (or nothing: a generic GPU)")
  return t

# ---- the listing ---------------------------------------------------------------------------------------

_ENUMS = {e.__name__: e for e in (UnaryOps, BinaryOps, TernaryOps, ReduceOps, UOps)}

def _fmt(x: Any, ref: dict) -> str:
  if isinstance(x, UOp):
    if x in ref: return f"%{ref[x]}"
    from tilecraft.codegen.linearize import uop_to_sint  # a value only in an arg (a symbolic launch size): its formula
    try: return repr(str(uop_to_sint(x)))
    except ValueError: return repr(repr(x))
  if isinstance(x, tuple): return "(" + ", ".join(_fmt(v, ref) for v in x) + ")" if len(x) != 1 else f"({_fmt(x[0], ref)},)"
  if isinstance(x, list): return "[" + ", ".join(_fmt(v, ref) for v in x) + "]"
  if isinstance(x, float) and (x != x or x in (float("inf"), float("-inf"))): return {"nan": "nan", "inf": "inf", "-inf": "-inf"}[repr(x)]
  if isinstance(x, Enum) and _ENUMS.get(type(x).__name__) is type(x): return f"{type(x).__name__}.{x.name}"
  if isinstance(x, Variable): return f"Variable({x.expr!r}, {x.vmin}, {x.vmax})"
  if isinstance(x, (DType, int, float, str, bool, type(None))): return repr(x)
  raise TypeError(f"the PYTHON listing can't write the argument {x!r} ({type(x).__name__})")

_ENDRANGE, _SINK = UOps.ENDRANGE, UOps.SINK

def _listing(uops: list[UOp]) -> tuple[dict, list[tuple[UOp, tuple[int, ...]]]]:
  """(index of each UOp, each UOp with its sources as listing indices). A source outside the list
  is either the ENDRANGE that means "after this loop" (the listing's own ENDRANGE of that loop
  stands in) or a store folded away to an empty SINK (dropped)."""
  ref = {u: i for i, u in enumerate(uops)}
  end_of = {u.src[0]: i for i, u in enumerate(uops) if u.op is _ENDRANGE}
  out = []
  for i, u in enumerate(uops):
    srcs = []
    for s in u.src:
      if (j := ref.get(s)) is not None: srcs.append(j)
      elif s.op is _ENDRANGE and s.src and s.src[0] in end_of: srcs.append(end_of[s.src[0]])
      elif s.op is _SINK and not s.src: continue
      else: raise CompileError(f"PYTHON renderer: {u.op.name} at {i} uses {s.op.name}, which is not in the linearized UOps", "")
    out.append((u, tuple(srcs)))
  return ref, out

def _render(name: str, uops: list[UOp], target: str) -> tuple[str, list[Ins]]:
  """The listing and the instructions parsing it gives back (built directly)."""
  ref, listing = _listing(uops)
  lines = [f"# tilecraft PYTHON kernel {name} (target: {target or 'generic GPU'})"]
  ins = []
  for i, (u, srcs) in enumerate(listing):
    lines.append(f"%{i} = {u.op.name} {_dtype_text(u.dtype)} ({', '.join(f'%{x}' for x in srcs)}{',' if len(srcs) == 1 else ''}) {_fmt(u.arg, ref)}")
    ins.append(Ins(u.op, u.dtype, srcs, _arg_value(u.arg, ref)))
  return "\n".join(lines) + "\n", ins

@functools.lru_cache(maxsize=None)
def _dtype_text(dt: DType) -> str: return repr(dt)

def render_listing(name: str, uops: list[UOp], target: str = "") -> str: return _render(name, uops, target)[0]
def instructions(uops: list[UOp]) -> list[Ins]:
  """The instructions parse_listing(render_listing(uops)) gives, built directly."""
  return _render("k", uops, "")[1]

def _arg_value(x: Any, ref: dict) -> Any:
  """An arg as parsing its listing text gives it back: UOps in the list become their index, others their formula."""
  if isinstance(x, UOp): return ref[x] if x in ref else _expr(_fmt(x, ref))
  if isinstance(x, tuple): return tuple(_arg_value(v, ref) for v in x)
  return x

class _Eval:
  """Evaluates one listing expression: literals, tuples/lists, -x, names of dtypes/op enums/nan/inf,
  `%i` references (written as `_r[i]` before parsing), dtype methods (.vec/.ptr) and Variable()."""
  def __init__(self) -> None:
    self.names: dict[str, Any] = {"dtypes": dtypes, "nan": float("nan"), "inf": float("inf"), "Variable": Variable, **_ENUMS}
  def __call__(self, node: Any) -> Any:
    if isinstance(node, pyast.Expression): return self(node.body)
    if isinstance(node, pyast.Constant): return node.value
    if isinstance(node, pyast.Tuple): return tuple(self(e) for e in node.elts)
    if isinstance(node, pyast.List): return [self(e) for e in node.elts]
    if isinstance(node, pyast.UnaryOp) and isinstance(node.op, pyast.USub): return -self(node.operand)
    if isinstance(node, pyast.Name):
      if node.id in self.names: return self.names[node.id]
    elif isinstance(node, pyast.Subscript) and isinstance(node.value, pyast.Name) and node.value.id == "_r":
      return _Ref(self(node.slice))
    elif isinstance(node, pyast.Attribute) and not node.attr.startswith("_"):
      base = self(node.value)
      if base is dtypes or isinstance(base, DType) or base in _ENUMS.values(): return getattr(base, node.attr)
    elif isinstance(node, pyast.Call):
      fn = self(node.func)
      ok = fn is Variable or (getattr(fn, "__name__", "") in ("vec", "ptr", "imagef", "imageh") and
                              (isinstance(getattr(fn, "__self__", None), DType) or getattr(fn, "__qualname__", "").startswith("dtypes.")))
      if ok: return fn(*[self(a) for a in node.args], **{k.arg: self(k.value) for k in node.keywords})
    raise ValueError(f"not a listing expression: {pyast.dump(node)[:200]}")

class _Ref(int):
  """A reference to an earlier instruction inside an arg."""

def _split_fields(line: str) -> tuple[int, str, str, str, str]:
  """'%i = OP dtype (srcs) arg' -> (i, OP, dtype text, srcs text, arg text); the dtype ends where the
  parenthesis of its sources opens at depth 0 after a space."""
  head, _, rest = line.partition(" = ")
  op, _, rest = rest.partition(" ")
  depth, j = 0, 0
  for j, ch in enumerate(rest):
    if ch == "(" and depth == 0 and j > 0 and rest[j - 1] == " ": break
    depth += ch == "("
    depth -= ch == ")"
  else: raise ValueError("no source list")
  dt = rest[:j - 1]
  depth, k = 0, j
  for k in range(j, len(rest)):
    depth += rest[k] == "("
    depth -= rest[k] == ")"
    if depth == 0: break
  return int(head.lstrip("%")), op, dt, rest[j:k + 1], rest[k + 2:]

def parse_listing(src: str) -> tuple[str, list[Ins]]:
  """The kernel name and instructions of a listing written by render_listing."""
  lines = [l for l in src.splitlines() if l.strip()]
  if not lines or not lines[0].startswith("# tilecraft PYTHON kernel "): raise ValueError("not a PYTHON kernel listing (no header line)")
  name = lines[0][len("# tilecraft PYTHON kernel "):].split(" ")[0]
  out: list[Ins] = []
  for n, line in enumerate(lines[1:]):
    try:
      i, op, dt_s, src_s, arg_s = _split_fields(line)
      if i != n: raise ValueError(f"instruction number {i}, expected {n}")
      dt = _expr(dt_s)
      inner = src_s[1:-1].replace(",", " ").split()
      if not src_s.startswith("(") or not all(x.startswith("%") and x[1:].isdigit() for x in inner): raise ValueError(f"bad sources {src_s}")
      srcs = tuple(int(x[1:]) for x in inner)
      if not isinstance(dt, DType) or not all(s < i for s in srcs): raise ValueError("bad dtype or a source that is not earlier")
      out.append(Ins(UOps[op], dt, srcs, _unref(_expr(arg_s))))
    except (ValueError, KeyError, SyntaxError, TypeError) as e:
      raise ValueError(f"line {n + 2} of the listing: {e}: {line[:200]}") from None
  return name, out

_EVAL = _Eval()

@functools.lru_cache(maxsize=4096)
def _expr(text: str) -> Any:
  """The value of one listing field (memoized: kernels share most of their dtypes and args)."""
  return _EVAL(pyast.parse(_refs(text), mode="eval"))

def _refs(s: str) -> str:
  """`%12` -> `_r[12]` outside string literals."""
  out, q, j = [], None, 0
  while j < len(s):
    ch = s[j]
    if q is None and ch in "'\"": q = ch
    elif q is not None and ch == q and s[j - 1] != "\\": q = None
    if q is None and ch == "%":
      k = j + 1
      while k < len(s) and s[k].isdigit(): k += 1
      out.append(f"_r[{s[j + 1:k]}]")
      j = k
      continue
    out.append(ch)
    j += 1
  return "".join(out)

def _unref(arg: Any) -> Any:
  if isinstance(arg, _Ref): return int(arg)
  if isinstance(arg, tuple): return tuple(_unref(a) for a in arg)
  return arg

# ---- compiler, program, device ---------------------------------------------------------------------------

class PythonCompiler(Compiler):
  """'Compiles' a listing: parses it and builds the executable (so bad listings and instructions
  the emulator lacks fail here, as CompileError). Not disk-cached: parsing is cheaper than a lookup."""
  def __init__(self) -> None: super().__init__(None)
  def compile(self, src: str) -> bytes:
    try: load(src)
    except (ValueError, EmulatorError) as e: raise CompileError(f"PYTHON device: {e}", src) from e
    return src.encode()

_executables: "collections.OrderedDict[str, Executable]" = collections.OrderedDict()

def _remember(src: str, exe: Executable) -> Executable:
  _executables[src] = exe
  _executables.move_to_end(src)
  if len(_executables) > 256: _executables.popitem(last=False)
  return exe

def load(src: str) -> Executable:
  """The executable of a listing: the one its renderer built, else parsed (an Executable holds no
  launch state, so programs share it)."""
  if (exe := _executables.get(src)) is not None: return exe
  return _remember(src, Executable(*parse_listing(src)))

class PythonProgram:
  """A parsed kernel. Called like every runtime's program: buffer handles (CPU-allocator memory),
  then launch sizes and the symbolic values in name order."""
  def __init__(self, name: str, lib: bytes):
    src = lib.decode()
    self.name = name
    self.exe = load(src)
    target = src.splitlines()[0].rsplit("(target: ", 1)[-1].rstrip(")")
    self.limits = python_renderer("" if target == "generic GPU" else target)
    self.last_lane_ops = 0
  def __call__(self, *bufs: Any, global_size: Optional[list[int]] = None, local_size: Optional[list[int]] = None,
               vals: tuple[int, ...] = (), wait: bool = True) -> Optional[float]:
    import time
    mems = []
    for (idx, i), b in zip(self.exe.globals, bufs):
      dt = self.exe.ins[i].dtype
      base = dt.base if isinstance(dt, PtrDType) else dt
      mem = b.mem if hasattr(b, "mem") else b
      usable = mem.size - mem.size % base.itemsize
      mems.append(mem[:usable].view(np_memory_dtype(base)))
    st = time.perf_counter()
    run = launch(self.exe, mems, tuple(vals), global_size, local_size, self.limits)
    self.last_lane_ops = run.executed * run.L  # for benchmarks: lanes x instructions of the last launch
    return time.perf_counter() - st if wait else None
  def __repr__(self) -> str: return f"<PythonProgram {self.name}>"

class PythonDevice(Compiled):
  """The opened PYTHON device; `renderer` follows the current EMULATE value."""
  @property
  def renderer(self) -> Renderer: return python_renderer(current_target())

def open_python() -> Compiled:
  from tilecraft.runtime.cpu import CPUAllocator  # numpy memory; the same (caching) allocator as the CPU device
  class EmulatorAllocator(CPUAllocator):
    def alloc_image(self, dt: Any) -> Any: return self.alloc(dt.shape[0] * dt.shape[1] * 4 * dt.itemsize)  # an image is its flat texels here
  return PythonDevice("PYTHON", EmulatorAllocator(), python_renderer, PythonCompiler(), PythonProgram)

open_device = open_python  # device.py's registry calls runtime.<name>.open_device
