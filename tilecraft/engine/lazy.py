"""The lazy graph: what a Tensor holds until it is realized.

A LazyBuffer is either a *base* (an op over source views, or data already in a Buffer) or a
*view* of a base through a ShapeTracker. Movement ops only make new views, so they cost nothing
and end up folded into the loads of whichever kernel reads them.
"""
from __future__ import annotations
import struct, weakref
from typing import Any, Callable, Optional, Sequence, Union
from tilecraft.device import Buffer
from tilecraft.dtype import DType, dtypes
from tilecraft.helpers import SPLIT_REDUCE, prod
from tilecraft.ops import BinaryOps, BufferOps, MetaOps, Op, ReduceOps, UnaryOps
from tilecraft.shape.shapetracker import ShapeTracker
from tilecraft.shape.symbolic import Node, Variable, sint

class LazyBuffer:
  # (slots: a user's loop makes a few dozen of these per call; a view has only the first five)
  __slots__ = ("device", "st", "dtype", "shape", "_base", "op", "arg", "srcs", "buffer", "forced_realize", "consed_key", "image", "replayed",
               "__weakref__")
  def __init__(self, device: str, st: ShapeTracker, dtype: DType, op: Optional[Op] = None, arg: Any = None,
               srcs: tuple["LazyBuffer", ...] = (), base: Optional["LazyBuffer"] = None, shape: Optional[tuple[sint, ...]] = None):
    self.device, self.st, self.dtype = device, st, dtype
    self.shape: tuple[sint, ...] = st.views[-1].shape if shape is None else shape  # (shape: st.shape, when the caller knows it)
    self._base = base
    if base is None:
      self.op, self.arg, self.srcs = op, arg, srcs
      self.buffer: Any = None  # a device Buffer once realized (or for data that came from outside)
      self.forced_realize = False
      self.consed_key: Optional[tuple] = None  # its key in the hash-consing table, if it is in there
      self.image: Optional[DType] = None  # an ImageDType: its buffer is that image (values: dtype), see to_image
      self.replayed: Any = None  # (recipe, its nodes) when a frontend recipe made this base (frontend/recipes.py)
    else:
      assert base._base is None, "a view's base must be a base"

  @property
  def base(self) -> "LazyBuffer": return self._base if self._base is not None else self
  @property
  def is_view(self) -> bool: return self._base is not None
  @property
  def realized(self) -> bool: return self.base.buffer is not None and self.base.op is None
  @property
  def size(self) -> sint: return self.st.size
  def mark_realized(self) -> None:
    """Its kernel ran: from now on the value is the data in its buffer, which later schedules read
    instead of recomputing it. It leaves the hash-consing table (its sources are dropped)."""
    b = self._base if self._base is not None else self
    if b.op is None or b.op is BufferOps.CONST or b.buffer is None or not hasattr(b.buffer, "_buf"): return  # (not allocated)
    if (key := b.consed_key) is not None and (r := _consed.get(key)) is not None and r() is b: del _consed[key]
    b.op, b.arg, b.srcs, b.replayed = None, None, (), None
  def __repr__(self) -> str:
    b = self.base
    what = "realized" if b.op is None else (b.op.name if hasattr(b.op, "name") else str(b.op))
    return f"<LB {self.device} {self.shape} {self.dtype} {what}{' view' if self.is_view else ''}>"

  # ---- constructors -------------------------------------------------------------------------------
  @staticmethod
  def from_buffer(buf: Any, shape: tuple[sint, ...], dtype: DType, device: str) -> "LazyBuffer":
    lb = LazyBuffer(device, ShapeTracker.from_shape(shape), dtype)
    lb.buffer = buf
    return lb
  @staticmethod
  def const(val: Union[int, float, bool, Variable], dtype: DType, device: str, shape: tuple[sint, ...] = ()) -> "LazyBuffer":
    """A constant broadcast to `shape` (a view of a 0-d CONST: free until used)."""
    if not isinstance(val, Variable): val = dtypes.as_const(val, dtype)
    base = LazyBuffer(device, ShapeTracker.from_shape(()), dtype, BufferOps.CONST, val)
    return base._view(base.st.reshape((1,) * len(shape)).expand(shape)) if shape else base
  @staticmethod
  def index(n: int, dtype: DType, device: str) -> "LazyBuffer":
    """0, 1, ..., n-1 as an index constant (ops.INDEX): views of it fold into each kernel's index math."""
    from tilecraft.ops import INDEX
    return LazyBuffer(device, ShapeTracker.from_shape((n,)), dtype, BufferOps.CONST, INDEX)
  @staticmethod
  def op_of(op: Op, srcs: tuple["LazyBuffer", ...], arg: Any = None, dtype: Optional[DType] = None) -> "LazyBuffer":
    out_dtype = dtype or (dtypes.bool if op is BinaryOps.CMPLT or op is BinaryOps.CMPNE else srcs[-1].dtype)
    s0 = srcs[0]
    return LazyBuffer(s0.device, s0.st if s0._base is None else ShapeTracker.from_shape(s0.shape), out_dtype, op, arg, srcs)  # (a base's view is its shape's)

  # ---- ops ----------------------------------------------------------------------------------------
  def e(self, op: Op, *others: "LazyBuffer", arg: Any = None, dtype: Optional[DType] = None) -> "LazyBuffer":
    srcs = (self,) + others
    for s in others:
      if s.shape != self.shape: raise ValueError(f"{op.name}: shapes {[x.shape for x in srcs]} differ (broadcast first)")
    if op is UnaryOps.CAST and dtype is None: dtype = arg
    # fold constant-only ops right here: a CONST through an elementwise op stays a CONST
    return LazyBuffer.op_of(op, srcs, arg, dtype)
  def cast(self, dtype: DType, bitcast: bool = False) -> "LazyBuffer":
    if self.dtype == dtype: return self
    return self.e(UnaryOps.BITCAST if bitcast else UnaryOps.CAST, arg=dtype, dtype=dtype)
  def r(self, op: ReduceOps, axis: tuple[int, ...]) -> "LazyBuffer":
    new_shape = tuple(1 if i in axis else s for i, s in enumerate(self.shape))
    if not axis or all(self.shape[i] == 1 for i in axis): return self._view(self.st.reshape(new_shape)) if new_shape != self.shape else self
    if (split := self._split_reduce(op, axis, new_shape)) is not None: return split
    return LazyBuffer(self.device, ShapeTracker.from_shape(new_shape), self.dtype, op, tuple(sorted(axis)), (self,))

  def _split_reduce(self, op: ReduceOps, axis: tuple[int, ...], new_shape: tuple) -> Optional["LazyBuffer"]:
    """A long reduce into a small output runs as two kernels: partial reduces over chunks (in
    parallel across cores or workgroups), then a short reduce of the partials (plus one for the
    remainder where no chunk count divides the axis)."""
    out_size, red = prod(new_shape), prod(self.shape[i] for i in axis)
    if not SPLIT_REDUCE or any(isinstance(x, Node) for x in self.shape) or out_size > 16 or red < 1 << 15: return None
    # split the largest reduced axis into (chunks, rest) with as many chunks as fit 256
    ax = max(axis, key=lambda i: self.shape[i])
    n = self.shape[ax]
    chunks = next((c for c in (256, 128, 64, 32, 16, 8) if n % c == 0 and n // c >= 256), None)
    if chunks is None:
      # no chunk count divides the axis (a prime length, a vocabulary of 50257): its first c * (n // c) elements are
      # split as above and the rest, fewer than c, reduced apart, the two results combined; left whole it was one
      # thread's scalar loop (a sum of 1000003 floats 7.6x slower than of 1000000)
      combine = {ReduceOps.SUM: BinaryOps.ADD, ReduceOps.MAX: BinaryOps.MAX}.get(op)
      c = next((c for c in (256, 128, 64, 32, 16, 8) if n // c >= 256), None)
      if combine is None or c is None: return None
      cut = c * (n // c)
      def part(lo: int, hi: int) -> "LazyBuffer": return self.shrink(tuple((lo, hi) if i == ax else (0, s) for i, s in enumerate(self.shape)))
      return part(0, cut).r(op, axis).e(combine, part(cut, n).r(op, axis))
    x = self.reshape(self.shape[:ax] + (chunks, n // chunks) + self.shape[ax + 1:])
    inner = tuple(a + (a > ax) for a in axis if a != ax) + (ax + 1,)
    partial = x.r(op, inner).contiguous()
    return partial.r(op, (ax,) + tuple(a + (a > ax) for a in axis if a != ax)).reshape(new_shape)
  def copy_to(self, device: str) -> "LazyBuffer":
    src = self.contiguous()
    return LazyBuffer(device, ShapeTracker.from_shape(self.shape), self.dtype, MetaOps.COPY, None, (src,))
  def contiguous(self) -> "LazyBuffer":
    """A base holding exactly this view's elements (a copy kernel if it is a strided view)."""
    if not self.is_view and self.base.op is not BufferOps.CONST:
      self.forced_realize = True
      return self
    if self.st.contiguous and self.base.st.size == self.st.size and self.base.op is not BufferOps.CONST:
      self.base.forced_realize = True
      return self
    out = LazyBuffer(self.device, ShapeTracker.from_shape(self.shape), self.dtype, MetaOps.CONTIGUOUS, None, (self,))
    out.forced_realize = True
    return out

  def to_image(self, img: DType) -> "LazyBuffer":
    """A new base holding this view's elements in an image buffer of dtype img (an ImageDType of as
    many elements); its values keep this dtype, so only the kernels' buffer accesses change."""
    out = LazyBuffer(self.device, ShapeTracker.from_shape(self.shape), self.dtype, MetaOps.CONTIGUOUS, None, (self,))
    out.forced_realize, out.image = True, img
    return out

  # ---- movement ops (views) -----------------------------------------------------------------------
  def _view(self, st: ShapeTracker) -> "LazyBuffer":
    base = self._base if self._base is not None else self
    shape = st.views[-1].shape
    if 0 in shape and base.op is not None and base.op is not BufferOps.CONST:  # (a symbolic dim never equals an int: no int 0 dim, no 0 size)
      return LazyBuffer.const(0, self.dtype, self.device, shape)  # nothing to compute
    if shape == base.shape and st.contiguous: return base
    return LazyBuffer(self.device, st, self.dtype, base=base)
  def reshape(self, shape: tuple[sint, ...]) -> "LazyBuffer": return self._view(self.st.reshape(shape))
  def permute(self, order: tuple[int, ...]) -> "LazyBuffer": return self._view(self.st.permute(order))
  def expand(self, shape: tuple[sint, ...]) -> "LazyBuffer": return self._view(self.st.expand(shape))
  def pad(self, arg: tuple[tuple[sint, sint], ...]) -> "LazyBuffer": return self._view(self.st.pad(arg))
  def shrink(self, arg: tuple[tuple[sint, sint], ...]) -> "LazyBuffer": return self._view(self.st.shrink(arg))
  def stride(self, arg: tuple[int, ...]) -> "LazyBuffer": return self._view(self.st.stride(arg))

# ---- hash-consing ------------------------------------------------------------------------------
# Identical ops over identical sources share one LazyBuffer, so a subgraph built twice is computed
# once. Keys hold ids of the sources, which the cached value keeps alive; a value that gets
# realized drops its sources, so it leaves the table first (mark_realized). Symbolic views are not
# keyed: Variables bound to different values compare equal.
# The table holds plain weak references (no callbacks: a user's loop adds a dozen entries per call,
# and a WeakValueDictionary's keyed references cost a Python call to make and another to remove).
# Dead entries are swept when the table has doubled since the last sweep. A dead entry's key may
# hold ids that new objects reuse: its reference is dead, so it is a miss and gets replaced; a live
# value keeps its sources alive, so the ids in its key are theirs.
_consed: dict[tuple, "weakref.ref[LazyBuffer]"] = {}
_sweep_at = 1024

def consed(key: tuple) -> Optional[LazyBuffer]:
  """The live LazyBuffer stored under key, if any."""
  return r() if (r := _consed.get(key)) is not None else None

def _sweep() -> None:
  global _sweep_at
  for k in [k for k, r in _consed.items() if r() is None]: del _consed[k]
  _sweep_at = max(1024, 2 * len(_consed))

def source_key(lb: LazyBuffer) -> Optional[tuple]:
  """How a source appears in a key: its base's identity plus the view, or None (not keyable)."""
  if (b := lb._base) is not None:
    if not lb.st.concrete: return None
    return (id(b), lb.st)
  return (id(lb), None)

def hash_consed(key: Optional[tuple], make: Callable[[], LazyBuffer]) -> LazyBuffer:
  """The live, unrealized LazyBuffer stored under key, else make() (stored under key if it is a new
  op). A key whose last item is a tuple of source keys with a None in it is not cached."""
  if key is None or None in key[-1]: return make()
  if (r := _consed.get(key)) is not None and (hit := r()) is not None and not (hit.buffer is not None and hit.op is None): return hit
  ret = make()
  if ret._base is None and ret.op is not None and ret.consed_key is None:
    if len(_consed) >= _sweep_at: _sweep()
    _consed[key] = weakref.ref(ret)
    ret.consed_key = key
  return ret

# ---- the ops a Tensor makes, through one door --------------------------------------------------------
# Every op the frontend builds comes through these: each is hash-consed (its key built here, next to
# the table that stores it), and a zero-element result is an empty buffer, never a kernel.

def lazy_empty(shape: tuple, dt: DType, device: str) -> LazyBuffer:
  """A zero-element value: an empty Buffer, never a kernel."""
  return LazyBuffer.from_buffer(Buffer(device, 0, dt), shape, dt, device)

def _const_key(val: Any) -> Any:
  if isinstance(val, float): return ("f", struct.pack("<d", val))  # tells -0.0 from 0.0, and NaN equals NaN
  return (type(val).__name__, val)

def lazy_const(val: Any, dt: DType, device: str, shape: tuple = ()) -> LazyBuffer:
  """The constant val of dtype dt broadcast to shape (one hash-consed 0-d CONST per value, dtype and device)."""
  if 0 in shape: return lazy_empty(shape, dt, device)  # (a symbolic dim never equals an int)
  if isinstance(val, Node): base = LazyBuffer.const(val, dt, device)
  else:
    val = dtypes.as_const(val, dt)
    base = hash_consed(("CONST", _const_key(val), dt, device, ()), lambda: LazyBuffer.const(val, dt, device))
  return base._view(base.st.reshape((1,) * len(shape)).expand(shape)) if shape else base

def lazy_index(n: int, dt: DType, device: str) -> LazyBuffer:
  """0, 1, ..., n-1 (LazyBuffer.index)."""
  return hash_consed(("INDEX", n, dt, device, ()), lambda: LazyBuffer.index(n, dt, device))

def lazy_e(op: Op, srcs: Sequence[LazyBuffer], arg: Any = None, dtype: Optional[DType] = None) -> LazyBuffer:
  """The elementwise op over srcs (of one shape)."""
  if 0 in srcs[0].shape:
    out = dtype or (arg if op in (UnaryOps.CAST, UnaryOps.BITCAST) else dtypes.bool if op in (BinaryOps.CMPLT, BinaryOps.CMPNE) else srcs[-1].dtype)
    return lazy_empty(srcs[0].shape, out, srcs[0].device)
  return hash_consed((op, arg, dtype, tuple(map(source_key, srcs))), lambda: srcs[0].e(op, *srcs[1:], arg=arg, dtype=dtype))

def lazy_cast(lb: LazyBuffer, dt: DType, bitcast: bool = False) -> LazyBuffer:
  """lb cast (or bitcast) to dt; whether the device computes with dt is the caller's check."""
  if lb.dtype == dt: return lb
  if 0 in lb.shape: return lazy_empty(lb.shape, dt, lb.device)
  return hash_consed(("BITCAST" if bitcast else "CAST", dt, (source_key(lb),)), lambda: lb.cast(dt, bitcast))

def lazy_r(lb: LazyBuffer, op: ReduceOps, axes: tuple[int, ...]) -> LazyBuffer:
  """The reduce op of lb over axes (kept as size-1 dims)."""
  return hash_consed((op, axes, (source_key(lb),)), lambda: lb.r(op, axes))

def lazy_contiguous(lb: LazyBuffer) -> LazyBuffer:
  """A base holding lb's elements (see LazyBuffer.contiguous)."""
  if 0 in lb.shape: return lb
  if not lb.is_view: return lb.contiguous()
  return hash_consed(("CONTIGUOUS", None, (source_key(lb),)), lb.contiguous)
