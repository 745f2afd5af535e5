"""Data types (API): scalar, vector, pointer and image dtypes, numpy-compatible promotion, and the
value helpers (ranges, constant coercion, truncation, bfloat16 bits) the compiler folds constants with."""
from __future__ import annotations
import functools, math, warnings
from dataclasses import dataclass, field
from typing import Any, Callable
import numpy as np

@dataclass(frozen=True)
class DType:
  """A scalar (count == 1) or vector element type. `itemsize` covers all `count` lanes; `fmt` is the
  struct format char of one lane. Build vectors and pointers with `vec`/`ptr`, never by hand."""
  priority: int  # promotion tie-break order (bool < ints < floats); a linear extension of the lattice
  itemsize: int
  name: str
  fmt: str | None
  count: int
  _scalar: DType | None = field(default=None, repr=False, compare=False, kw_only=True)
  def __eq__(self, other: object) -> bool:
    # the fields dataclass would compare, after an identity check: dtypes are nearly always the shared
    # objects of `dtypes` (and of vec's cache), and the frontend compares them on every op
    if self is other: return True
    if other.__class__ is not self.__class__: return NotImplemented
    return self.priority == other.priority and self.itemsize == other.itemsize and self.name == other.name and \
      self.fmt == other.fmt and self.count == other.count  # type: ignore[attr-defined]
  def __hash__(self) -> int: return hash(self.name)  # equal dtypes have equal names (str hashes are cached)

  def vec(self, n: int) -> DType:
    """The `n`-lane vector of this scalar; vec(1) is the scalar itself. Cached, so repeated calls are cheap."""
    if type(n) is not int or n < 1: raise ValueError(f"vector width must be a positive int, got {n!r}")
    if self.count != 1: raise ValueError(f"can't vectorize the vector dtype {self!r}")
    return self if n == 1 else self._vec(n)

  @functools.cache
  def _vec(self, n: int) -> DType: return DType(self.priority, self.itemsize * n, f"{self.name}{n}", self.fmt, n, _scalar=self)

  def scalar(self) -> DType:
    """The lane type of a vector (the very object `vec` was called on); self for everything else."""
    return self if self._scalar is None else self._scalar

  @functools.cache
  def ptr(self, local: bool = False, size: int = -1) -> PtrDType:
    """A pointer to this dtype: global memory, or workgroup-local memory with `local=True`."""
    return PtrDType(self.priority, self.itemsize, self.name, self.fmt, self.count, base=self, local=local, size=size)

  @property
  def np(self) -> np.dtype | None:
    """The numpy dtype of one value; None for bfloat16 (numpy has none) and for vectors."""
    return np.dtype(self.fmt) if self.fmt is not None and self.count == 1 else None

  def __repr__(self) -> str: return f"dtypes.{self.name}" if self.count == 1 else f"{self.scalar()!r}.vec({self.count})"

@dataclass(frozen=True, repr=False)
class PtrDType(DType):
  """A pointer to `base` (kernel buffer arguments, local memory). It keeps base's itemsize/name/fmt, but
  never compares equal to it. `size` is the element count when known (e.g. local buffers), else -1."""
  base: DType
  local: bool = False
  size: int = -1

  def vec(self, n: int) -> DType: raise ValueError(f"can't vectorize the pointer dtype {self!r}")
  def ptr(self, local: bool = False, size: int = -1) -> PtrDType: raise ValueError(f"no pointers to pointers: {self!r}")
  @property
  def np(self) -> np.dtype | None: return self.base.np  # what the memory holds

  def __repr__(self) -> str:
    args = ([] if not self.local else ["local=True"]) + ([] if self.size == -1 else [f"size={self.size}"])
    return f"{self.base!r}.ptr({', '.join(args)})"

@dataclass(frozen=True, repr=False)
class ImageDType(DType):
  """An OpenCL image2d of 4 channels: `shape` is (height, width, 4) and `base` the channel type (float or
  half), which is also its scalar() (so value checks treat an image as its channels). Make one with
  dtypes.imagef/imageh."""
  shape: tuple[int, ...]
  base: DType

  def vec(self, n: int) -> DType: raise ValueError(f"can't vectorize the image dtype {self!r}")
  def ptr(self, local: bool = False, size: int = -1) -> PtrDType: raise ValueError(f"images are not addressed by pointer: {self!r}")
  @property
  def np(self) -> np.dtype | None: return self.base.np
  def __repr__(self) -> str: return f"dtypes.{self.name}({self.shape})"

