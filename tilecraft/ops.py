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
from tilecraft.dtype import DType, ImageDType, dtypes
from tilecraft.shape.shapetracker import ShapeTracker
from tilecraft.shape.symbolic import Variable, sint

class UnaryOps(Enum): EXP2 = auto(); LOG2 = auto(); CAST = auto(); BITCAST = auto(); SIN = auto(); SQRT = auto(); NEG = auto(); RECIP = auto()  # noqa: E702
class BinaryOps(Enum):
  ADD = auto(); MUL = auto(); IDIV = auto(); MAX = auto(); MOD = auto(); CMPLT = auto(); CMPNE = auto(); XOR = auto()  # noqa: E702
  SHL = auto(); SHR = auto(); OR = auto(); AND = auto(); SUB = auto(); THREEFRY = auto()  # noqa: E702
class TernaryOps(Enum): WHERE = auto(); MULACC = auto()  # noqa: E702
class ReduceOps(Enum): SUM = auto(); MAX = auto(); WMMA = auto()  # noqa: E702
class BufferOps(Enum): LOAD = auto(); CONST = auto(); STORE = auto()  # noqa: E702
class MetaOps(Enum): KERNEL = auto(); COPY = auto(); EMPTY = auto(); CONTIGUOUS = auto(); ASSIGN = auto(); EXT = auto(); VIEW = auto()  # noqa: E702
Op = Union[UnaryOps, BinaryOps, TernaryOps, ReduceOps, BufferOps, MetaOps]
# members are singletons compared by identity: hash them by identity too (Enum's name hash is a
# Python-level call, and op enums are hashed in every UOp and pattern lookup of code generation)
for _e in (UnaryOps, BinaryOps, TernaryOps, ReduceOps, BufferOps, MetaOps): _e.__hash__ = object.__hash__  # type: ignore[method-assign]

# ops with f(0) != 0: zero padding pushed through them changes the result
UNSAFE_PAD_OPS = {UnaryOps.RECIP, UnaryOps.LOG2, UnaryOps.EXP2, BinaryOps.IDIV}
COMPARISON_OPS = {BinaryOps.CMPLT, BinaryOps.CMPNE}

@dataclass(frozen=True)
class MemBuffer:
  """A kernel argument (idx >= 0; outputs first) or, in optimized ASTs, a local buffer (idx < 0)."""
  idx: int
  dtype: DType
  st: ShapeTracker

class _Index:
  """The value of an index constant: each element is its own flat index in the constant's
  ShapeTracker (arange, and the counters behind rand): an index expression, no reduce, no memory."""
  __slots__ = ()
  _it: Optional["_Index"] = None
  def __new__(cls) -> "_Index":
    if cls._it is None: cls._it = object.__new__(cls)
    return cls._it
  def __repr__(self) -> str: return "INDEX"
  def __reduce__(self) -> tuple: return (_Index, ())

INDEX = _Index()

def is_index_const(x: Any) -> bool:
  """A CONST LazyOp (or its ConstBuffer) whose value is the element's index."""
  cb = x.arg if isinstance(x, LazyOp) else x
  return isinstance(cb, ConstBuffer) and cb.val is INDEX

def _const_key(val: Any) -> Any:
  """What makes two constants the same: type and value, with -0.0 != 0.0 and every NaN alike."""
  if isinstance(val, float): return (float, repr(val))
  return (type(val), val)

@dataclass(frozen=True, eq=False)
class ConstBuffer:
  """A constant broadcast over `st` (masked where the view is invalid); val may be a Variable, or
  INDEX: then each element's value is its flat index through `st` (cast to dtype), 0 where masked."""
  val: Union[int, float, bool, Variable, _Index]
  dtype: DType
  st: ShapeTracker
  def __eq__(self, other: object) -> bool:
    return self is other or (isinstance(other, ConstBuffer) and _const_key(self.val) == _const_key(other.val) and
                             self.dtype == other.dtype and self.st == other.st)
  def __hash__(self) -> int: return hash((_const_key(self.val), self.dtype, self.st))

