"""The tensor cores of each vendor, written down once: tile dims, dtypes, and which lane/register
of a warp holds which element of A, B and C.

Convention (all vendors): one instruction computes C[N,M] += A[N,K] @ B[K,M] for `dims=(N,M,K)`
across the `threads` lanes of a warp (simdgroup, wave32). Every layout here is a bit map: bit j of
the lane id is one bit of one tile coordinate ("n0" = bit 0 of the row of A/C, "m2" = bit 2 of the
column of B/C, "k3" = bit 3 of the reduce index), and likewise bit j of the register index (the
position in the lane's fragment vector). A lane bit mapped to None means the two half-waves hold
copies of the same values (RDNA3 wave32 A and B).

Sources:
- CUDA: PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" (.f16/.bf16 A and B,
  .f32 C/D), groupID = laneid >> 2, threadID_in_group = laneid % 4. dims are (8, 16, 16) as DESIGN
  §5.2 writes them, so the instruction computes the transpose: C^T = B^T A^T, i.e. PTX's A (m x k)
  is our B transposed (M = PTX m = 16), PTX's B (k x n) is our A transposed (N = PTX n = 8), and
  PTX's D (m x n) is our C transposed.
- AMD: RDNA3 ISA, WMMA (v_wmma_f32_16x16x16_f16 / v_wmma_f16_16x16x16_f16, wave32): lane l holds
  row l % 16 of A and column l % 16 of B, register i = K index i; lanes 16-31 repeat lanes 0-15.
  C/D: lane l, register v is D[2v + l // 16][l % 16] (for 16-bit D, in the low half of each VGPR).
- Metal: Apple documents simdgroup_matrix<T,8,8> but not which thread holds which element; the
  layout used here is the one Apple-silicon GEMM libraries rely on (MLX steel `get_coord`): with
  q = lane / 4, row = (q & 4) + (lane / 2) % 4, col = (q & 2) * 2 + (lane % 2) * 2 + i, the same
  for every simdgroup_matrix (so for A, B and C).
"""
from __future__ import annotations
import functools
from dataclasses import dataclass
from typing import Optional
import numpy as np
from tilecraft.dtype import DType, dtypes

@dataclass(frozen=True)
class Fragment:
  """Which tile element each (lane, register) of one operand holds. `lanes[j]` / `regs[j]` name the
  tile-coordinate bit that bit j of the lane id / register index is (None: a replicated lane bit)."""
  lanes: tuple[Optional[str], ...]
  regs: tuple[str, ...]
  @property
  def n_regs(self) -> int: return 1 << len(self.regs)
  def coord(self, lane: int, reg: int) -> dict[str, int]:
    """{dim letter: coordinate} of the element at (lane, reg)."""
    out: dict[str, int] = {}
    for j, b in enumerate(self.lanes):
      if b is not None: out[b[0]] = out.get(b[0], 0) | (((lane >> j) & 1) << int(b[1:]))
    for j, b in enumerate(self.regs): out[b[0]] = out.get(b[0], 0) | (((reg >> j) & 1) << int(b[1:]))
    return out
  def slot(self, coord: dict[str, int]) -> tuple[int, int]:
    """(lane, reg) holding the element at `coord` (replicated lane bits 0)."""
    lane = sum(((coord[b[0]] >> int(b[1:])) & 1) << j for j, b in enumerate(self.lanes) if b is not None)
    reg = sum(((coord[b[0]] >> int(b[1:])) & 1) << j for j, b in enumerate(self.regs))
    return lane, reg

@dataclass(frozen=True)
class TensorCoreLayout:
  vendor: str  # "CUDA" | "AMD" | "METAL": which instruction renders it
  a: Fragment
  b: Fragment
  c: Fragment

def _bits(dim: str, size: int) -> list[str]: return [f"{dim}{i}" for i in range(size.bit_length() - 1)]

def check_layout(dims: tuple[int, int, int], threads: int, lay: TensorCoreLayout) -> None:
  """Every fragment covers its operand's tile exactly once (replicated lanes aside)."""
  n, m, k = dims
  for name, frag, want in (("A", lay.a, _bits("n", n) + _bits("k", k)), ("B", lay.b, _bits("k", k) + _bits("m", m)),
                           ("C", lay.c, _bits("n", n) + _bits("m", m))):
    have = [b for b in frag.lanes if b is not None] + list(frag.regs)
    if len(frag.lanes) != threads.bit_length() - 1 or sorted(have) != sorted(want):
      raise ValueError(f"{name} fragment {frag} doesn't cover the {dims} tile with {threads} lanes once")
  if None in lay.c.lanes: raise ValueError("C can't have replicated lanes")

from tilecraft.renderer import TensorCore  # noqa: E402

# ---- the data ------------------------------------------------------------------------------------
# CUDA sm_80+ mma.sync.aligned.m16n8k16.row.col: PTX B b0..b3 (2 x .f16x2) is our A, PTX A a0..a7
# (4 x .f16x2) our B, PTX D d0..d3 our C (each transposed, see the docstring)
CUDA_MMA_16816 = TensorCoreLayout("CUDA",
  a=Fragment(lanes=("k1", "k2", "n0", "n1", "n2"), regs=("k0", "k3")),
  b=Fragment(lanes=("k1", "k2", "m0", "m1", "m2"), regs=("k0", "m3", "k3")),
  c=Fragment(lanes=("n1", "n2", "m0", "m1", "m2"), regs=("n0", "m3")))
