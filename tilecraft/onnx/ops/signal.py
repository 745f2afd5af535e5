"""ONNX signal ops, and a few small ops that have no other home. Contract, per op:

- DFT (opsets 17 and 20: axis an attribute, then an input): forward and inverse, real ([..., 1]) or complex ([..., 2]) input,
  onesided (RFFT; the IRFFT of a one-sided spectrum), dft_length (zero padding or truncation; build-time value, read with
  Node.static). A DFT is one matmul of the input (the transformed axis moved next to the real/imaginary one and flattened with
  it) by a (length * 1|2, bins * 1|2) matrix of cos/sin, made at build time in float64 with angles reduced to the first quadrant
  (exact 0 and +-1 at multiples of a quarter turn) and cast to the compute dtype: float32 (float16/bfloat16 are computed in
  float32 and rounded once), float64 stays. Matrices over 2**26 elements (an O(n^2) DFT of a very long axis) are refused.
  A forward onesided DFT of complex input keeps the first n//2+1 bins of the full transform (the reference's reading); the
  IRFFT ignores the imaginary parts of bin 0 and bin n/2 (what numpy.fft.irfft does).
- STFT: frames of the signal ([batch, length, 1|2]) as a strided view, times the window, through the DFT matrix.
  frame_step and frame_length are build-time values; onesided (default 1) keeps frame_length//2+1 bins.
- MelWeightMatrix: computed at build time (numpy) from its build-time inputs, the reference's bin layout; any output_datatype
  with a numpy dtype (bfloat16 through ml_dtypes).
- Det: batched, LU factorization with partial pivoting unrolled for the static matrix size (the pivot row chosen per matrix
  at runtime by a one-hot select), the determinant the product of the pivots with the sign of the row swaps; in float32 for
  float16/bfloat16/float32 (rounded once) and float64 for float64. Matrices larger than 64x64 are refused.
- BitCast (opset 26): Tensor.bitcast between dtypes of equal size; a size-changing cast (invalid per the spec) is refused.
- ReverseSequence: the first sequence_lens[b] steps of each batch entry reversed, the rest copied: a one-hot select over the
  time axis with the lengths at runtime (graph inputs allowed), exact for every bit pattern (floats are selected as integers
  of their size). A length outside 0..T (the time axis) is an IndexError naming the node (Node.check_lengths, on every call).
- SwiGLU (opset 28): Y = A * sigmoid(alpha * A) * B on identical shapes, in float32 for float16/bfloat16, rounded once.
Anything else (an axis on the real/imaginary dimension, a last dimension other than 1 or 2, shapes the spec rules out) raises
unsupported(node, why): a NotImplementedError naming the node."""
from __future__ import annotations
from typing import Optional
import numpy as np
from tilecraft.dtype import DType, dtypes
from tilecraft.onnx.ops.common import const, select_sum, static_scalar, wide
from tilecraft.onnx.registry import Node, op, unsupported
from tilecraft.onnx.types import onnx_dtype
from tilecraft.tensor import Tensor

MAX_DFT_MATRIX = 1 << 26  # elements of a DFT matrix (256 MiB in float32)
MAX_DET_SIZE = 64

def _cis(m: np.ndarray, N: int) -> tuple[np.ndarray, np.ndarray]:
  """cos and sin of 2 pi m / N (integer m) in float64, from an angle reduced to [0, pi/2): exact at quarter turns."""
  m = np.asarray(m, dtype=np.int64) % N
  q, r = (4 * m) // N, (4 * m) % N
  phi = (np.pi / 2) * (r / N)
  c0, s0 = np.cos(phi), np.sin(phi)
  c = np.select([q == 0, q == 1, q == 2], [c0, -s0, -c0], s0)
  s = np.select([q == 0, q == 1, q == 2], [s0, c0, -s0], -c0)
  return c, s