@dataclass(frozen=True)
class KernelInfo:
  """What an optimized kernel AST (Kernel.get_optimized_ast) says about its layout beyond its leaves'
  views, which give its full and output shape (so where the reduce axes start). Its axes run
  global | local | group | reduce | unrolled | upcast; lowering reads nothing else of the Kernel."""
  local_dims: int = 0             # thread (workgroup) axes before the first reduce axis
  upcasted: int = 0               # the last `upcasted` axes are lanes (upcast or unrolled)
  dont_use_locals: bool = False   # NOLOCALS: one flat global id, the runtime picks the workgroup
  group_for_reduces: int = 0      # grouped-reduce (and UPCASTMID) axes right after the first reduce axis
  reduce_block: bool = False      # BLOCK: the first reduce axis counts blocks of the reduce (a CPU loop around the inner output loops)
  tc_use: int = 0                 # use_tensor_cores of the TC opt (0: no tensor core)
  packed: tuple[int, ...] = ()    # PACK: input buffers (argument numbers) read through a packed stack array

_SAME_DTYPE_AS = {TernaryOps.WHERE: 1}  # dtype comes from this source (default: the first)

@dataclass(frozen=True, eq=False)
class LazyOp:
  op: Op
  src: tuple["LazyOp", ...] = ()
  arg: Any = None
  _hash: int = field(init=False, repr=False, compare=False)
  def __post_init__(self):
    object.__setattr__(self, "src", tuple(self.src))
    if not all(isinstance(s, LazyOp) for s in self.src): raise TypeError(f"{self.op}: sources must be LazyOps, got {self.src!r}")
    object.__setattr__(self, "_hash", hash((self.op, self.src, self.arg)))
  def __hash__(self) -> int: return self._hash
  # rebuilt through the constructor on unpickling: the cached hash is per process (salted string hashes)
  def __reduce__(self) -> tuple: return (LazyOp, (self.op, self.src, self.arg))
  def __eq__(self, other: object) -> bool:
    """Structural equality, iterative and linear in the size of a DAG (shared subtrees compare once)."""
    if self is other: return True
    if not isinstance(other, LazyOp): return False
    done: set[tuple[int, int]] = set()
    stack: list[tuple[LazyOp, LazyOp]] = [(self, other)]
    while stack:
      a, b = stack.pop()
      if a is b or (id(a), id(b)) in done: continue
      if a._hash != b._hash or a.op != b.op or len(a.src) != len(b.src) or a.arg != b.arg: return False
      done.add((id(a), id(b)))
      stack.extend(zip(a.src, b.src))
    return True

  @functools.cached_property
  def dtype(self) -> DType:
    # walk down the chain of ops that take their dtype from a source (no recursion: ASTs can be deep)
    chain: list[LazyOp] = []
    x: LazyOp = self
    while (dt := _own_dtype(x)) is None:
      if "dtype" in x.__dict__: dt = x.__dict__["dtype"]; break  # noqa: E702
      if not x.src: raise ValueError(f"{x.op} has no sources to take a dtype from")
      chain.append(x)
      x = x.src[_SAME_DTYPE_AS.get(x.op, 0)]  # type: ignore[call-overload]
    for y in chain: y.__dict__["dtype"] = dt
    return dt

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
    """A stable content hash (the same in every process) used as a cache key."""
    h = hashlib.sha256()
    for line in _serialize(self): h.update(line.encode() + b"\n")
    return h.digest()

  def __repr__(self) -> str: return _render_tree(self)

def _own_dtype(x: LazyOp) -> Optional[DType]:
  """The dtype an op sets itself, or None when it takes the dtype of a source."""
  if x.op in BufferOps: return _base(x.arg.dtype)  # an image holds (and its loads give) plain channel values
  if x.op in (UnaryOps.CAST, UnaryOps.BITCAST): return x.arg
  if x.op in COMPARISON_OPS: return dtypes.bool
  if x.op is ReduceOps.WMMA and isinstance(x.arg, tuple) and len(x.arg) > 3 and isinstance(x.arg[3], DType): return x.arg[3]
  if x.op is MetaOps.KERNEL: return dtypes.void
  return None

