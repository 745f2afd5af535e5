"""The building blocks of the kernel corpus (tilecraft.testing.corpus, which re-exports every name
here): `CorpusEntry`, short constructors for kernel ASTs (`ld`, `const`, `alu`, `cast`, `red`, `store`,
`kernel`, `ST`, `bcast`) and the numpy helpers the references and input makers share (`rand`, `bf16`,
`np_floordiv`, `np_mod`). Tests build their own ASTs with the same constructors."""
from __future__ import annotations
from dataclasses import dataclass, field
from typing import Any, Callable, Optional
import numpy as np
from tilecraft.dtype import DType, bf16_bits_from_f32, dtypes, f32_from_bf16_bits
from tilecraft.ops import BufferOps, ConstBuffer, LazyOp, MemBuffer, MetaOps, ReduceOps, UnaryOps
from tilecraft.shape.shapetracker import ShapeTracker
from tilecraft.shape.symbolic import Variable

Inputs = dict[int, np.ndarray]
VarVals = dict[Variable, int]

@dataclass
class CorpusEntry:
  """One kernel of the corpus: its AST, an input maker and an independent numpy reference."""
  name: str
  ast: LazyOp
  make_inputs: Callable[[np.random.Generator], Inputs]
  reference: Optional[Callable[[Inputs, VarVals], list[np.ndarray]]]  # None: checked against its unoptimized kernel only
  var_vals: list[VarVals] = field(default_factory=lambda: [{}])
  rtol: Optional[float] = None  # None: by the output dtype (see engine/verify.py: tolerance)
  atol: Optional[float] = None
  tags: tuple[str, ...] = ()
  atol_scaled: bool = False  # atol is a fraction of the reference's largest finite |value| (a recorded kernel's, fuzz.recorded_entry)
  origin: Optional[tuple] = None  # where a worker process rebuilds the entry from (fuzz.entry_from); None: the corpus, by name
  def __repr__(self) -> str: return f"<CorpusEntry {self.name}>"

# ---- AST building helpers ------------------------------------------------------------------------

ST = ShapeTracker.from_shape

def ld(idx: int, dt: DType, st: ShapeTracker) -> LazyOp: return LazyOp(BufferOps.LOAD, (), MemBuffer(idx, dt, st))
def const(val: Any, dt: DType, st: ShapeTracker) -> LazyOp: return LazyOp(BufferOps.CONST, (), ConstBuffer(val, dt, st))
def alu(op: Any, *src: LazyOp) -> LazyOp: return LazyOp(op, tuple(src))
def cast(x: LazyOp, dt: DType) -> LazyOp: return LazyOp(UnaryOps.CAST, (x,), dt)
def red(op: ReduceOps, x: LazyOp, axes: tuple[int, ...]) -> LazyOp: return LazyOp(op, (x,), tuple(axes))
def store(idx: int, dt: DType, st: ShapeTracker, x: LazyOp) -> LazyOp: return LazyOp(BufferOps.STORE, (x,), MemBuffer(idx, dt, st))
def kernel(*stores: LazyOp) -> LazyOp: return LazyOp(MetaOps.KERNEL, tuple(stores))

def bcast(shape: tuple[int, ...], full: tuple[int, ...]) -> ShapeTracker:
  """A contiguous buffer of `shape` (same rank as full, 1 where broadcast) expanded to `full`."""
  return ST(shape).expand(full)

# ---- numpy helpers -------------------------------------------------------------------------------

def bf16(x: Any) -> np.ndarray:
  """Round float32 values to bfloat16 (nearest even), returned as float32."""
  return np.asarray(f32_from_bf16_bits(bf16_bits_from_f32(np.asarray(x, dtype=np.float32))))

def rand(rng: np.random.Generator, dt: DType, shape: Any, lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
  """Random values of dt in [lo, hi] (ints: inclusive); bfloat16 as bfloat16-exact float32."""
  shape = (shape,) if isinstance(shape, int) else tuple(shape)
  if dt == dtypes.bool: return rng.integers(0, 2, shape).astype(np.bool_)
  if dt == dtypes.bfloat16: return bf16(rng.uniform(lo, hi, shape).astype(np.float32))
  npdt = dt.np
  assert npdt is not None
  if dtypes.is_float(dt): return rng.uniform(lo, hi, shape).astype(npdt)
  info = np.iinfo(npdt)
  return rng.integers(max(int(lo), info.min), min(int(hi), info.max) + 1, shape, dtype=np.int64).astype(npdt)

def np_floordiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  with np.errstate(divide="ignore", invalid="ignore"): return np.where(b == 0, 0, a // np.where(b == 0, 1, b)).astype(a.dtype)
def np_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  with np.errstate(divide="ignore", invalid="ignore"): return np.where(b == 0, 0, a % np.where(b == 0, 1, b)).astype(a.dtype)

def _errstate() -> Any: return np.errstate(all="ignore")
