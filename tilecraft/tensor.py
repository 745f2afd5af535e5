"""Tensor (API): numpy-like array math, lazily fused into kernels.

Every op builds a LazyBuffer graph; nothing runs until `realize()`, `numpy()`, `tolist()` or
`item()`. Semantics follow numpy: broadcasting, dtype promotion, floor division and modulo,
NaN and inf, `axis`/`keepdim` on reductions.
"""
from __future__ import annotations
import functools, math
from typing import Any, Optional, Sequence, Union
import numpy as np
from tilecraft.device import Buffer, Device, DeviceUnavailable, dtype_unsupported
from tilecraft.dtype import DType, dtypes, least_upper_dtype, to_dtype
from tilecraft.engine.lazy import LazyBuffer, lazy_cast, lazy_const, lazy_contiguous, lazy_e, lazy_empty, lazy_index, lazy_r
from tilecraft.engine.realize import realize_lazy
from tilecraft.engine.schedule import ScheduleItem, create_schedule
from tilecraft.frontend.activations import ActivationOps
from tilecraft.frontend.compare import ComparisonOps
from tilecraft.frontend.scan import scan_rows, tree_product
from tilecraft.frontend.image import as_image, image_level
from tilecraft.frontend.indexing import IndexingOps
from tilecraft.frontend.math import MathOps
from tilecraft.frontend.movement import MovementOps
from tilecraft.frontend.nn import NNOps
from tilecraft.frontend.random import RandomOps
from tilecraft.frontend.recipes import recorded
from tilecraft.frontend.shapes import broadcast_shape as _broadcast_shape, norm_shape as _shape, same_dim as _same  # noqa: F401
from tilecraft.helpers import prod
from tilecraft.ops import BinaryOps, BufferOps, ReduceOps, TernaryOps, UnaryOps
from tilecraft.shape.symbolic import Node, Variable, sint, sym_eval, unbind_all

Scalar = Union[int, float, bool]

def _canon_device(device: Optional[str]) -> str:
  """The device's canonical name; it must open here and run kernels (DeviceUnavailable names it and why not)."""
  name = Device.canonicalize(device) if device is not None else Device.DEFAULT
  if (why := Device[name].render_only) is not None:
    raise DeviceUnavailable(f"device {name} is render + compile-check only here ({why}): tensors can't live on it")
  return name

# ---- dtypes a tensor may hold ---------------------------------------------------------------------
_TENSOR_DTYPES = (dtypes.bool, dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16, dtypes.uint32,
                  dtypes.uint64, dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)

def _acc_dtype(dt: DType, acc_dtype: Any) -> DType:
  """The dtype a reduce of `dt` values accumulates in: `acc_dtype` where the user names one, float32
  for float16 and bfloat16 (rounded once at the end: docs/architecture.md, "Beyond DESIGN.md"), else `dt` itself."""
  if acc_dtype is not None: return _tensor_dtype(acc_dtype)
  return dtypes.float32 if dt in (dtypes.float16, dtypes.bfloat16) else dt

def _tensor_dtype(dtype: Union[DType, str]) -> DType:
  """A scalar dtype a Tensor can hold: vectors, pointers, images and void are kernel-internal."""
  dt = to_dtype(dtype)
  if dt not in _TENSOR_DTYPES:
    raise TypeError(f"a Tensor can't hold {dt!r}: tensor dtypes are {', '.join(d.name for d in _TENSOR_DTYPES)}")
  return dt

@functools.lru_cache(maxsize=None)
def _check_dtype(device: str, dt: DType) -> DType:
  if (why := dtype_unsupported(device, dt)) is not None: raise TypeError(f"dtype {dt.name} is not supported on {device}: {why}")
  return dt

# ---- the lazy graph, through one door (engine/lazy.py) ---------------------------------------------

def _is_zero(shape: tuple) -> bool: return 0 in shape  # (a symbolic dim never equals an int)

def _lb_cast(lb: LazyBuffer, dt: DType, bitcast: bool = False) -> LazyBuffer:
  """lb as dt, which the device must compute with."""
  if lb.dtype != dt: _check_dtype(lb.device, dt)
  return lazy_cast(lb, dt, bitcast)

def _py_dtype(x: Any) -> DType:
  """The dtype of a python scalar: bool, default_int (int64/uint64 when it doesn't fit), default_float."""
  if isinstance(x, bool): return dtypes.bool
  if isinstance(x, int):
    for dt in (dtypes.default_int, dtypes.int64, dtypes.uint64):
      if int(dtypes.min(dt)) <= x <= int(dtypes.max(dt)): return dt
    raise OverflowError(f"python int {x} does not fit in any tensor dtype")
  if isinstance(x, float): return dtypes.default_float
  if isinstance(x, Variable): return dtypes.int32
  raise TypeError(f"no tensor dtype for a python {type(x).__name__}")

# per float dtype: the smallest normal number and the mantissa's bits
_FLOAT_LIMITS = {dtypes.float16: (2.0 ** -14, 10), dtypes.bfloat16: (2.0 ** -126, 7), dtypes.float32: (2.0 ** -126, 23), dtypes.float64: (2.0 ** -1022, 52)}

_PY_SCALARS = (bool, int, float)  # exactly these types (numpy scalars subclass float and int, but aren't weak)

_EXACT_OPS = (UnaryOps.NEG, UnaryOps.CAST, UnaryOps.BITCAST)