# AMD RDNA3 wave32 v_wmma_*_16x16x16_f16: A/B 16 halves per lane, C 8 values per lane
AMD_WMMA_161616 = TensorCoreLayout("AMD",
  a=Fragment(lanes=("n0", "n1", "n2", "n3", None), regs=("k0", "k1", "k2", "k3")),
  b=Fragment(lanes=("m0", "m1", "m2", "m3", None), regs=("k0", "k1", "k2", "k3")),
  c=Fragment(lanes=("m0", "m1", "m2", "m3", "n0"), regs=("n1", "n2", "n3")))
# Metal simdgroup_matrix 8x8: 2 elements per thread, the same map for every matrix (row, col)
def _metal(row: str, col: str) -> Fragment: return Fragment(lanes=(f"{col}1", f"{row}0", f"{row}1", f"{col}2", f"{row}2"), regs=(f"{col}0",))
METAL_SIMDGROUP_888 = TensorCoreLayout("METAL", a=_metal("n", "k"), b=_metal("k", "m"), c=_metal("n", "m"))

CUDA_TENSOR_CORES = [TensorCore((8, 16, 16), di, dtypes.float32, 32, CUDA_MMA_16816) for di in (dtypes.float16, dtypes.bfloat16)]
AMD_TENSOR_CORES = [TensorCore((16, 16, 16), dtypes.float16, do, 32, AMD_WMMA_161616) for do in (dtypes.float32, dtypes.float16)]
METAL_TENSOR_CORES = [TensorCore((8, 8, 8), di, do, 32, METAL_SIMDGROUP_888)
                      for di, do in ((dtypes.float32, dtypes.float32), (dtypes.float16, dtypes.float32), (dtypes.float16, dtypes.float16))]
TENSOR_CORES: dict[str, list[TensorCore]] = {"CUDA": CUDA_TENSOR_CORES, "AMD": AMD_TENSOR_CORES, "METAL": METAL_TENSOR_CORES}
for _tcs in TENSOR_CORES.values():
  for _tc in _tcs: check_layout(_tc.dims, _tc.threads, _tc.layout)

# ---- executing one instruction (the emulator's WMMA, and the layouts' own tests) -----------------

def _np_dtype(dt: DType) -> np.dtype:
  return np.dtype(np.float32) if dt == dtypes.bfloat16 else np.dtype(dt.np)

@functools.lru_cache(maxsize=None)
def _coords(frag: Fragment, threads: int, dims: str) -> tuple[np.ndarray, np.ndarray]:
  """(rows, cols) of the element at each (lane, reg), shaped (threads, regs)."""
  co = [[frag.coord(lane, reg) for reg in range(frag.n_regs)] for lane in range(threads)]
  return np.array([[c[dims[0]] for c in r] for r in co]), np.array([[c[dims[1]] for c in r] for r in co])

def fragments_to_tiles(tc: TensorCore, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(warps, threads, regs) fragments -> (warps, N, K), (warps, K, M), (warps, N, M) tiles. Replicated
  lanes must agree (as the hardware requires): a mismatch means the kernel laid the data out wrong."""
  n, m, k = tc.dims
  out = []
  for frag, x, shape, dims in ((tc.layout.a, a, (n, k), "nk"), (tc.layout.b, b, (k, m), "km"), (tc.layout.c, c, (n, m), "nm")):
    if x.shape[1:] != (tc.threads, frag.n_regs): raise ValueError(f"{tc}: fragment of shape {x.shape[1:]}, want {(tc.threads, frag.n_regs)}")
    rows, cols = _coords(frag, tc.threads, dims)
    tile = np.zeros((x.shape[0],) + shape, dtype=x.dtype)
    tile[:, rows, cols] = x  # every element once, or (replicated lanes) several times
    if (rows.size > shape[0] * shape[1]) and not np.array_equal(tile[:, rows, cols], x, equal_nan=True):
      raise ValueError(f"{tc}: replicated lanes disagree")
    out.append(tile)
  return out[0], out[1], out[2]

def tiles_to_fragment(frag: Fragment, tile: np.ndarray, threads: int, dims: str) -> np.ndarray:
  """(warps, rows, cols) tile -> (warps, threads, regs) fragments for the operand with coordinates `dims`."""
  rows, cols = _coords(frag, threads, dims)
  return tile[:, rows, cols]

def wmma_warps(tc: TensorCore, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
  """D = A @ B + C for every warp, fragments in and out as (warps, threads, regs). Products are exact
  and summed exactly (in float64), then rounded once to dtype_out."""
  ta, tb, tcc = fragments_to_tiles(tc, a, b, c)
  d = np.matmul(ta.astype(np.float64), tb.astype(np.float64)) + tcc.astype(np.float64)
  d = d.astype(np.float32).astype(_np_dtype(tc.dtype_out))
  return tiles_to_fragment(tc.layout.c, d, tc.threads, "nm")

# ---- the WMMA UOp's arg: plain values (the PYTHON device's listing writes and parses it back) -----

def wmma_arg(tc: TensorCore) -> tuple:
  """(name, dims, dtype_in, dtype_out, threads, vendor, ((lanes, regs) of A, B, C))."""
  lay = tc.layout
  return (str(tc), tc.dims, tc.dtype_in, tc.dtype_out, tc.threads, lay.vendor, tuple((f.lanes, f.regs) for f in (lay.a, lay.b, lay.c)))

def tensor_core_of(arg: tuple) -> TensorCore:
  """The TensorCore a WMMA UOp's arg describes."""
  _, dims, din, dout, threads, vendor, frags = arg
  a, b, c = (Fragment(tuple(lanes), tuple(regs)) for lanes, regs in frags)
  tc = TensorCore(tuple(dims), din, dout, threads, TensorCoreLayout(vendor, a, b, c))
  check_layout(tc.dims, tc.threads, tc.layout)
  return tc