def _dft_matrix(rows: int, cin: int, cols: int, N: int, inverse: bool, irfft: bool) -> np.ndarray:
  """The (rows * cin, cols * cout) float64 matrix taking a signal (index n, then re/im) to its transform (index k, then re/im).
  Forward: sum_n x[n] e^{-2 pi i k n / N}; inverse: (1/N) sum_n x[n] e^{+2 pi i k n / N}; irfft: the rows are the one-sided
  spectrum's bins k, the columns the real output's samples n, each bin but 0 and N/2 counted twice (its mirror image)."""
  r, k = np.arange(rows)[:, None], np.arange(cols)[None, :]
  c, s = _cis(r * k, N)
  if irfft:
    w = np.where((r == 0) | (2 * r == N), 1.0, 2.0) / N
    W = np.stack([w * c, -w * s], axis=1)[:, :cin, :, None]  # (rows, re|im, cols, 1)
    return W.reshape(rows * cin, cols)
  sg, sc = (1.0, 1.0 / N) if inverse else (-1.0, 1.0)
  # (x_re + i x_im)(c + i sg s) = (x_re c - sg x_im s) + i (x_im c + sg x_re s)
  W = np.stack([np.stack([c, sg * s], axis=-1), np.stack([-sg * s, c], axis=-1)], axis=1) * sc  # (rows, re|im in, cols, re|im out)
  return W[:, :cin].reshape(rows * cin, cols * 2)

def _matrix(n: Node, W: np.ndarray, like: Tensor) -> Tensor:
  if W.size > MAX_DFT_MATRIX:
    raise unsupported(n, f"a DFT matrix of {W.shape[0]}x{W.shape[1]} (a direct O(n^2) transform; at most {MAX_DFT_MATRIX} elements)")
  return Tensor(W.astype(np.float64 if like.dtype == dtypes.float64 else np.float32), device=like.device)

def _float_input(n: Node, x: Tensor) -> None:
  if not dtypes.is_float(x.dtype): raise unsupported(n, f"input of dtype {x.dtype.name}")

