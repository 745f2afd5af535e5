"""The kernel AST (API): op enums, LazyOp, MemBuffer, ConstBuffer, KernelInfo, verify_ast.

A kernel is `LazyOp(MetaOps.KERNEL, (STORE, ...), arg=KernelInfo)`. Leaves (LOAD, CONST) carry a
ShapeTracker; there are no movement ops inside the AST. Every op's sources have one shape, and
only reduces change it (reduced dims become 1).
"""
from __future__ import annotations
import functools, hashlib
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any, Optional, Union
from tilecraft.dtype import DType, dtypes
from tilecraft.shape.shapetracker import ShapeTracker
from tilecraft.shape.symbolic import Node, Variable, sint

class UnaryOps(Enum): EXP2 = auto(); LOG2 = auto(); CAST = auto(); BITCAST = auto(); SIN = auto(); SQRT = auto(); NEG = auto(); RECIP = auto()  # noqa: E702
class BinaryOps(Enum):
  ADD = auto(); MUL = auto(); IDIV = auto(); MAX = auto(); MOD = auto(); CMPLT = auto(); CMPNE = auto(); XOR = auto()  # noqa: E702
  SHL = auto(); SHR = auto(); OR = auto(); AND = auto(); SUB = auto(); THREEFRY = auto()  # noqa: E702
class TernaryOps(Enum): WHERE = auto(); MULACC = auto()  # noqa: E702
class ReduceOps(Enum): SUM = auto(); MAX = auto(); WMMA = auto()  # noqa: E702
class BufferOps(Enum): LOAD = auto(); CONST = auto(); STORE = auto()  # noqa: E702
class MetaOps(Enum): KERNEL = auto(); COPY = auto(); EMPTY = auto(); CONTIGUOUS = auto(); ASSIGN = auto(); EXT = auto(); VIEW = auto()  # noqa: E702
Op = Union[UnaryOps, BinaryOps, TernaryOps, ReduceOps, BufferOps, MetaOps]

# ops with f(0) != 0: zero padding pushed through them changes the result
UNSAFE_PAD_OPS = {UnaryOps.RECIP, UnaryOps.LOG2, UnaryOps.EXP2, BinaryOps.IDIV}
COMPARISON_OPS = {BinaryOps.CMPLT, BinaryOps.CMPNE}

@dataclass(frozen=True)
class MemBuffer:
  """A kernel argument (idx >= 0; outputs first) or, in optimized ASTs, a local buffer (idx < 0)."""
  idx: int
  dtype: DType
  st: ShapeTracker

@dataclass(frozen=True)
class ConstBuffer:
  """A constant broadcast over `st` (masked where the view is invalid); val may be a Variable."""
  val: Union[int, float, bool, Variable]
  dtype: DType
  st: ShapeTracker

@dataclass(frozen=True)
class KernelInfo:
  local_dims: int = 0
  upcasted: int = 0
  dont_use_locals: bool = False

@dataclass(frozen=True, eq=False)
class LazyOp:
  op: Op
  src: tuple["LazyOp", ...] = ()
  arg: Any = None
  _hash: int = field(init=False, repr=False, compare=False)
  def __post_init__(self):
    object.__setattr__(self, "src", tuple(self.src))
    object.__setattr__(self, "_hash", hash((self.op, self.src, self.arg)))
  def __hash__(self) -> int: return self._hash
  def __eq__(self, other: object) -> bool:
    if self is other: return True
    return isinstance(other, LazyOp) and self._hash == other._hash and self.op == other.op and self.arg == other.arg and self.src == other.src

  @functools.cached_property
  def dtype(self) -> DType:
    if self.op in (BufferOps.LOAD, BufferOps.CONST, BufferOps.STORE): return self.arg.dtype
    if self.op in (UnaryOps.CAST, UnaryOps.BITCAST): return self.arg
    if self.op in COMPARISON_OPS: return dtypes.bool
    if self.op is TernaryOps.WHERE: return self.src[1].dtype
    if self.op is ReduceOps.WMMA: return self.arg[3] if isinstance(self.arg, tuple) and len(self.arg) > 3 else self.src[0].dtype
    if self.op is MetaOps.KERNEL: return dtypes.void
    return self.src[0].dtype

  @functools.cached_property
  def lazyops(self) -> list["LazyOp"]:
    """All ops in the tree, deduplicated, in pre-order."""
    seen: dict[LazyOp, None] = {}
    stack = [self]
    while stack:
      x = stack.pop()
      if x in seen: continue
      seen[x] = None
      stack.extend(reversed(x.src))
    return list(seen)

  @property
  def full_shape(self) -> tuple[sint, ...]:
    """The largest extent of each dim over all leaves (the kernel's iteration space)."""
    sts = [x.arg.st for x in self.lazyops if x.op in BufferOps]
    if not sts: return ()
    return tuple(max(dims, key=lambda d: d if isinstance(d, int) else d.vmax) for dims in zip(*[st.shape for st in sts]))

  def vars(self) -> set[Variable]:
    out: set[Variable] = set()
    for x in self.lazyops:
      if x.op in BufferOps:
        out |= x.arg.st.vars()
        if x.op is BufferOps.CONST and isinstance(x.arg.val, Variable): out.add(x.arg.val)
    return out

  @functools.cached_property
  def key(self) -> bytes:
    """A stable content hash (same across processes) used as a cache key."""
    return hashlib.sha256(repr(self).encode()).digest()

  def __repr__(self) -> str: return _render_tree(self, 0, {})