def _postorder(root: LazyOp) -> list[LazyOp]:
  """Every distinct op once, sources before users."""
  order: list[LazyOp] = []
  seen: set[LazyOp] = set()
  stack: list[tuple[LazyOp, bool]] = [(root, False)]
  while stack:
    x, expanded = stack.pop()
    if expanded: order.append(x); continue  # noqa: E702
    if x in seen: continue
    seen.add(x)
    stack.append((x, True))
    stack.extend((s, False) for s in reversed(x.src))
  return order

def _serialize(root: LazyOp) -> list[str]:
  """One line per distinct op (sources referred to by position): linear in the DAG's size."""
  order = _postorder(root)
  pos = {x: i for i, x in enumerate(order)}
  return [f"{x.op.__class__.__name__}.{x.op.name} {x.arg!r} <- {[pos[s] for s in x.src]}" for x in order]

def _render_tree(root: LazyOp) -> str:
  """An indented tree, one op per line. A non-leaf op used more than once is printed in full the first
  time, tagged `[n]`, and referred to as `<n>` afterwards."""
  uses: dict[LazyOp, int] = {}
  for x in _postorder(root):
    for s in x.src: uses[s] = uses.get(s, 0) + 1
  tags: dict[LazyOp, int] = {}
  lines: list[str] = []
  stack: list[tuple[LazyOp, int]] = [(root, 0)]
  while stack:
    x, depth = stack.pop()
    pad = "  " * depth
    if x in tags: lines.append(f"{pad}<{tags[x]}> {x.op.name}"); continue  # noqa: E702
    tag = ""
    if x.src and uses.get(x, 0) > 1:
      tags[x] = len(tags)
      tag = f"[{tags[x]}] "
    lines.append(f"{pad}{tag}{x.op.name}" + (f" {x.arg!r}" if x.arg is not None else ""))
    stack.extend((s, depth + 1) for s in reversed(x.src))
  return "\n".join(lines)

class InvalidASTError(ValueError):
  """An AST that breaks the rules in the module docstring; the message names the rule."""

def _base(dt: DType) -> DType: return dt.base if isinstance(dt, ImageDType) else dt

def verify_ast(ast: LazyOp) -> dict[LazyOp, ShapeTracker]:
  """Check that `ast` is a valid kernel; return the ShapeTracker (shape) at every op, so each
  reduce's input shape is at its source and its output shape at the reduce itself.

  Optimized ASTs may also hold a grouped reduce's two stages: STORE to a local buffer (idx < 0)
  and LOAD(that STORE) back; the LOAD then has the shape of the stored value."""
  if not isinstance(ast, LazyOp): raise InvalidASTError(f"not a LazyOp: {ast!r}")
  if ast.op is not MetaOps.KERNEL: raise InvalidASTError(f"the root must be KERNEL, got {ast.op.name}")
  if not ast.src: raise InvalidASTError("a kernel needs at least one STORE")
  for i, out in enumerate(ast.src):
    if out.op is not BufferOps.STORE: raise InvalidASTError(f"kernel output {i} is {out.op.name}, not STORE")
    if not isinstance(out.arg, MemBuffer) or out.arg.idx != i:
      raise InvalidASTError(f"wrong output index: kernel output {i} stores to buffer {getattr(out.arg, 'idx', out.arg)}; "
                            f"outputs must be numbered 0..{len(ast.src)-1} in order")
  out_idx = {o.arg.idx: o.arg.st for o in ast.src}
  sts: dict[LazyOp, ShapeTracker] = {}
  # per op: the shapes of reduced values broadcast into it (a dependent reduce, see _verify_op)
  bcast: dict[LazyOp, frozenset] = {}
  for op in _postorder(ast):
    if op is ast: continue
    if op.op is MetaOps.KERNEL: raise InvalidASTError("KERNEL may only be the root")
    sts[op] = _verify_op(op, sts, out_idx, bcast)
  out_shapes = [sts[o].shape for o in ast.src]
  if any(len(s) != len(out_shapes[0]) or not all(_same(a, b) for a, b in zip(s, out_shapes[0])) for s in out_shapes):
    raise InvalidASTError(f"mismatched output sizes: the kernel's STOREs have shapes {out_shapes}; all outputs must have one shape")
  # every dim across the kernel is 1 or one common size
  shapes = [st.shape for st in sts.values()]
  if any(len(s) != len(shapes[0]) for s in shapes):
    raise InvalidASTError(f"implicit reshape: the kernel's views have different ranks {sorted({len(s) for s in shapes})}")
  for d in range(len(shapes[0])):
    sizes = {s[d] for s in shapes if not _same(s[d], 1)}
    if len(sizes) > 1:
      raise InvalidASTError(f"mismatched sizes: dimension {d} has sizes {sorted(map(str, sizes))} in one kernel; each dim must be 1 or one common size")
  return sts