def _computed_exactly(lb: LazyBuffer) -> bool:
  """Whether every kernel that computes lb gets the same bits: ints and bools, and floats read from
  memory or constants through negations and casts. Float arithmetic may not (a vector exp2 polynomial
  in one kernel, libm's exp2f in the other; an FMA contracted in one only), so argmax, which compares
  the values with their max, reads such a tensor from memory: exp(x).argmax() returned N, one past
  the end, in 7% of rows when the max and the compare came from two evaluations of exp."""
  if not dtypes.is_float(lb.dtype): return True
  b = lb.base
  if b.op is None or b.op is BufferOps.CONST: return True
  return b.op in _EXACT_OPS and all(_computed_exactly(s) for s in b.srcs)

def _tensor_of(lb: LazyBuffer) -> "Tensor":
  """Tensor(lb), for the hot paths: nothing to check or convert."""
  t = object.__new__(Tensor)
  t.lazydata = lb
  return t

class Tensor(MovementOps, MathOps, ActivationOps, ComparisonOps, NNOps, RandomOps, IndexingOps):
  __slots__ = ("lazydata",)
  # a numpy operand on the left (np.float32(0.5) * t, np.ones(2) + t, a < t): numpy's operators defer to
  # the Tensor's reflected one, which gives a Tensor, instead of an object array of 0-d Tensors. (numpy
  # ufuncs called on a Tensor, np.exp(t), raise TypeError: use t.exp() or t.numpy().)
  __array_ufunc__ = None
  __array_priority__ = 1000

  def __init__(self, data: Any, device: Optional[str] = None, dtype: Optional[Union[DType, str]] = None):
    dt = _tensor_dtype(dtype) if dtype is not None else None
    if isinstance(data, Tensor): data = data.lazydata
    if isinstance(data, LazyBuffer):
      self.lazydata = data if dt is None else _lb_cast(data, dt)
      if device is not None and _canon_device(device) != data.device: self.lazydata = self.to(device).lazydata
      return
    dev = _canon_device(device)
    if isinstance(data, (bool, int, float)) and not isinstance(data, np.generic):
      self.lazydata = lazy_const(data, _check_dtype(dev, dt or _py_dtype(data)), dev)
      return
    if isinstance(data, Variable):
      self.lazydata = lazy_const(data, _check_dtype(dev, dt or dtypes.int32), dev)
      return
    if isinstance(data, (list, tuple)):
      try: arr = np.array(data)
      except ValueError as e: raise ValueError(f"can't make a Tensor from a ragged nested list: {e}") from None
      if dt is None:
        # python lists follow numpy, except that floats default to float32 and ints to int32 (int64 when they don't fit)
        if arr.dtype == np.bool_: dt = dtypes.bool
        elif arr.dtype.kind == "f": dt = dtypes.default_float
        elif arr.dtype.kind in "iu":
          fits = arr.size == 0 or (int(arr.min()) >= int(dtypes.min(dtypes.default_int)) and int(arr.max()) <= int(dtypes.max(dtypes.default_int)))
          dt = dtypes.default_int if fits else dtypes.from_np(arr.dtype)
        else: raise TypeError(f"can't make a Tensor from a list of {arr.dtype} (nested lists must be rectangular, of bools or numbers)")
      data = arr
    if isinstance(data, np.generic): data = np.array(data)
    if not isinstance(data, np.ndarray): raise TypeError(f"can't make a Tensor from {type(data).__name__}")
    if not data.dtype.isnative and data.dtype.fields is None: data = data.astype(data.dtype.newbyteorder("="))  # big-endian data: the same values
    if dt is None:
      try: dt = _tensor_dtype(dtypes.from_np(data.dtype))
      except (TypeError, ValueError, KeyError) as e: raise TypeError(f"can't make a Tensor from a numpy array of {data.dtype}") from e
    _check_dtype(dev, dt)
    # np.ascontiguousarray turns 0-d arrays into 1-d ones: keep the shape
    if dt == dtypes.bfloat16: src = np.ascontiguousarray(data, dtype=np.float32).reshape(data.shape)
    else: src = np.ascontiguousarray(data.astype(dt.np, copy=False)).reshape(data.shape)
    if src.size == 0:
      self.lazydata = lazy_empty(tuple(src.shape), dt, dev)
      return
    buf = Buffer(dev, src.size, dt)
    buf.allocate().copyin(src.reshape(-1))
    self.lazydata = LazyBuffer.from_buffer(buf, tuple(src.shape), dt, dev)

  # ---- properties ---------------------------------------------------------------------------------
  @property
  def shape(self) -> tuple[sint, ...]: return self.lazydata.shape
  @property
  def dtype(self) -> DType: return self.lazydata.dtype
  @property
  def device(self) -> str: return self.lazydata.device
  @property
  def ndim(self) -> int: return len(self.shape)
  def numel(self) -> sint: return prod(self.shape)
  def __len__(self) -> int:
    if not self.shape: raise TypeError("len() of a 0-d tensor")
    return self.shape[0]  # type: ignore[return-value]
  def __repr__(self) -> str: return f"<Tensor {self.shape} {self.dtype} on {self.device}>"
  def __bool__(self) -> bool:
    """numpy's rule: a one-element tensor is its value (realized here); any other size is ambiguous."""
    n = self.numel()
    if not isinstance(n, int) or n != 1:
      raise ValueError(f"the truth value of a tensor of shape {self.shape} is ambiguous: only a one-element tensor has one (reduce it first, e.g. (t != 0).max())")
    return bool(self.item())

  # ---- realization --------------------------------------------------------------------------------
  def schedule(self, *others: "Tensor") -> list[ScheduleItem]:
    """The kernels that compute this tensor (and others) (API)."""
    return create_schedule([t.lazydata for t in (self,) + others])
  def realize(self, *others: "Tensor") -> "Tensor":
    realize_lazy([self.lazydata, *[t.lazydata for t in others]] if others else [self.lazydata])
    return self
  def numpy(self) -> np.ndarray:
    shape = self._concrete_shape("numpy()")
    if 0 in shape: return np.zeros(shape, dtype=self.dtype.np or np.float32)
    t = self.contiguous_base()
    buf = t.lazydata.base.buffer
    if not buf.is_allocated(): buf.allocate()  # Tensor.empty: memory nobody has written yet
    out = buf.numpy()[:prod(shape)]
    return out.reshape(shape)
  def _concrete_shape(self, what: str) -> tuple[int, ...]:
    """The shape with bound Variables replaced by their values."""
    out = []
    for s in self.shape:
      if isinstance(s, Node):
        unbound, vals = unbind_all(s)
        if any(not v.is_bound for v in s.vars()): raise ValueError(f"{what} of a tensor of shape {self.shape}: bind its Variables (or shrink to concrete sizes) first")
        s = sym_eval(unbound, vals)
      out.append(int(s))
    return tuple(out)
  def contiguous_base(self) -> "Tensor":
    """A tensor whose lazydata is a realized base holding exactly these elements in order."""
    lb = self.lazydata
    if not (lb.realized and not lb.is_view): lb = lazy_contiguous(lb)
    t = Tensor(lb)
    t.realize()
    return t
  def tolist(self) -> Any: return self.numpy().tolist()
  def item(self) -> Scalar:
    if self.numel() != 1: raise ValueError(f"item() needs exactly one element, tensor has shape {self.shape}")
    return self.numpy().reshape(()).item()
  def contiguous(self) -> "Tensor": return Tensor(lazy_contiguous(self.lazydata))
  def to(self, device: str) -> "Tensor":
    device = _canon_device(device)
    if device == self.device: return self
    _check_dtype(device, self.dtype)
    if _is_zero(self.shape): return Tensor(lazy_empty(self.shape, self.dtype, device))
    return Tensor(self.lazydata.copy_to(device))
  def assign(self, x: "Tensor") -> "Tensor":
    if x.shape != self.shape: raise ValueError(f"assign: shape {x.shape} doesn't match {self.shape}")
    self.lazydata = x.cast(self.dtype).lazydata
    return self

  # ---- constructors -------------------------------------------------------------------------------
  @staticmethod
  def full(shape: Sequence[sint], fill: Scalar, dtype: Optional[Union[DType, str]] = None, device: Optional[str] = None) -> "Tensor":
    shape = _shape(shape)
    if any(isinstance(s, int) and s < 0 for s in shape): raise ValueError(f"negative dimension in shape {shape}")
    dev = _canon_device(device)
    dt = _check_dtype(dev, _tensor_dtype(dtype) if dtype is not None else _py_dtype(fill))
    return Tensor(lazy_const(fill, dt, dev, shape))
  @staticmethod
  def zeros(*shape: Any, dtype: Any = None, device: Optional[str] = None) -> "Tensor": return Tensor.full(_shape(shape), 0.0, dtype or dtypes.default_float, device)
  @staticmethod
  def ones(*shape: Any, dtype: Any = None, device: Optional[str] = None) -> "Tensor": return Tensor.full(_shape(shape), 1.0, dtype or dtypes.default_float, device)
  @staticmethod
  def empty(*shape: Any, dtype: Any = None, device: Optional[str] = None) -> "Tensor":
    """Uninitialized memory of this shape (its contents are whatever the allocator returns)."""
    shape, dev = _shape(shape), _canon_device(device)
    if any(isinstance(s, int) and s < 0 for s in shape): raise ValueError(f"negative dimension in shape {shape}")
    dt = _check_dtype(dev, _tensor_dtype(dtype) if dtype is not None else dtypes.default_float)
    return Tensor(LazyBuffer.from_buffer(Buffer(dev, int(prod(shape)), dt), shape, dt, dev))
  @staticmethod
  def arange(start: Scalar, stop: Optional[Scalar] = None, step: Scalar = 1, dtype: Any = None, device: Optional[str] = None) -> "Tensor":
    """An index expression (ops.INDEX): the values are computed from each element's index wherever they are used."""
    if stop is None: start, stop = 0, start
    if step == 0: raise ValueError("arange: step must not be zero")
    if not all(math.isfinite(x) for x in (start, stop, step)): raise ValueError(f"arange: start, stop and step must be finite, got {start}, {stop}, {step}")
    ints = all(isinstance(x, int) for x in (start, stop, step))
    n = max(0, -((start - stop) // step) if ints else math.ceil((stop - start) / step))  # (ints: exact however large)
    # numpy's rule: int64 for python ints (int32 wrapped arange(0, 3 * 2**30, 2**30)), default_float for floats
    if dtype is not None: dt = _tensor_dtype(dtype)
    elif any(isinstance(x, float) for x in (start, stop, step)): dt = dtypes.default_float
    else:
      if not all(-2**63 <= int(x) < 2**63 for x in (start, stop, step)): raise OverflowError(f"arange({start}, {stop}, {step}): values past int64")
      dt = dtypes.int64
    if n == 0: return Tensor.zeros(0, dtype=dt, device=device)
    dev = _canon_device(device)
    idt = dtypes.int64 if n > 2**31 - 1 else dtypes.int32
    idx = Tensor(lazy_index(n, idt, dev))
    return (idx.cast(dt) * step + start).cast(dt)
  def _windows(self, n: int) -> "Tensor":
    """(L-n+1, n) sliding windows of a 1-D tensor of length L, as a view (no copy)."""
    (L,) = self.shape
    m = L - n + 1
    # repeat, then take rows of length L+1 so each row starts one element later
    x = self.reshape(1, L).expand(m + 1, L).reshape((m + 1) * L)[:m * (L + 1)].reshape(m, L + 1)
    return x[:, :n]
  @staticmethod
  def eye(n: int, m: Optional[int] = None, dtype: Any = None, device: Optional[str] = None) -> "Tensor":
    """Ones on the diagonal: a row [1, 0 * k] repeated and cut into rows of k, so each row's 1 moves one
    place right (a view of one constant, no kernel of its own)."""
    m = n if m is None else m
    if not all(isinstance(v, (int, np.integer)) and v >= 0 for v in (n, m)): raise ValueError(f"eye({n}, {m}): sizes must be non-negative integers")
    k = max(n, m)
    if k == 0 or n == 0 or m == 0: return Tensor.zeros(n, m, dtype=dtype or dtypes.default_float, device=device)
    x = Tensor.ones(1, dtype=dtype or dtypes.default_float, device=device).pad(((0, k),)).reshape(1, k + 1).expand(k, k + 1).reshape(k * (k + 1))
    return x[:k * k].reshape(k, k)[:n, :m]
  # ---- broadcasting and elementwise ---------------------------------------------------------------
  def _const_like(self, x: Scalar, dtype: Optional[DType] = None) -> "Tensor":
    return Tensor(lazy_const(x, dtype or self.dtype, self.device, self.shape))
  def _scalar_dtype(self, x: Scalar, cmp: bool = False) -> DType:
    """The dtype a python scalar combined with this tensor takes (see _to_tensor), checked on the device."""
    if isinstance(x, bool): dt = self.dtype
    elif isinstance(x, int):
      if self.dtype == dtypes.bool: dt = _py_dtype(x)
      elif dtypes.is_int(self.dtype) and not int(dtypes.min(self.dtype)) <= x <= int(dtypes.max(self.dtype)):
        if not cmp: raise OverflowError(f"python integer {x} out of bounds for {self.dtype.name}")
        dt = least_upper_dtype(self.dtype, _py_dtype(x) if x >= 0 else dtypes.int64)
      else: dt = self.dtype
    else: dt = self.dtype if dtypes.is_float(self.dtype) else dtypes.default_float
    return _check_dtype(self.device, dt)
  def _to_tensor(self, x: Any, cmp: bool = False) -> "Tensor":
    """x as a tensor on this device. Python scalars are weak (numpy 2, NEP 50): they take this tensor's
    dtype when their kind fits it; an int that doesn't fit an int dtype is an OverflowError, except in
    comparisons, which widen to compare exactly."""
    if isinstance(x, Tensor): return x
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
      return Tensor(lazy_const(x, self._scalar_dtype(x, cmp), self.device))
    if isinstance(x, Variable): return Tensor(lazy_const(x, dtypes.int32, self.device))
    if isinstance(x, (np.ndarray, np.generic, list, tuple)): return Tensor(x, device=self.device)
    raise TypeError(f"can't combine a Tensor with {type(x).__name__}")
  def _broadcasted(self, y: Any, reverse: bool = False, match_dtype: bool = True, cmp: bool = False) -> tuple["Tensor", "Tensor"]:
    if type(y) in _PY_SCALARS and match_dtype:  # the common `x * 2.0`: the constant made at x's shape, in one view
      dt = self._scalar_dtype(y, cmp)
      x = self if dt == self.dtype else self.cast(dt)
      yt = _tensor_of(lazy_const(y, dt, self.device, self.shape))
      return (yt, x) if reverse else (x, yt)
    if isinstance(y, Tensor):
      a, b = self.lazydata, y.lazydata
      if a.shape == b.shape and a.dtype is b.dtype and a.device == b.device: return (y, self) if reverse else (self, y)  # nothing to do
    weak = isinstance(y, (bool, int, float)) and not isinstance(y, np.generic)
    yt = self._to_tensor(y, cmp)
    x, y = (yt, self) if reverse else (self, yt)
    if x.device != y.device: raise ValueError(f"operands are on different devices: {x.device} and {y.device} (move one with .to())")
    shape = _broadcast_shape(x.shape, y.shape)
    if match_dtype and x.dtype != y.dtype:
      # a python scalar's dtype was picked to be the result's (weak promotion); tensors promote
      dt = yt.dtype if weak else least_upper_dtype(x.dtype, y.dtype)
      x, y = x.cast(dt), y.cast(dt)
    return x._expand_to(shape), y._expand_to(shape)
  def _expand_to(self, shape: tuple) -> "Tensor":
    if self.shape == shape: return self
    padded = (1,) * (len(shape) - self.ndim) + self.shape
    x = self._mv("reshape", padded) if padded != self.shape else self
    return x._mv("expand", shape) if padded != shape else x
  def _mv(self, fn: str, arg: Any) -> "Tensor":
    """A movement op: a view of the same base. A zero-element result is an empty buffer instead."""
    lb = self.lazydata
    new_st = getattr(lb.st, fn)(arg)
    if 0 in new_st.shape: return Tensor(lazy_empty(new_st.shape, self.dtype, self.device))
    return _tensor_of(lb._view(new_st))  # what LazyBuffer.<fn>(arg) makes, without moving the tracker again
  def _e(self, op: Any, *srcs: "Tensor", dtype: Optional[DType] = None) -> "Tensor":
    return _tensor_of(lazy_e(op, [self.lazydata, *[s.lazydata for s in srcs]], dtype=dtype))

  def cast(self, dtype: Union[DType, str]) -> "Tensor":
    if dtype is self.lazydata.dtype: return _tensor_of(self.lazydata)  # (the frontend casts to the dtype a value already has on most ops)
    return Tensor(_lb_cast(self.lazydata, _tensor_dtype(dtype)))
  def bitcast(self, dtype: Union[DType, str]) -> "Tensor":
    dt = _tensor_dtype(dtype)
    if dt.itemsize != self.dtype.itemsize: raise ValueError(f"bitcast {self.dtype.name} -> {dt.name}: item sizes differ ({self.dtype.itemsize} vs {dt.itemsize} bytes)")
    return Tensor(_lb_cast(self.lazydata, dt, bitcast=True))
  def float(self) -> "Tensor": return self.cast(dtypes.float32)
  def half(self) -> "Tensor": return self.cast(dtypes.float16)
  def int(self) -> "Tensor": return self.cast(dtypes.int32)
  def bool(self) -> "Tensor": return self.cast(dtypes.bool)

  def add(self, y: Any, reverse: bool = False) -> "Tensor":
    x, y = self._broadcasted(y, reverse)
    return x._e(BinaryOps.ADD if x.dtype != dtypes.bool else BinaryOps.OR, y)
  def sub(self, y: Any, reverse: bool = False) -> "Tensor":
    x, y = self._broadcasted(y, reverse)
    if x.dtype == dtypes.bool: raise TypeError("numpy boolean subtract is not supported: use logical_xor")
    return x._e(BinaryOps.SUB, y)
  def mul(self, y: Any, reverse: bool = False) -> "Tensor":
    x, y = self._broadcasted(y, reverse)
    return x._e(BinaryOps.MUL if x.dtype != dtypes.bool else BinaryOps.AND, y)
  def div(self, y: Any, reverse: bool = False) -> "Tensor":
    """True division (ints become floats, like numpy)."""
    plain = not reverse and type(y) in _PY_SCALARS and (y == 0 or abs(y) >= 2.0 ** -126)  # x / 2.0: no tiny-divisor care needed
    x, y = self._broadcasted(y, reverse)
    x, y = x._default_float(), y._default_float()  # numpy divides ints (and bools) in float64: here default_float
    return x * y.reciprocal() if plain and y.dtype != dtypes.float16 else x._div_float(y)
  def _div_float(self, y: "Tensor") -> "Tensor":
    """self * (1 / y), except that a divisor whose reciprocal overflows (one below the smallest normal, 1e-39 in
    float32) is scaled up first by 2**(mantissa bits + 1), exactly, and the quotient back down by as much:
    1e-39 / 1e-39 is 1, not inf."""
    tiny, bits = _FLOAT_LIMITS[y.dtype]
    small = (y < tiny) & (y > -tiny)
    q = self * small.where(y * 2.0 ** (bits + 1), y).reciprocal()
    return small.where(q * 2.0 ** (bits + 1), q)
  def maximum(self, y: Any) -> "Tensor":
    x, y = self._broadcasted(y)
    return x._e(BinaryOps.MAX, y) if x.dtype != dtypes.bool else x._e(BinaryOps.OR, y)
  def minimum(self, y: Any) -> "Tensor":
    x, y = self._broadcasted(y)
    if x.dtype == dtypes.bool: return x._e(BinaryOps.AND, y)
    if dtypes.is_float(x.dtype): return -((-x).maximum(-y))  # keeps nan like maximum does
    return ~((~x).maximum(~y))  # ~ reverses the order of integers and, unlike -, never overflows
  def where(self, x: Any, y: Any) -> "Tensor":
    """x where self is true (nonzero), else y; broadcasting, with numpy promotion of x and y."""
    cond = self if self.dtype == dtypes.bool else self != 0
    if isinstance(x, Tensor) and isinstance(y, Tensor): xt, yt = x, y
    elif isinstance(x, Tensor): xt, yt = x, x._to_tensor(y)  # a python scalar is weak: it takes x's kind
    elif isinstance(y, Tensor): xt, yt = y._to_tensor(x), y
    else:
      scalars = [v for v in (x, y) if not isinstance(v, Tensor)]
      if any(isinstance(v, float) for v in scalars): dt = dtypes.default_float
      elif any(isinstance(v, int) and not isinstance(v, bool) for v in scalars):
        dt = least_upper_dtype(*(_py_dtype(v) for v in scalars if isinstance(v, int) and not isinstance(v, bool)))
      else: dt = dtypes.bool
      xt, yt = Tensor(x, dtype=dt, device=cond.device), Tensor(y, dtype=dt, device=cond.device)
    if xt.dtype != yt.dtype:
      # the weak side's dtype is already the result's; two tensors promote
      dt = yt.dtype if not isinstance(y, Tensor) else xt.dtype if not isinstance(x, Tensor) else least_upper_dtype(xt.dtype, yt.dtype)
      xt, yt = xt.cast(dt), yt.cast(dt)
    shape = _broadcast_shape(_broadcast_shape(cond.shape, xt.shape), yt.shape)
    return cond._expand_to(shape)._e(TernaryOps.WHERE, xt._expand_to(shape), yt._expand_to(shape))

  # unary math
  def neg(self) -> "Tensor": return self.logical_not() if self.dtype == dtypes.bool else self._e(UnaryOps.NEG)
  def _float(self) -> "Tensor":
    """The float dtype numpy computes float-valued ops of this dtype in (bool/int8/uint8 -> float16,
    int16/uint16 -> float32), except that wider ints give default_float rather than float64."""
    if dtypes.is_float(self.dtype): return self
    return self.cast(least_upper_dtype(self.dtype, dtypes.float16) if self.dtype.itemsize < 4 else dtypes.default_float)
  def reciprocal(self) -> "Tensor": return self._float()._e(UnaryOps.RECIP)
  def sqrt(self) -> "Tensor": return self._float()._e(UnaryOps.SQRT)
  def rsqrt(self) -> "Tensor": return self.sqrt().reciprocal()
  def exp2(self) -> "Tensor": return self._float()._e(UnaryOps.EXP2)
  def log2(self) -> "Tensor": return self._float()._e(UnaryOps.LOG2)
  def sin(self) -> "Tensor": return self._float()._e(UnaryOps.SIN)

  __add__ = lambda s, y: s.add(y)  # noqa: E731
  __radd__ = lambda s, y: s.add(y, True)  # noqa: E731
  __sub__ = lambda s, y: s.sub(y)  # noqa: E731
  __rsub__ = lambda s, y: s.sub(y, True)  # noqa: E731
  __mul__ = lambda s, y: s.mul(y)  # noqa: E731
  __rmul__ = lambda s, y: s.mul(y, True)  # noqa: E731
  __truediv__ = lambda s, y: s.div(y)  # noqa: E731
  __rtruediv__ = lambda s, y: s.div(y, True)  # noqa: E731
  __floordiv__ = lambda s, y: s.floordiv(y)  # noqa: E731
  __rfloordiv__ = lambda s, y: s.floordiv(y, True)  # noqa: E731
  __mod__ = lambda s, y: s.mod(y)  # noqa: E731
  __rmod__ = lambda s, y: s.mod(y, True)  # noqa: E731
  __pow__ = lambda s, y: s.pow(y)  # noqa: E731
  __rpow__ = lambda s, y: s.pow(y, True)  # noqa: E731
  __neg__ = lambda s: s.neg()  # noqa: E731
  __matmul__ = lambda s, y: s.matmul(y)  # noqa: E731
  __rmatmul__ = lambda s, y: s._to_tensor(y).matmul(s)  # noqa: E731

  # ---- reductions ---------------------------------------------------------------------------------
  def _axes(self, axis: Any) -> tuple[int, ...]:
    if axis is None: return tuple(range(self.ndim))
    axes = [self._axis(a) for a in (axis if isinstance(axis, (list, tuple)) else (axis,))]
    if len(set(axes)) != len(axes): raise ValueError(f"repeated axis in {axis} for a tensor of {self.ndim} dims")
    return tuple(sorted(axes))
  def _reduce(self, op: ReduceOps, axis: Any = None, keepdim: bool = False) -> "Tensor":
    axes = self._axes(axis)
    kept = tuple(1 if i in axes else s for i, s in enumerate(self.shape))
    out_shape = tuple(s for i, s in enumerate(self.shape) if i not in axes)
    if any(isinstance(self.shape[a], int) and self.shape[a] == 0 for a in axes):
      if op is ReduceOps.MAX: raise ValueError(f"max/min of shape {self.shape} over empty axis {[a for a in axes if self.shape[a] == 0]}: no identity")
      ret = Tensor.full(kept, 0, self.dtype, self.device)
    elif _is_zero(kept): ret = Tensor(lazy_empty(kept, self.dtype, self.device))
    else: ret = Tensor(lazy_r(self.lazydata, op, axes))
    return ret if keepdim else ret.reshape(out_shape)
  @recorded
  def sum(self, axis: Any = None, keepdim: bool = False, dtype: Any = None, acc_dtype: Any = None) -> "Tensor":
    """numpy sum: bools and ints narrower than 64 bits are summed as (u)int64. float16 and bfloat16
    accumulate in float32 and round once at the end (docs/architecture.md, "Beyond DESIGN.md"); `acc_dtype` names another
    accumulator (the result keeps the summed dtype)."""
    x = self
    if dtype is not None: x = x.cast(_tensor_dtype(dtype))
    elif x.dtype == dtypes.bool or (dtypes.is_int(x.dtype) and x.dtype.itemsize < 8):
      x = x.cast(dtypes.uint64 if dtypes.is_unsigned(x.dtype) else dtypes.int64)
    acc = _acc_dtype(x.dtype, acc_dtype)
    return x.cast(acc)._reduce(ReduceOps.SUM, axis, keepdim).cast(x.dtype)
  def prod(self, axis: Any = None, keepdim: bool = False, dtype: Any = None) -> "Tensor":
    """numpy prod: bools and ints narrower than 64 bits multiply as (u)int64, float16 and bfloat16 in float32 (rounded
    once at the end); an empty axis gives 1. A tree of multiplies (frontend/scan.py: the AST has no product reduce)."""
    x = self
    if dtype is not None: x = x.cast(_tensor_dtype(dtype))
    elif x.dtype == dtypes.bool or (dtypes.is_int(x.dtype) and x.dtype.itemsize < 8):
      x = x.cast(dtypes.uint64 if dtypes.is_unsigned(x.dtype) else dtypes.int64)
    out_dt, axes = x.dtype, self._axes(axis)
    kept = tuple(1 if i in axes else s for i, s in enumerate(self.shape))
    if x.dtype in (dtypes.float16, dtypes.bfloat16): x = x.cast(dtypes.float32)
    if any(isinstance(self.shape[a], int) and self.shape[a] == 0 for a in axes) or _is_zero(kept): ret = Tensor.full(kept, 1, x.dtype, self.device)
    else:
      ret = x
      for a in axes: ret = tree_product(ret, a)
    ret = ret.cast(out_dt)
    return ret if keepdim else ret.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))
  def max(self, axis: Any = None, keepdim: bool = False) -> "Tensor": return self._reduce(ReduceOps.MAX, axis, keepdim)
  def min(self, axis: Any = None, keepdim: bool = False) -> "Tensor":
    if self.dtype == dtypes.bool: return self.logical_not().max(axis, keepdim).logical_not()
    if dtypes.is_int(self.dtype): return ~((~self).max(axis, keepdim))  # ~ reverses the order without overflowing
    return -((-self).max(axis, keepdim))
  def _count(self, axis: Any) -> sint:
    """How many elements each output of a reduce over `axis` combines."""
    return prod(self.shape[a] for a in self._axes(axis))
  def _div_count(self, s: "Tensor", n: sint) -> "Tensor":
    if isinstance(n, int): return s * (1.0 / n) if n > 0 else s * math.nan
    if isinstance(n, Variable): return s / Tensor(n, device=self.device).cast(s.dtype)
    raise NotImplementedError(f"a mean over the symbolic size {n} (reduce over one Variable-sized axis at a time)")
  def _default_float(self) -> "Tensor":
    """Floats as they are, anything else as default_float (where numpy goes to float64 for every int)."""
    return self if dtypes.is_float(self.dtype) else self.cast(dtypes.default_float)
  @recorded
  def mean(self, axis: Any = None, keepdim: bool = False, acc_dtype: Any = None) -> "Tensor":
    """numpy mean: ints and bools average as default_float (numpy: float64); float16 and bfloat16
    sum and divide in float32 (or `acc_dtype`) and round once at the end."""
    x = self._default_float()
    acc = _acc_dtype(x.dtype, acc_dtype)
    return self._div_count(x.cast(acc).sum(axis, keepdim, acc_dtype=acc), self._count(axis)).cast(x.dtype)
  def _var_acc(self, axis: Any, keepdim: bool, correction: int, acc_dtype: Any) -> "Tensor":
    """The variance in the accumulate dtype. Two passes over data shifted by its first element along
    the reduced axes (the mean of the deviations, then the mean of their squares): the shift makes the
    deviations exact where values sit close together (1e6 + small noise in float32), so nothing cancels."""
    acc = _acc_dtype(self._default_float().dtype, acc_dtype)
    x = self._default_float().cast(acc) - self._first_along(self._axes(axis))._default_float().cast(acc)
    d = x - x.mean(axis, keepdim=True)
    n = self._count(axis)
    return self._div_count((d * d).sum(axis, keepdim), n - correction if not isinstance(n, int) or n - correction > 0 else 0)
  def _first_along(self, axes: tuple[int, ...]) -> "Tensor":
    """Each element's first element along `axes`, as a view broadcast back to this shape (0 where an axis is empty)."""
    if any(isinstance(self.shape[a], int) and self.shape[a] == 0 for a in axes): return self._const_like(0)
    first = self.shrink(tuple((0, 1) if i in axes else None for i in range(self.ndim)))
    b = self.lazydata.base
    if not (b.realized or b.op is BufferOps.CONST):  # a computed value: its first elements in a small kernel of their own
      first = first.contiguous()  # (a broadcast view of the value itself would make the scheduler realize all of it first)
    return first._expand_to(self.shape)
  def var(self, axis: Any = None, keepdim: bool = False, correction: int = 0, acc_dtype: Any = None) -> "Tensor":
    """Variance with `correction` (numpy's ddof) subtracted from the count (float16/bfloat16: computed in float32, or `acc_dtype`)."""
    return self._var_acc(axis, keepdim, correction, acc_dtype).cast(self._default_float().dtype)
  def std(self, axis: Any = None, keepdim: bool = False, correction: int = 0, acc_dtype: Any = None) -> "Tensor":
    return self._var_acc(axis, keepdim, correction, acc_dtype).sqrt().cast(self._default_float().dtype)
  def argmax(self, axis: Optional[int] = None, keepdim: bool = False) -> "Tensor":
    """Index of the first maximum (numpy semantics)."""
    if axis is None: return self.flatten().argmax(0, keepdim=False).reshape((1,) * self.ndim if keepdim else ())
    a = self._axis(axis)
    n = self.shape[a]
    x = self if _computed_exactly(self.lazydata) else self.contiguous()
    m = x.max(a, keepdim=True)
    idx = Tensor.arange(n, 0, -1, dtype=dtypes.int32, device=self.device).reshape((n,) + (1,) * (self.ndim - a - 1))
    # (a row holding a NaN has m = NaN, max propagates it: no x equals m there, so its NaNs are the hits, the first one
    # winning as numpy's does; in a row without one x != x is false. No per-row NaN flag: that bool buffer kept the index
    # reduce scalar code, 2x slower over 1000 x 5000)
    hit = (x == m) | (x != x)
    return (n - (hit.where(idx._expand_to(self.shape), 0)).max(a, keepdim)).cast(dtypes.int64)
  def argmin(self, axis: Optional[int] = None, keepdim: bool = False) -> "Tensor":
    """Index of the first minimum (numpy semantics)."""
    return (-self if dtypes.is_float(self.dtype) else ~self if dtypes.is_int(self.dtype) else self.logical_not()).argmax(axis, keepdim)
  def cumsum(self, axis: int = 0) -> "Tensor":
    """Running sum along an axis (numpy's dtypes): a windowed reduce over a padded view (frontend/scan.py)."""
    return self._scan("cumsum", axis)
  def cumprod(self, axis: int = 0) -> "Tensor":
    """Running product along an axis (numpy's dtypes): windowed product trees over a padded view (frontend/scan.py)."""
    return self._scan("cumprod", axis)
  def _scan(self, name: str, axis: Any) -> "Tensor":
    if axis is None: return self.flatten()._scan(name, 0)
    if self.ndim == 0: raise ValueError(f"{name}(axis={axis}) of a 0-d tensor: it has no axis (axis=None gives numpy's 1-element result)")
    a = self._axis(axis)
    n = self.shape[a]
    x = self
    if x.dtype == dtypes.bool or (dtypes.is_int(x.dtype) and x.dtype.itemsize < 8): x = x.cast(dtypes.int64 if not dtypes.is_unsigned(x.dtype) else dtypes.uint64)
    if x.dtype in (dtypes.float16, dtypes.bfloat16) and not _is_zero(x.shape): return x.cast(dtypes.float32)._scan(name, axis).cast(x.dtype)  # in float32, rounded once
    if _is_zero(x.shape): return Tensor(lazy_empty(x.shape, x.dtype, x.device))
    x = x.transpose(a, -1)
    lead = x.shape[:-1]
    flat = x.reshape(-1, n) if lead else x.reshape(1, n)
    out = scan_rows(flat, product=name == "cumprod")
    return (out.reshape(*lead, n) if lead else out.reshape(n)).transpose(a, -1)

  # ---- matmul and friends -------------------------------------------------------------------------
  def dot(self, w: "Tensor", acc_dtype: Any = None) -> "Tensor": return self.matmul(w, acc_dtype)
  @recorded
  def matmul(self, w: Any, acc_dtype: Any = None) -> "Tensor":
    """numpy matmul; float16/bfloat16 operands are multiplied and summed in float32 (exact products,
    one rounding at the end) unless `acc_dtype` names another accumulator."""
    w = self._to_tensor(w)
    if self.ndim == 0 or w.ndim == 0: raise ValueError("matmul: operands must have at least 1 dimension (use * for scalars)")
    x, y = self, w
    if x.shape[-1] != y.shape[-2 if y.ndim > 1 else 0]:
      raise ValueError(f"matmul: shapes {x.shape} and {y.shape} don't line up ({x.shape[-1]} != {y.shape[-2 if y.ndim > 1 else 0]})")
    if x.ndim > 2 or y.ndim > 2:
      try: _broadcast_shape(x.shape[:-2], y.shape[:-2])
      except ValueError: raise ValueError(f"matmul: batch dims of shapes {x.shape} and {y.shape} can't be broadcast together") from None
    dt = least_upper_dtype(x.dtype, y.dtype)
    x, y = x.cast(dt), y.cast(dt)
    if x.ndim == 2 and y.ndim == 2 and (lvl := image_level(self)):  # IMAGE: the weight (and input) read through images
      k_, n_ = y.shape
      if isinstance(n_, int) and n_ % 4 == 0 and (yi := as_image(y, (k_, n_ // 4))) is not None: y = yi
      if lvl >= 2 and isinstance(k_, int) and k_ % 4 == 0 and (xi := as_image(x, (x.shape[0], k_ // 4))) is not None: x = xi
    xv = x.reshape(*x.shape[:-1], *(1,) * min(y.ndim - 1, 1), x.shape[-1])
    yv = y.reshape(*y.shape[:-2], *(1,) * min(x.ndim - 1, 1), *y.shape[-min(y.ndim, 2):]).transpose(-1, -2) if y.ndim > 1 else y
    if dtypes.is_float(dt):
      acc = _acc_dtype(dt, acc_dtype)
      if acc != dt:  # exact products of half/bfloat16 values, summed in float32 (cast after the broadcast: a cast
        shape = _broadcast_shape(xv.shape, yv.shape)  # value expanded would be realized as a float copy first)
        xv, yv = xv._expand_to(shape).cast(acc), yv._expand_to(shape).cast(acc)
      out = (xv * yv).sum(-1, acc_dtype=acc)
    elif dtypes.is_int(dt): out = (xv * yv).sum(-1, acc_dtype=acc_dtype)
    else: out = (xv * yv).sum(-1, dtype=dt)  # bool: any of the ANDs
    return out.cast(dt) if out.dtype != dt else out
