"""Checking a kernel's outputs: one comparison with per-dtype tolerances, and the buffer layout that
makes unwritten elements and out-of-bounds accesses visible. Used by the search's verification
(engine/search/worker.py), the fuzzer (testing/fuzz.py) and `tilecraft bench`.

- `compare(got, want, dtype)`: None when they match, else what differs. Ints and bools are exact;
  floats pass when |got - want| <= atol * scale + rtol * |want| (NaN matches NaN, infinities must
  be equal), with (rtol, atol) from `tolerance(dtype)` unless given.
- Unwritten outputs: an output is filled with a sentinel before a run. One fill can't catch every
  skipped element (whatever its bytes read as, some right answer equals it: 0xA5 bytes read as
  -2.9e-16 in float32 and as True in a bool), so a kernel runs once with each of the two fills in
  `SENTINELS` (0x00: zero/False, 0xFF: NaN/-1/True): an element it never writes differs between
  the runs, or from the right answer, in at least one of them.
- Guard zones on both sides: `shift_ast(ast, front)` moves every global buffer access `front`
  elements up, so a buffer is [front guard | data | back guard] and an access "before index 0" lands
  in the front guard. Output guards hold the sentinel and must survive; input guards hold `poison`
  (NaN, the most negative int, True) so an out-of-bounds read shows up in the result.
"""
from __future__ import annotations
from typing import Optional
import numpy as np
from tilecraft.dtype import DType, bf16_bits_from_f32, dtypes
from tilecraft.ops import BufferOps, LazyOp, MemBuffer
from tilecraft.shape.shapetracker import ShapeTracker

SENTINELS = (0x00, 0xFF)

def tolerance(dtype: DType) -> tuple[float, float]:
  """(rtol, atol) for comparing outputs of `dtype`: exact for ints and bools."""
  dt = dtype.scalar()
  if not dtypes.is_float(dt): return 0.0, 0.0
  return {dtypes.float64: (1e-9, 1e-9), dtypes.float32: (1e-4, 1e-4), dtypes.float16: (1e-2, 1e-2), dtypes.bfloat16: (2e-2, 2e-2)}[dt]

def compare(got: np.ndarray, want: np.ndarray, dtype: DType, rtol: Optional[float] = None, atol: Optional[float] = None,
            scale: float = 1.0) -> Optional[str]:
  """None if got matches want element by element (see the module docstring), else a description of
  the mismatch: how many elements differ, the first few, and the largest error."""
  got, want = np.asarray(got), np.asarray(want)
  if got.size != want.size: return f"size mismatch: got {got.shape}, want {want.shape}"
  g, w = got.reshape(-1), want.reshape(-1)
  drt, dat = tolerance(dtype)
  rtol, atol = (drt if rtol is None else rtol), (dat if atol is None else atol)
  if dtypes.is_float(dtype):
    g64, w64 = g.astype(np.float64), w.astype(np.float64)
    both_nan = np.isnan(g64) & np.isnan(w64)
    with np.errstate(invalid="ignore"):
      close = (g64 == w64) | (np.abs(g64 - w64) <= atol * scale + rtol * np.abs(w64))
    ok = both_nan | (close & np.isfinite(g64) & np.isfinite(w64)) | ((g64 == w64) & np.isinf(w64))
  elif dtype.scalar() == dtypes.bool: ok = g.astype(np.bool_) == w.astype(np.bool_)
  else: ok = g.astype(np.int64) == w.astype(np.int64)
  if ok.all(): return None
  bad = np.nonzero(~ok)[0]
  shown = ", ".join(f"[{j}] got {g[j]!r} want {w[j]!r}" for j in bad[:5])
  tol = f", rtol={rtol}, atol={atol}" + (f" x {scale:.3g}" if scale != 1.0 else "") if dtypes.is_float(dtype) else ""
  return f"{len(bad)}/{g.size} elements differ ({dtype.name}{tol}; max error {max_abs_error(g, w):.3g}): {shown}"