def _same(a: sint, b: sint) -> bool: return (a == b) if isinstance(a, int) == isinstance(b, int) else False

def _verify_op(op: LazyOp, sts: dict[LazyOp, ShapeTracker], out_idx: dict[int, ShapeTracker], bcast: dict[LazyOp, frozenset]) -> ShapeTracker:
  name = op.op.name
  bcast[op] = frozenset().union(*[bcast[s] for s in op.src]) if op.src and op.op not in ReduceOps else frozenset()
  if op.op in (BufferOps.LOAD, BufferOps.CONST):
    want = MemBuffer if op.op is BufferOps.LOAD else ConstBuffer
    if not isinstance(op.arg, want): raise InvalidASTError(f"{name} needs a {want.__name__} arg, got {op.arg!r}")
    if op.src:
      # a grouped reduce's second stage reads back what the first stored in a local buffer
      if not (op.op is BufferOps.LOAD and op.arg.idx < 0 and len(op.src) == 1 and op.src[0].op is BufferOps.STORE and op.src[0].arg == op.arg):
        raise InvalidASTError(f"{name} must be a leaf (only a LOAD of a local buffer may follow the STORE into it)")
      return sts[op.src[0]]
    if op.op is BufferOps.LOAD and op.arg.idx in out_idx and op.arg.st != out_idx[op.arg.idx]:
      raise InvalidASTError(f"buffer {op.arg.idx} is loaded through a different view than it is stored: the kernel would race on it")
    return op.arg.st
  src_sts = [sts[s] for s in op.src]
  if not src_sts: raise InvalidASTError(f"{name} needs sources")
  shapes = [st.shape for st in src_sts]
  if any(s != shapes[0] for s in shapes[1:]):
    # a dependent reduce: a value computed by a reduce may be broadcast over that reduce's axes into
    # the source of another reduce over the same axes (softmax's sum(exp(x - max(x)))); the enclosing
    # reduce checks the axes, and nothing broadcast may reach a STORE
    full = max(shapes, key=lambda s: sum(not _same(d, 1) for d in s))
    for s, src in zip(shapes, op.src):
      if s == full: continue
      broadcastable = len(s) == len(full) and all(_same(a, b) or _same(a, 1) for a, b in zip(s, full))
      if broadcastable and op.op not in ReduceOps and op.op not in BufferOps and any(x.op in ReduceOps for x in src.lazyops):
        bcast[op] = bcast[op] | {s}
        continue
      kind = "implicit expand" if broadcastable or (len(s) == len(full) and all(_same(a, b) or _same(b, 1) for a, b in zip(s, full))) else "implicit reshape"
      raise InvalidASTError(f"{kind}: {name} has sources of shapes {shapes}; every source of an op must have the same shape "
                            "(only a reduced value may be broadcast, into another reduce over the same axes)")
    src_sts = [src_sts[shapes.index(full)]]
    shapes = [full]
  if op.op in ReduceOps:
    axes = op.arg[-1] if op.op is ReduceOps.WMMA and isinstance(op.arg, tuple) and op.arg else op.arg
    if not isinstance(axes, tuple) or any(isinstance(a, bool) or not isinstance(a, int) or not 0 <= a < len(shapes[0]) for a in axes) \
        or len(set(axes)) != len(axes):
      raise InvalidASTError(f"bad reduce axes: {name} axes {axes!r} must be a tuple of distinct axes of shape {shapes[0]}")
    if op.op is not ReduceOps.WMMA and len(op.src) != 1: raise InvalidASTError(f"{name} reduces one source, got {len(op.src)}")
    out = src_sts[0].reduce(axes)
    if bad := [s for s in bcast[op.src[0]] if s != out]:
      raise InvalidASTError(f"implicit expand: a reduced value of shape {bad[0]} is broadcast into {name} over axes {axes} of shape {shapes[0]}; "
                            f"a value may only be broadcast into a reduce over the axes it was reduced over (shape {out})")
    if op.op is ReduceOps.WMMA and bcast[op.src[0]]: raise InvalidASTError("WMMA: no broadcast reduced values in its operands")
    return ShapeTracker.from_shape(out)
  if op.op is BufferOps.STORE:
    if not isinstance(op.arg, MemBuffer): raise InvalidASTError(f"STORE needs a MemBuffer arg, got {op.arg!r}")
    if bcast[op]: raise InvalidASTError(f"implicit expand: a reduced value of shape {sorted(bcast[op])[0]} is broadcast into a STORE of shape {shapes[0]}; "
                                        "a reduced value may only be broadcast into another reduce over its axes")
    if len(op.src) != 1: raise InvalidASTError(f"STORE stores one value, got {len(op.src)}")
    if _base(op.src[0].dtype) != _base(op.arg.dtype):
      raise InvalidASTError(f"mixed dtypes: STORE of a {op.src[0].dtype} value into a {op.arg.dtype} buffer; cast explicitly")
    if op.arg.idx < 0:  # a local buffer holds a slice of the value (globals dropped): sizes must agree where kept
      if len(op.arg.st.shape) != len(shapes[0]) or any(not (_same(a, b) or _same(a, 1)) for a, b in zip(op.arg.st.shape, shapes[0])):
        raise InvalidASTError(f"implicit reshape: STORE of shape {shapes[0]} into local buffer {op.arg.idx} viewed as {op.arg.st.shape}")
      return src_sts[0]
    if op.arg.st.shape != shapes[0]:
      raise InvalidASTError(f"implicit reshape: STORE of shape {shapes[0]} into buffer {op.arg.idx} viewed as {op.arg.st.shape}")
    return op.arg.st
  _check_dtypes(op)
  return src_sts[0]

def _check_dtypes(op: LazyOp) -> None:
  if op.op in (UnaryOps.CAST, UnaryOps.BITCAST):
    if not isinstance(op.arg, DType): raise InvalidASTError(f"{op.op.name} needs the target dtype as arg, got {op.arg!r}")
    if op.op is UnaryOps.BITCAST and op.arg.itemsize != op.src[0].dtype.itemsize:
      raise InvalidASTError(f"BITCAST {op.src[0].dtype} -> {op.arg}: sizes differ")
    return
  if op.op is TernaryOps.WHERE:
    if len(op.src) != 3: raise InvalidASTError(f"WHERE takes 3 sources, got {len(op.src)}")
    if op.src[0].dtype != dtypes.bool: raise InvalidASTError(f"mixed dtypes: WHERE condition must be bool, got {op.src[0].dtype}")
    vals = op.src[1:]
  else: vals = op.src
  if len({_base(s.dtype) for s in vals}) > 1:
    raise InvalidASTError(f"mixed dtypes: {op.op.name} mixes {[s.dtype for s in vals]}; cast explicitly")