@op("DFT", since=17)
def _dft(n: Node, i: list) -> Tensor:
  x = i[0]
  _float_input(n, x)
  r = x.ndim
  if r < 2 or x.shape[-1] not in (1, 2): raise unsupported(n, f"input of shape {x.shape} (the last dimension 1 for real, 2 for complex)")
  a = n.attr("axis", 1) if n.opset < 20 else int(static_scalar(n, 2, "axis", -2))
  if not (-r <= a <= -2 or 0 <= a <= r - 2): raise unsupported(n, f"axis {a} for a rank-{r} input (valid: {-r}..-2 and 0..{r - 2})")
  a %= r
  inverse, onesided = bool(n.attr("inverse", 0)), bool(n.attr("onesided", 0))
  irfft = inverse and onesided
  L, cin = x.shape[a], x.shape[-1]
  N = int(static_scalar(n, 1, "dft_length", 2 * (L - 1) if irfft else L))
  if N is None or N < 1: raise unsupported(n, f"dft_length {N} (at least 1)")
  rows = min(L, N // 2 + 1 if irfft else N)  # padding adds nothing to the sums; truncation drops rows
  cols = N if irfft or not onesided else N // 2 + 1
  W = _matrix(n, _dft_matrix(rows, cin, cols, N, inverse, irfft), wide(x))
  perm = [d for d in range(r - 1) if d != a] + [a, r - 1]
  xt = wide(x).permute(*perm)
  xt = xt.shrink(tuple([None] * (r - 2) + [(0, rows), None]))
  lead = xt.shape[:-2]
  cout = 1 if irfft else 2
  y = xt.reshape(*lead, rows * cin).matmul(W).reshape(*lead, cols, cout)
  return y.permute(*[perm.index(d) for d in range(r)]).cast(x.dtype)

def _frames(x: Tensor, T: int, F: int, step: int) -> Tensor:
  """(B, T, F, C) frames x[:, t*step : t*step+F] of x (B, L, C), as a view: T+k copies of the signal, read with rows
  `step` samples longer than the signal so each row starts `step` samples further in."""
  B, _, C = x.shape
  need = (T - 1) * step + F
  y = x.shrink((None, (0, need), None)).reshape(B, 1, need * C)
  k = -(-T * step // need)  # extra copies so T rows of (need + step) samples fit
  y = y.expand(B, T + k, need * C).reshape(B, (T + k) * need * C)
  y = y.shrink((None, (0, T * (need + step) * C))).reshape(B, T, (need + step) * C)
  return y.shrink((None, None, (0, F * C))).reshape(B, T, F, C)

@op("STFT", since=17)
def _stft(n: Node, i: list) -> Tensor:
  x = i[0]
  _float_input(n, x)
  if x.ndim != 3 or x.shape[-1] not in (1, 2): raise unsupported(n, f"signal of shape {x.shape} ([batch, length, 1 or 2])")
  B, L, C = x.shape
  step = static_scalar(n, 1, "frame_step")
  win = i[2] if n.has(2) else None
  if win is not None and win.ndim != 1: raise unsupported(n, f"a window of shape {win.shape} (1-D)")
  F = int(static_scalar(n, 3, "frame_length", win.shape[0] if win is not None else L))
  if win is not None and win.shape[0] != F: raise unsupported(n, f"a window of length {win.shape[0]} for frame_length {F}")
  if step is None or step < 1 or F is None or not 1 <= F <= L:
    raise unsupported(n, f"frame_step {step} and frame_length {F} for a signal of length {L}")
  T = (L - F) // step + 1
  fr = _frames(wide(x), T, F, step)
  if win is not None: fr = fr * win.cast(fr.dtype).reshape(1, 1, F, 1)
  K = F // 2 + 1 if n.attr("onesided", 1) else F
  W = _matrix(n, _dft_matrix(F, C, K, F, False, False), fr)
  return fr.reshape(B, T, F * C).matmul(W).reshape(B, T, K, 2).cast(x.dtype)

@op("MelWeightMatrix", since=17)
def _mel_weight_matrix(n: Node, i: list) -> np.ndarray:
  """Triangles of peak 1 on num_mel_bins + 2 points equally spaced in mel (step (high - low) / (num_mel_bins + 2), as the
  reference and onnxruntime space them) mapped to spectrogram bins floor((dft_length + 1) f / sample_rate)."""
  bins, dft_len, rate = (static_scalar(n, k, w) for k, w in ((0, "num_mel_bins"), (1, "dft_length"), (2, "sample_rate")))
  lo, hi = (np.asarray(n.static(k)).reshape(()) for k in (3, 4))
  if bins is None or dft_len is None or rate is None or bins < 1 or dft_len < 1 or rate < 1:
    raise unsupported(n, f"num_mel_bins {bins}, dft_length {dft_len}, sample_rate {rate} (positive)")
  spec = dft_len // 2 + 1
  mel_lo, mel_hi = (2595 * np.log1p(e / e.dtype.type(700)) / np.log(10) for e in (lo, hi))  # (in the edges' dtype, as the reference)
  mel = np.arange(bins + 2) * ((mel_hi - mel_lo) / (bins + 2)) + mel_lo
  hz = 700 * np.expm1(mel / 2595 * np.log(10))
  f = (((dft_len + 1) * hz) // rate).astype(np.int64)
  if f.min() < 0 or f[:-1].max() >= spec or f[-1] > spec or np.any(np.diff(f) < 0):  # (the last point only ends the last band's ramp)
    raise unsupported(n, f"mel band edges at spectrogram bins {f.tolist()} outside 0..{spec - 1} (edges {float(lo)}..{float(hi)} Hz at {rate} Hz)")
  out = np.zeros((spec, bins))
  j = np.arange(spec)
  for m in range(bins):
    l, c, h = int(f[m]), int(f[m + 1]), int(f[m + 2])
    if c == l: out[c, m] = 1.0
    else: out[:, m] = np.where((j >= l) & (j <= c), (j - l) / max(c - l, 1), 0.0)
    if h > c: out[:, m] = np.where((j >= c) & (j < h), (h - j) / (h - c), out[:, m])
  dt = onnx_dtype(n.attr("output_datatype", 1), f"{n.describe()} output_datatype")
  if dt.np is not None: return out.astype(dt.np)
  if dt == dtypes.bfloat16:
    try:
      import ml_dtypes
      return out.astype(ml_dtypes.bfloat16)
    except ImportError: pass
  raise unsupported(n, f"output_datatype {dt.name}")

@op("Det", since=11)
def _det(n: Node, i: list) -> Tensor:
  """LU with partial pivoting (the largest magnitude in the column, the first one on ties, as LAPACK's getrf): at step k the
  pivot row of each matrix is selected by a one-hot mask and swapped with row k; the rows below subtract their multiple of it.
  A column of zeros gives a zero pivot and a zero determinant (its multipliers are 0, not nan)."""
  x = i[0]
  _float_input(n, x)
  if x.ndim < 2 or x.shape[-1] != x.shape[-2]: raise unsupported(n, f"input of shape {x.shape} ([*, M, M])")
  M, batch = x.shape[-1], tuple(x.shape[:-2])
  if M > MAX_DET_SIZE: raise unsupported(n, f"{M}x{M} matrices (the LU is unrolled: at most {MAX_DET_SIZE}x{MAX_DET_SIZE})")
  if M == 0 or 0 in batch: return Tensor.full(batch, 1.0, x.dtype, x.device)
  a = wide(x).reshape(-1, M, M)
  det: Optional[Tensor] = None
  for k in range(M):
    R = M - k
    col = a.shrink((None, None, (0, 1))).reshape(-1, R)
    if R > 1:
      p = col.abs().argmax(axis=1).reshape(-1, 1)
      hot = p == Tensor.arange(R, dtype=p.dtype, device=x.device).reshape(1, R)  # (B, R): the pivot row
      prow = select_sum(hot.reshape(-1, R, 1), a, 1)  # (B, R)
      row0 = a.shrink((None, (0, 1), None))
      rest = hot.shrink((None, (1, R))).reshape(-1, R - 1, 1).where(row0, a.shrink((None, (1, R), None)))  # row k moves to the pivot's place
      piv = prow.shrink((None, (0, 1)))  # (B, 1)
      piv_signed = (p != 0).where(-piv, piv)
      f = (piv == 0).where(const(piv, 0), rest.shrink((None, None, (0, 1))).reshape(-1, R - 1) / piv)
      a = rest.shrink((None, None, (1, R))) - f.reshape(-1, R - 1, 1) * prow.shrink((None, (1, R))).reshape(-1, 1, R - 1)
    else: piv_signed = col
    det = piv_signed if det is None else det * piv_signed
  assert det is not None
  return det.reshape(batch).cast(x.dtype)

@op("Det", since=22)
def _det22(n: Node, i: list) -> Tensor: return _det(n, i)

@op("BitCast", since=26)
def _bitcast(n: Node, i: list) -> Tensor:
  x = i[0]
  to = onnx_dtype(int(n.attr("to", 0)), f"{n.describe()} attribute 'to'")
  if to.itemsize != x.dtype.itemsize:
    raise unsupported(n, f"BitCast {x.dtype.name} -> {to.name}: sizes differ ({x.dtype.itemsize} vs {to.itemsize} bytes)")
  return x if to == x.dtype else x.bitcast(to)

_SAME_SIZE_INT: dict[int, DType] = {1: dtypes.uint8, 2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}

@op("ReverseSequence", since=10)
def _reverse_sequence(n: Node, i: list) -> Tensor:
  x, lens = i[0], i[1]
  b_ax, t_ax = int(n.attr("batch_axis", 1)), int(n.attr("time_axis", 0))
  if {b_ax, t_ax} != {0, 1} or x.ndim < 2:
    raise unsupported(n, f"batch_axis {b_ax} and time_axis {t_ax} on a rank-{x.ndim} input (0 and 1, either way)")
  B, T = x.shape[b_ax], x.shape[t_ax]
  if tuple(lens.shape) != (B,): raise unsupported(n, f"sequence_lens of shape {lens.shape} for batch size {B}")
  n.check_lengths(1, T, t_ax)  # (a length outside 0..T: an IndexError naming the node)
  xs = x if b_ax == 0 else x.permute(1, 0, *range(2, x.ndim))  # (B, T, ...)
  rest = xs.shape[2:]
  ln = lens.cast(dtypes.int64).reshape(B, 1)
  t = Tensor.arange(T, dtype=dtypes.int64, device=x.device).reshape(1, T)
  src = (t < ln).where(ln - 1 - t, t)  # (B, T): the time step each output step copies
  hot = (src.reshape(B, T, 1) == t.reshape(1, 1, T)).reshape(B, T, T, *([1] * len(rest)))
  bits = dtypes.is_float(xs.dtype) and xs.dtype.itemsize in _SAME_SIZE_INT
  src_x = xs.bitcast(_SAME_SIZE_INT[xs.dtype.itemsize]) if bits else xs  # (selected as integers: -0.0 and nan payloads kept)
  y = select_sum(hot, src_x.reshape(B, 1, T, *rest), 2)
  if bits: y = y.bitcast(xs.dtype)
  return y if b_ax == 0 else y.permute(1, 0, *range(2, x.ndim))

@op("ReverseSequence", since=28)
def _reverse_sequence28(n: Node, i: list) -> Tensor: return _reverse_sequence(n, i)

@op("SwiGLU", since=28)
def _swiglu(n: Node, i: list) -> Tensor:
  A, Bv = i[0], i[1]
  _float_input(n, A)
  if tuple(A.shape) != tuple(Bv.shape) or A.dtype != Bv.dtype:
    raise unsupported(n, f"A {A.shape} {A.dtype.name} and B {Bv.shape} {Bv.dtype.name} (identical shapes and dtypes, no broadcasting)")
  alpha = float(n.attr("alpha", 1.0))
  a = wide(A)
  return (a * (a * alpha).sigmoid() * wide(Bv)).cast(A.dtype)