def max_abs_error(got: np.ndarray, want: np.ndarray) -> float:
  """The largest |got - want| where they differ (inf where one is NaN or infinite and the other isn't)."""
  g, w = np.asarray(got, dtype=np.float64).reshape(-1), np.asarray(want, dtype=np.float64).reshape(-1)
  if g.size != w.size: return float("inf")
  with np.errstate(invalid="ignore"):
    same = (g == w) | (np.isnan(g) & np.isnan(w))
    diff = np.where(same, 0.0, np.abs(g - w))
  return float(np.nan_to_num(diff, nan=np.inf).max()) if diff.size else 0.0

# ---- buffer contents -----------------------------------------------------------------------------

def raw_bytes(arr: np.ndarray, dtype: DType) -> np.ndarray:
  """Element-wise raw bytes (n, itemsize) of what Buffer.numpy() returned for a `dtype` buffer."""
  if dtype.scalar() == dtypes.bfloat16: arr = np.asarray(bf16_bits_from_f32(arr))
  return np.ascontiguousarray(arr).view(np.uint8).reshape(-1, dtype.itemsize)

def filled(dtype: DType, n: int, byte: int) -> np.ndarray:
  """n elements whose bytes are all `byte`, as the array Buffer.copyin takes."""
  raw = np.full(n * dtype.itemsize, byte, dtype=np.uint8)
  if dtype.scalar() == dtypes.bfloat16: return raw.view(np.uint16)
  assert dtype.np is not None, dtype
  return raw.view(dtype.np)

def buffer_array(dtype: DType, arr: np.ndarray) -> np.ndarray:
  """arr as the flat array a `dtype` Buffer copies in and out byte for byte (bfloat16: its uint16 bits)."""
  arr = np.ascontiguousarray(arr).reshape(-1)
  if dtype.scalar() == dtypes.bfloat16 and arr.dtype != np.uint16: return np.asarray(bf16_bits_from_f32(arr.astype(np.float32)))
  return arr

def poison(dtype: DType, n: int) -> np.ndarray:
  """Guard-zone values for inputs: NaN for floats, the most negative value for ints, True for bools."""
  if dtype.scalar() == dtypes.bfloat16: return np.full(n, 0x7FC1, dtype=np.uint16)
  if dtypes.is_float(dtype): return np.full(n, np.nan, dtype=dtype.np)
  if dtype == dtypes.bool: return np.ones(n, dtype=np.bool_)
  return np.full(n, dtypes.min(dtype), dtype=dtype.np)

def random_array(dtype: DType, n: int, rng: np.random.Generator) -> np.ndarray:
  """Test data: floats in [-1, 1) (zero mean keeps long sums well conditioned); ints nonzero (safe
  divisors) and small, of both signs for signed types (-7..-1, 1..7); bools both ways."""
  if dtypes.is_float(dtype): return rng.uniform(-1, 1, n).astype(dtype.np if dtype.np is not None else np.float32)
  if dtype.scalar() == dtypes.bool: return rng.integers(0, 2, n).astype(np.bool_)
  mag = rng.integers(1, 8, n)
  if not dtypes.is_unsigned(dtype): mag = np.where(rng.integers(0, 2, n) == 1, mag, -mag)
  return mag.astype(dtype.np)

# ---- the front guard -----------------------------------------------------------------------------

def shift_st(st: ShapeTracker, front: int) -> ShapeTracker:
  """st with every memory index moved up by `front` (the first view is the one that addresses memory)."""
  v = st.views[0]
  return ShapeTracker((type(v).create(v.shape, v.strides, v.offset + front, v.mask),) + st.views[1:])

def shift_ast(ast: LazyOp, front: int) -> LazyOp:
  """The same kernel addressing every global buffer `front` elements further in (local buffers stay)."""
  if front == 0: return ast
  cache: dict[LazyOp, LazyOp] = {}
  def go(x: LazyOp) -> LazyOp:
    if x in cache: return cache[x]
    arg = x.arg
    if x.op in (BufferOps.LOAD, BufferOps.STORE) and isinstance(arg, MemBuffer) and arg.idx >= 0:
      arg = MemBuffer(arg.idx, arg.dtype, shift_st(arg.st, front))
    cache[x] = out = LazyOp(x.op, tuple(go(s) for s in x.src), arg)
    return out
  return go(ast)