def _render_tree(x: LazyOp, indent: int, seen: dict) -> str:
  pad = "  " * indent
  if x.op in (BufferOps.LOAD, BufferOps.CONST):
    return f"{pad}{x.op.name} {x.arg!r}"
  head = f"{pad}{x.op.name}" + (f" {x.arg!r}" if x.arg is not None and x.op is not BufferOps.STORE else "")
  if x.op is BufferOps.STORE: head += f" {x.arg!r}"
  return head + "\n" + "\n".join(_render_tree(s, indent + 1, seen) for s in x.src)

class InvalidASTError(ValueError):
  """An AST that breaks the rules in the module docstring; the message names the rule."""

def verify_ast(ast: LazyOp) -> dict[LazyOp, ShapeTracker]:
  """Check that `ast` is a valid kernel; return the ShapeTracker (shape) at every op, so each
  reduce's input shape is at its source and its output shape at the reduce itself."""
  if ast.op is not MetaOps.KERNEL: raise InvalidASTError(f"the root must be KERNEL, got {ast.op.name}")
  if not ast.src: raise InvalidASTError("a kernel needs at least one STORE")
  for i, out in enumerate(ast.src):
    if out.op is not BufferOps.STORE: raise InvalidASTError(f"kernel output {i} is {out.op.name}, not STORE")
    if not isinstance(out.arg, MemBuffer) or out.arg.idx != i:
      raise InvalidASTError(f"kernel output {i} stores to buffer {getattr(out.arg, 'idx', out.arg)}: outputs must be numbered 0..{len(ast.src)-1} in order")
  sts: dict[LazyOp, ShapeTracker] = {}
  def visit(op: LazyOp) -> ShapeTracker:
    if op in sts: return sts[op]
    if op.op in (BufferOps.LOAD, BufferOps.CONST):
      if op.src: raise InvalidASTError(f"{op.op.name} must be a leaf")
      if op.op is BufferOps.LOAD and not isinstance(op.arg, MemBuffer): raise InvalidASTError("LOAD needs a MemBuffer arg")
      if op.op is BufferOps.CONST and not isinstance(op.arg, ConstBuffer): raise InvalidASTError("CONST needs a ConstBuffer arg")
      if op.op is BufferOps.LOAD and op.arg.idx < len(ast.src) and op.arg.idx >= 0 and \
          any(o.arg.idx == op.arg.idx for o in ast.src) and op.arg.st != ast.src[op.arg.idx].arg.st:
        raise InvalidASTError(f"buffer {op.arg.idx} is loaded through a different view than it is stored: the kernel would race on it")
      sts[op] = op.arg.st
      return op.arg.st
    src_sts = [visit(s) for s in op.src]
    if op.op is MetaOps.KERNEL: return src_sts[0]
    shapes = [st.shape for st in src_sts]
    for s in shapes[1:]:
      if s != shapes[0]:
        broadcastable = len(s) == len(shapes[0]) and all(a == b or a == 1 or b == 1 for a, b in zip(s, shapes[0]))
        kind = "implicit expand" if broadcastable else "implicit reshape"
        raise InvalidASTError(f"{kind}: {op.op.name} has sources of shapes {shapes}; every source of an op must have the same shape")
    if op.op in ReduceOps:
      axes = op.arg if op.op is not ReduceOps.WMMA else op.arg[-1]
      if not isinstance(axes, tuple) or any(not isinstance(a, int) or not 0 <= a < len(shapes[0]) for a in axes):
        raise InvalidASTError(f"{op.op.name} axes {axes} are not valid axes of shape {shapes[0]}")
      st = ShapeTracker.from_shape(src_sts[0].reduce(axes))
    elif op.op is BufferOps.STORE:
      if op.arg.st.shape != shapes[0]:
        raise InvalidASTError(f"implicit reshape: STORE of shape {shapes[0]} into buffer {op.arg.idx} viewed as {op.arg.st.shape}")
      st = op.arg.st
    else:
      _check_dtypes(op)
      st = src_sts[0]
    sts[op] = st
    return st
  for out in ast.src: visit(out)
  out_shapes = [sts[o].shape for o in ast.src]
  if any(_numel(s) != _numel(out_shapes[0]) or len(s) != len(out_shapes[0]) for s in out_shapes):
    raise InvalidASTError(f"mismatched output sizes: the kernel's STOREs have shapes {out_shapes}")
  # every dim across the kernel is 1 or one common size
  full = [st.shape for st in sts.values()]
  for d in range(len(full[0])):
    sizes = {s[d] for s in full if len(s) > d} - {1}
    if len({s for s in sizes}) > 1:
      raise InvalidASTError(f"dimension {d} has sizes {sorted(map(str, sizes))} in one kernel: each dim must be 1 or one common size")
  if any(len(s) != len(full[0]) for s in full): raise InvalidASTError("implicit reshape: the kernel's views have different ranks")
  return sts

def _numel(shape: tuple) -> Any:
  n: Any = 1
  for s in shape: n = n * s
  return n

def _check_dtypes(op: LazyOp) -> None:
  if op.op in (UnaryOps.CAST, UnaryOps.BITCAST):
    if op.op is UnaryOps.BITCAST and op.arg.itemsize != op.src[0].dtype.itemsize:
      raise InvalidASTError(f"BITCAST {op.src[0].dtype} -> {op.arg}: sizes differ")
    return
  if op.op is TernaryOps.WHERE:
    if op.src[0].dtype != dtypes.bool: raise InvalidASTError(f"WHERE condition must be bool, got {op.src[0].dtype}")
    vals = op.src[1:]
  else: vals = op.src
  if len({s.dtype for s in vals}) > 1:
    raise InvalidASTError(f"{op.op.name} mixes dtypes {[s.dtype for s in vals]}: cast explicitly")

def is_sym(x: Any) -> bool: return isinstance(x, Node)