def _image(base: DType, shape: tuple[int, ...], name: str) -> ImageDType:
  shape = tuple(shape)
  if len(shape) != 3 or shape[2] != 4 or not all(isinstance(s, int) and s > 0 for s in shape):
    raise ValueError(f"image shape must be (height, width, 4) of positive ints, got {shape}")
  return ImageDType(base.priority, base.itemsize, name, base.fmt, 1, shape=shape, base=base, _scalar=base)  # scalar(): the channel type

class dtypes:
  """The supported dtypes (API), under their C names and numpy-style aliases, plus static helpers.
  Method bodies below see the builtins, not these class attributes, so `bool`/`int`/`float` are safe there."""
  bool = DType(0, 1, "bool", "?", 1)
  int8 = char = DType(1, 1, "char", "b", 1)
  uint8 = uchar = DType(2, 1, "uchar", "B", 1)
  int16 = short = DType(3, 2, "short", "h", 1)
  uint16 = ushort = DType(4, 2, "ushort", "H", 1)
  int32 = int = DType(5, 4, "int", "i", 1)
  uint32 = uint = DType(6, 4, "uint", "I", 1)
  int64 = long = DType(7, 8, "long", "q", 1)
  uint64 = ulong = DType(8, 8, "ulong", "Q", 1)
  float16 = half = DType(9, 2, "half", "e", 1)
  bfloat16 = DType(10, 2, "bfloat16", None, 1)
  float32 = float = DType(11, 4, "float", "f", 1)
  float64 = double = DType(12, 8, "double", "d", 1)
  default_float = float32
  default_int = int32

  @staticmethod
  def is_float(dt: DType) -> bool: return dt.scalar() in _FLOATS
  @staticmethod
  def is_int(dt: DType) -> bool: return dt.scalar() in _SIGNED or dt.scalar() in _UNSIGNED
  @staticmethod
  def is_unsigned(dt: DType) -> bool: return dt.scalar() in _UNSIGNED
  @staticmethod
  def is_bool(dt: DType) -> bool: return dt.scalar() == dtypes.bool

  @staticmethod
  def from_np(x: np.dtype | type) -> DType:
    """The DType of a numpy dtype (or anything np.dtype accepts); ValueError if we have no such dtype."""
    try: npdt = np.dtype(x) if x is not None else None
    except TypeError: npdt = None
    if npdt is None: raise ValueError(f"not a numpy dtype: {x!r}")
    if npdt.name == "bfloat16": return dtypes.bfloat16  # ml_dtypes' extension type, where installed
    if npdt.isnative and npdt.fields is None and (dt := _FROM_NP.get((npdt.kind, npdt.itemsize))) is not None: return dt
    raise ValueError(f"unsupported numpy dtype {npdt.name} ({npdt.str!r})")

  @staticmethod
  def from_py(x: Any) -> DType:
    """The dtype a python constant gets: bool, default_int, default_float; numpy scalars keep their own.
    Sequences take the highest-priority element dtype, not numpy promotion, so [1, 2.5] is default_float
    (int32+float32 would promote to float64). Empty sequences are default_float."""
    if isinstance(x, np.generic): return dtypes.from_np(x.dtype)
    if isinstance(x, bool): return dtypes.bool
    if isinstance(x, int): return dtypes.default_int
    if isinstance(x, float): return dtypes.default_float
    if isinstance(x, (list, tuple)): return max(map(dtypes.from_py, x), key=lambda d: d.priority) if len(x) else dtypes.default_float
    raise TypeError(f"no dtype for python value {x!r} of type {type(x).__name__}")

  @staticmethod
  def min(dt: DType) -> Any:
    """Smallest value of `dt`: False, the exact int minimum, or -inf."""
    dt = dt.scalar()
    if dt == dtypes.bool: return False
    if dt in _FLOATS: return -math.inf
    if dt in _UNSIGNED: return 0
    if dt in _SIGNED: return -(1 << (8 * dt.itemsize - 1))
    raise ValueError(f"{dt!r} has no value range")

  @staticmethod
  def max(dt: DType) -> Any:
    """Largest value of `dt`: True, the exact int maximum, or inf."""
    dt = dt.scalar()
    if dt == dtypes.bool: return True
    if dt in _FLOATS: return math.inf
    if dt in _UNSIGNED: return (1 << (8 * dt.itemsize)) - 1
    if dt in _SIGNED: return (1 << (8 * dt.itemsize - 1)) - 1
    raise ValueError(f"{dt!r} has no value range")

  @staticmethod
  def fields() -> dict[str, DType]:
    """Every scalar dtype under every name it has (C names and aliases), e.g. 'float' and 'float32'."""
    return dict(_BY_NAME)

  @staticmethod
  def as_const(val: Any, dt: DType) -> Any:
    """`val` as the python type of `dt` (float/bool/int; tuples lane by lane). No wrapping: see truncate."""
    if isinstance(val, (tuple, list)): return tuple(dtypes.as_const(v, dt) for v in val)
    dt = dt.scalar()
    return float(val) if dt in _FLOATS else bool(val) if dt == dtypes.bool else int(val)

  @staticmethod
  def imagef(shape: tuple[int, ...]) -> ImageDType: return _image(dtypes.float32, shape, "imagef")
  @staticmethod
  def imageh(shape: tuple[int, ...]) -> ImageDType: return _image(dtypes.float16, shape, "imageh")

