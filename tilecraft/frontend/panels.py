"""Matmuls against a constant weight stored in column panels: x (..., K) @ w (K, N) with w laid out as
(N / P, K, P), P = PANEL columns per panel, each panel one contiguous run of K x P values.

Why. The CPU matmul tile reads a panel of the weight's columns (the whole reduce x one tile of columns) for
every row tile. In w's own row-major layout that panel is K rows N values apart: the kernel packs it first
(PACK), a strided gather of 64-128 bytes per row, one row per 4 KB page or more, which is latency-bound when
the rows are few and the weight is large (a transformer's projections at small batch). Stored in panels, the
same reads are one sequential stream per panel, and there is nothing to pack. ONNX models know their weights
at load, so the layout costs one numpy transpose then.

Measured interleaved in one process, hand-coded opts, AVX-512 (Zen 4), kernels alone: 32 x 1024 @ 1024 x 2816
(a LLaMA-style MLP's projection) 1.9x faster (832 vs 1582-1697 us), 8 x 4096 @ 4096 x 2048 (decode) 1.4x, GPT-2's
QKV 128 x 768 @ 768 x 2304 1.15x; AVX2 (CPU_ARCH=haswell) about level (0.97-1.03x: there the tile's 16 columns are
one cache line per weight row, which the pack streams nearly as fast). Whole single-MatMul ONNX models, against
the same models without the layout, in one process: 1.19-2.04x on AVX-512, 1.07-1.21x on AVX2.

Contract: `panel_eligible(x_shape, w_shape, dtype, device)` says where the layout is taken: a CPU device
(winograd.on_cpu), float32 or float64, a 2-D weight whose N is a multiple of PANEL (at least 2 panels) and
whose K is at least PANEL, and at least PANEL_MIN_ROWS rows of x (fewer rows: the matrix-vector rules stream
w's rows whole, which the layout would not help). `panel_layout(w)` is the (N / P, K, P) array;
`panel_matmul(x, wp)` equals x @ w up to rounding (the same products; the kernel's opts choose the summation order)."""
from __future__ import annotations
from typing import TYPE_CHECKING, Any, Sequence
import numpy as np
from tilecraft.dtype import dtypes
from tilecraft.frontend.winograd import on_cpu
from tilecraft.helpers import prod
if TYPE_CHECKING: from tilecraft.tensor import Tensor

PANEL = 16          # one AVX-512 vector of float32 columns, two AVX2 ones
PANEL_MIN_ROWS = 8  # the matmul tile's rows on AVX-512

def panel_eligible(x_shape: Sequence[Any], w_shape: Sequence[Any], dtype: Any, device: str) -> bool:
  """Whether x (x_shape) @ w (w_shape, a constant) takes the panel layout (see the module docstring)."""
  if not on_cpu(device) or dtype not in (dtypes.float32, dtypes.float64) or len(w_shape) != 2 or len(x_shape) < 2: return False
  if not all(isinstance(s, int) for s in (*x_shape, *w_shape)): return False
  k, n = w_shape
  return x_shape[-1] == k >= PANEL and n % PANEL == 0 and n >= 2 * PANEL and prod(x_shape[:-1]) >= PANEL_MIN_ROWS

def panel_layout(w: np.ndarray) -> np.ndarray:
  """w (K, N) as (N / PANEL, K, PANEL), contiguous."""
  k, n = w.shape
  return np.ascontiguousarray(w.reshape(k, n // PANEL, PANEL).transpose(1, 0, 2))

def panel_matmul(x: "Tensor", wp: "Tensor") -> "Tensor":
  """x (..., K) @ the weight whose panel layout is wp (N / PANEL, K, PANEL): (..., N)."""
  panels, k, p = wp.shape
  lead = x.shape[:-1]
  return (x.reshape(*lead, 1, k, 1) * wp).sum(-2).reshape(*lead, panels * p)