_FLOATS = frozenset({dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64})
_SIGNED = frozenset({dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64})
_UNSIGNED = frozenset({dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64})
_BY_NAME: dict[str, DType] = {k: v for k, v in vars(dtypes).items() if isinstance(v, DType) and not k.startswith("default")}
_FROM_NP = {(d.np.kind, d.np.itemsize): d for d in _BY_NAME.values() if d.np is not None}
dtypes.void = DType(-1, 0, "void", None, 1)  # type: ignore[attr-defined]  # for UOps that produce no value

def to_dtype(x: str | DType | np.dtype | type) -> DType:
  """A DType from itself, any of its names ("float32", "float", "half", "bfloat16", ...) or a numpy
  dtype (np.float16, np.dtype("int32"))."""
  if isinstance(x, DType): return x
  if isinstance(x, str) and x in _BY_NAME: return _BY_NAME[x]
  if isinstance(x, np.dtype) or (isinstance(x, type) and issubclass(x, np.generic)): return dtypes.from_np(np.dtype(x).newbyteorder("="))
  raise ValueError(f"unknown dtype {x!r}; known names: {', '.join(sorted(_BY_NAME))}")

# ---- promotion -----------------------------------------------------------------------------------
# Each dtype's direct parents: the next dtypes it casts to without losing values, as numpy's "safe"
# casting has it. bfloat16 sits beside float16: both hold int8/uint8 exactly and both widen to float32.
_PARENTS: dict[DType, tuple[DType, ...]] = {
  dtypes.bool: (dtypes.int8, dtypes.uint8),
  dtypes.int8: (dtypes.int16, dtypes.float16, dtypes.bfloat16),
  dtypes.uint8: (dtypes.int16, dtypes.uint16, dtypes.float16, dtypes.bfloat16),
  dtypes.int16: (dtypes.int32, dtypes.float32),
  dtypes.uint16: (dtypes.int32, dtypes.uint32, dtypes.float32),
  dtypes.int32: (dtypes.int64, dtypes.float64),
  dtypes.uint32: (dtypes.int64, dtypes.uint64, dtypes.float64),
  dtypes.int64: (dtypes.float64,), dtypes.uint64: (dtypes.float64,),
  dtypes.float16: (dtypes.float32,), dtypes.bfloat16: (dtypes.float32,),
  dtypes.float32: (dtypes.float64,), dtypes.float64: (),
}

@functools.cache
def _upper_set(dt: DType) -> frozenset[DType]:
  """`dt` and every dtype above it in the lattice."""
  if dt not in _PARENTS: raise ValueError(f"can't promote {dt!r}")
  return frozenset({dt}).union(*(_upper_set(p) for p in _PARENTS[dt]))

def least_upper_dtype(*dts: DType) -> DType:
  """The smallest dtype all of `dts` cast to safely (numpy's promotion; vectors of one width promote lane-wise).
  The partial order has one ambiguous spot: int8+uint8 has the minimal upper bounds int16, float16 and bfloat16.
  Like numpy we then keep the kind of the inputs, which is what picking the lowest priority does."""
  return _least_upper(dts)

@functools.lru_cache(maxsize=4096)
def _least_upper(dts: tuple[DType, ...]) -> DType:
  if not dts: raise ValueError("least_upper_dtype needs at least one dtype")
  if any(isinstance(d, (PtrDType, ImageDType)) for d in dts): raise ValueError(f"pointers and images don't promote: {dts}")
  if len(counts := {d.count for d in dts}) != 1: raise ValueError(f"can't promote vectors of different widths: {dts}")
  common = frozenset.intersection(*(_upper_set(d.scalar()) for d in dts))
  minimal = [c for c in common if not any(o != c and c in _upper_set(o) for o in common)]
  return min(minimal, key=lambda d: d.priority).vec(counts.pop())

def least_upper_float(dt: DType) -> DType:
  """The dtype of a float-valued op (exp, sqrt, ...) on `dt`: floats stay, the rest become default_float."""
  return dt if dtypes.is_float(dt) else dtypes.default_float.vec(dt.count)

# ---- bfloat16 bits and truncation ----------------------------------------------------------------
def bf16_bits_from_f32(x: np.ndarray) -> np.ndarray:
  """float32 -> bfloat16 bit patterns (uint16), rounding to nearest even; NaNs stay (quiet) NaNs."""
  bits = np.asarray(x, dtype=np.float32).view(np.uint32)  # same-size views work on any strides
  rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
  nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
  return np.where(nan, (bits >> 16) | np.uint32(0x0040), rounded).astype(np.uint16)

def f32_from_bf16_bits(x: np.ndarray) -> np.ndarray:
  """bfloat16 bit patterns (uint16) -> float32, exactly."""
  return (np.asarray(x, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)

def _to_bf16(x: Any) -> float:
  # Via float32 rounded to odd, so the second rounding (to bfloat16) is exact: no double-rounding error.
  x = float(x)
  with np.errstate(over="ignore"): f = np.float32(x)
  b = int(np.array(f).view(np.uint32))
  if math.isfinite(x) and float(f) != x: b = (b - 1 if abs(float(f)) > abs(x) else b) | 1
  return float(f32_from_bf16_bits(bf16_bits_from_f32(np.array(b, np.uint32).view(np.float32))))

def _np_float(npdt: type) -> Callable[[Any], float]:
  def f(x: Any) -> float:
    with np.errstate(over="ignore"): return float(npdt(float(x)))
  return f

def _wrap_int(dt: DType, signed: bool) -> Callable[[Any], int]:
  mask, half = (1 << (8 * dt.itemsize)) - 1, 1 << (8 * dt.itemsize - 1)
  return (lambda x: ((int(x) + half) & mask) - half) if signed else (lambda x: int(x) & mask)

_TRUNCATE: dict[DType, Callable[[Any], Any]] = {
  dtypes.bool: bool, dtypes.float64: float, dtypes.bfloat16: _to_bf16,
  dtypes.float32: _np_float(np.float32), dtypes.float16: _np_float(np.float16),
  **{d: _wrap_int(d, True) for d in _SIGNED}, **{d: _wrap_int(d, False) for d in _UNSIGNED},
}

def float_to_int(x: float, dt: DType) -> int:
  """A float converted to the int dtype `dt` the way the targets' runtime casts do (numpy's on x86): in
  range it truncates toward zero; NaN, inf and out-of-range values give what the hardware conversion
  gives (int32/int64: the minimum, narrower ints through int32, uint32 through int64), never an error."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    return int(np.array(x, np.float64).astype(dt.scalar().np).item())

def truncate(dt: DType) -> Callable[[Any], Any]:
  """The function storing a python value in `dt`, for constant folding: ints wrap two's-complement
  (int8: 300 -> 44), floats round to nearest even (overflow -> inf). Vectors map over tuples."""
  if isinstance(dt, (PtrDType, ImageDType)) or dt.scalar() not in _TRUNCATE: raise ValueError(f"can't truncate to {dt!r}")
  f = _TRUNCATE[dt.scalar()]
  return f if dt.count == 1 else lambda xs: tuple(f(x) for x in xs)
