"""Winograd convolution F(m x m, 3 x 3) for 3x3 stride-1 convs (Lavin & Gray, "Fast Algorithms for
Convolutional Neural Networks", 2015), as a Tensor-level decomposition: four ordinary kernels instead of
one direct conv kernel, with 2.25x (m = 2) or 4x (m = 4) fewer multiplies in the big one.

The math. An output tile Y (m x m) of a 3x3 correlation of an input tile d (a x a, a = m + 2) with a
filter g (3 x 3) is

    Y = A^T [ (G g G^T) * (B^T d B) ] A        (* elementwise, on a x a)

with constant matrices B^T (a x a), G (a x 3), A^T (m x a) (below, points 0, +-1, inf for m = 2 and
0, +-1, +-2, inf for m = 4). Summed over input channels c, the elementwise product becomes, per tile
element e = (i, j) of the a x a tile, a matrix product over c:

    U[e, c, co] = (G g[co, c] G^T)[e]         weight transform: the weights alone (folded at load in ONNX),
                                               stored in blocks of output channels (u_block)
    V[e, t, c]  = (B^T d[t, c] B)[e]           input transform: t runs over the tiles (n, ty, tx)
    M[e, t, co] = sum_c V[e, t, c] U[e, c, co] a batched matmul, one per tile element
    Y[t, co]    = A^T M[:, t, co] A            output transform, back to NCHW

Each 2-D transform is one dense contraction with a Kronecker matrix (kron(B^T, B^T) is a^2 x a^2, so
V[e] = sum_k kron(B^T, B^T)[e, k] d[k]): one reduce kernel each, no stacking of pieces (a stack of
computed pieces is one kernel per piece here, and one kernel with the tile element as a masked axis
evaluates every piece's terms per element: 10-1000x slower). The four kernels of a conv: the input
transform (reading the NCHW input's windows; an NHWC copy first measured no faster), the matmul (output
channels contiguous: the layout the CPU matmul heuristics tile best, 1.4-2.3x faster than tiles
contiguous), the output transform into NHWC (channels contiguous: 1.25-5x faster than a reduce writing
NCHW), and a copy to NCHW that the epilogue (bias, relu, a residual add) fuses into.

Contract: `winograd_conv2d(x, weight, bias, padding, m)` equals `x.conv2d(weight, bias, padding=padding)`
for NCHW x of float32 or float64, a (cout, cin, 3, 3) weight of the same dtype, any batch, padding and
size (tiles past the edge read zeros and their outputs are cropped), up to rounding: F(4x4) has larger
rounding error than the direct sum (its transform entries reach 8 and 1/24). Measured against a float64
reference on random data (weights ~ N(0, 1/(9 cin))) at ResNet-50's 3x3 shapes (64 to 512 channels),
max |error| / max |output|: direct 6.7e-7 to 1.4e-6, F(2x2) 2.5e-7 to 5.3e-7, F(4x4) 5.2e-6 to
1.1e-5 (bench/bench_winograd.py prints it). `choose_tile` is the rule conv2d uses under the WINO setting (helpers.py): 0 never,
1 (default) where the measurements below say it pays, 2 every eligible conv."""
from __future__ import annotations
from typing import TYPE_CHECKING, Optional
import numpy as np
from tilecraft.dtype import dtypes
from tilecraft.helpers import WINO
if TYPE_CHECKING: from tilecraft.tensor import Tensor

# F(2x2, 3x3): interpolation points 0, 1, -1 and infinity
_BT2 = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=np.float64)
_G2 = np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]], dtype=np.float64)
_AT2 = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=np.float64)
# F(4x4, 3x3): points 0, 1, -1, 2, -2 and infinity
_BT4 = np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0],
                 [0, 4, 0, -5, 0, 1]], dtype=np.float64)
_G4 = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]],
               dtype=np.float64)
_AT4 = np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]], dtype=np.float64)
MATRICES: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {2: (_BT2, _G2, _AT2), 4: (_BT4, _G4, _AT4)}  # m -> (B^T, G, A^T)

DEVICES = ("CPU", "LLVM")  # measured there; GPUs keep the direct conv (not measured)

def on_cpu(device: str) -> bool:
  """Whether `device` is one of the CPU devices the frontend's CPU-only conv rewrites (Winograd here, the
  strided 1x1 compaction in nn.py) were measured on."""
  return device.split(":")[0] in DEVICES

def eligible(x: "Tensor", weight: "Tensor", stride: tuple, dilation: tuple, groups: int, acc_dtype: object) -> bool:
  """Whether conv2d(x, weight, ...) can run as Winograd: a 3x3 kernel, stride 1, dilation 1, one group,
  x and weight both float32 or both float64 (no other accumulator), concrete shapes, a CPU device."""
  return (tuple(weight.shape[2:]) == (3, 3) and stride == (1, 1) and dilation == (1, 1) and groups == 1 and acc_dtype is None
          and x.dtype == weight.dtype and x.dtype in (dtypes.float32, dtypes.float64)
          and all(isinstance(s, int) for s in (*x.shape, *weight.shape)) and on_cpu(x.device))

def choose_tile(n: int, cin: int, cout: int, oh: int, ow: int) -> Optional[int]:
  """The output tile m (2 or 4) conv2d uses for an eligible conv under the WINO setting, or None (direct).

  WINO=1 (the default): measured with bench/bench_winograd.py (batch 1, padding 1, bias, relu; direct
  against F(2x2) and F(4x4) interleaved in one process, 5-7 rounds, medians; weight transform excluded,
  as ONNX models fold it; 2 shared cores under load, so +-20%). Time ratio direct / Winograd (> 1:
  Winograd faster), AVX-512 (Zen 4) | CPU_ARCH=haswell (AVX2):
      ResNet-50   64 -> 64  at 56^2:  F4 1.53 F2 1.12 | F4 3.23 F2 2.51
                 128 -> 128 at 28^2:  F4 2.56 F2 2.00 | F4 3.85 F2 3.94
                 256 -> 256 at 14^2:  F4 1.42 F2 1.54 | F4 0.88 F2 1.68
                 512 -> 512 at  7^2:  F4 0.35 F2 0.32 | F4 0.33 F2 0.20
      others      32 -> 64  at 56^2:  F4 1.55          96 -> 128 at 28^2: F4 1.19
                 112 -> 224 at 14^2:  F2 1.23         128 -> 32  at 56^2: F4 0.95 F2 0.34
                 128 -> 32  at 28^2:  F4 1.55         128 -> 32  at 14^2: F2 1.19
      SqueezeNet  32 -> 128 at 27^2:  F4 1.31          16 -> 64  at 55^2: F4 1.12
                  48 -> 192 at 13^2:  F2 0.68         (at 14^2: F2 1.70)
                  64 -> 256 at 13^2:  F2 0.72         (at 14^2: F2 1.77)
                 256 -> 256 at 13^2:  F2 0.93         (at 14^2: F2 1.48; the direct conv takes 1.9x
                                                        longer at 14^2 than at 13^2 for 1.16x the work)
  The rule: F(4x4) where the output has at least 49 4x4 tiles (28^2 and up), else F(2x2) where it has
  at least 49 2x2 tiles (14^2) and no partial tile (even height and width: at 13^2 the direct conv
  is fast and F(2x2) computes 14^2), else direct (at 7^2 the matmul reuses each element of U, 16-38 MB
  for 512 channels against the direct conv's 9.4 MB of weights, only 4-16 times: memory speed).
  Channels: 32 <= cin and 32 <= cout, both <= 256 for F(2x2), <= 512 for F(4x4) (U grows with cin x cout);
  F(2x2) only from 64 output channels (the input transform's cost per channel is against a matmul over cout).
  512 channels at 28^2 (VGG-19's block 4; the same one-time transform excluded, hot), AVX-512: 512 -> 512 F4
  2.9x, 256 -> 512 2.9x, 512 -> 256 2.7x, 384 -> 384 3.2x; AVX2: 512 -> 512 2.4x (against the direct conv
  after its AVX2 tile fix). Including the transform, which a Tensor program recomputes every call (8-12 ms for
  512 x 512), 512 -> 512 was still 1.5x faster on AVX-512. F(2x2) at 14^2 with 512 channels: 1.3-2.7x
  without the transform but 0.8x with it (AVX-512), so not taken.
  DenseNet-121's 128 -> 32 (quiet, 7 rounds): F4 1.49 at 56^2, 1.34 at 28^2, F2 0.93 at 14^2 (the 0.95
  and 1.19 above were measured under load); the model 1.046x (WINO=0 vs 1 alternating, 16 rounds).
  WINO=2: every eligible conv, F(4x4) where the output has at least 49 4x4 tiles, else F(2x2)."""
  mode = int(WINO)
  if mode <= 0 or oh < 1 or ow < 1: return None  # (an empty output: the direct conv says what is wrong)
  t4, t2 = n * -(-oh // 4) * -(-ow // 4), n * -(-oh // 2) * -(-ow // 2)
  if mode >= 2: return 4 if t4 >= 49 else 2
  if not (32 <= cin <= 512 and 32 <= cout <= 512): return None
  if t4 >= 49: return 4
  if cin > 256 or cout > 256: return None
  return 2 if t2 >= 49 and oh % 2 == 0 and ow % 2 == 0 and cout >= 64 else None

_coef_cache: dict[tuple, "Tensor"] = {}

def _coef(which: str, m: int, like: "Tensor") -> "Tensor":
  """A realized Kronecker transform matrix: 'in' kron(B^T, B^T) (a^2, a^2), 'w' kron(G, G) (a^2, 9),
  'out' kron(A^T, A^T) (m^2, a^2), in the dtype and on the device of `like` (made once per process)."""
  key = (which, m, like.dtype, like.device)
  if (t := _coef_cache.get(key)) is None:
    bt, g, at = MATRICES[m]
    mat = {"in": np.kron(bt, bt), "w": np.kron(g, g), "out": np.kron(at, at)}[which]
    t = _coef_cache[key] = type(like)(mat.astype(np.float64 if like.dtype == dtypes.float64 else np.float32), device=like.device).realize()
  return t

U_BLOCK = 32  # output channels per contiguous block of U (weight_transform's layout)

def u_block(cout: int) -> int:
  """Output channels per block of U, which is stored (a^2, cout / B, cin, B): the batched matmul's panel of B
  columns over all cin is then one contiguous run the prefetcher streams, not cin rows a whole cout apart. The
  matmuls of ResNet-50's shapes, interleaved in one process with caches flushed (as in a model, where U comes from
  memory) | warm: F(2x2) 256 ch at 14^2 1.28x | 1.07x, F(4x4) 128 at 28^2 1.20x | 1.13x, 64 at 56^2 1.09x | 1.02x
  (AVX-512); 1.05x | 1.29x, 1.23x | 1.31x, 1.0x | 0.88x (AVX2). In ResNet-50, 11 of its 13 matmuls (summed) took
  1.2-1.4x less time in sequence (3 runs each way, alternating). Where 32 doesn't divide cout, 16; else cout (one
  block: the plain layout)."""
  return next((b for b in (U_BLOCK, U_BLOCK // 2) if cout % b == 0), cout)

def weight_transform(weight: "Tensor", m: int) -> "Tensor":
  """U[e, co // B, c, co % B] = (G g[co, c] G^T)[e] for a (cout, cin, 3, 3) weight: (a^2, cout / B, cin, B) with
  B = u_block(cout), one reduce over the 9 taps. A function of the weight alone (ONNX models compute it once, at load)."""
  cout, cin = weight.shape[0], weight.shape[1]
  kw = _coef("w", m, weight)  # (a^2, 9)
  e, blk = kw.shape[0], u_block(cout)
  return (weight.reshape(1, cout // blk, blk, cin, 9).permute(0, 1, 3, 2, 4) * kw.reshape(e, 1, 1, 1, 9)).sum(-1)

def winograd_conv2d(x: "Tensor", weight: "Tensor", bias: Optional["Tensor"], padding: tuple[int, int], m: int) -> "Tensor":
  """x.conv2d(weight, bias, padding=padding) (stride 1, 3x3) by Winograd F(m x m, 3 x 3): see the module
  docstring for the math and the contract. padding is (pad_h, pad_w), the same on both sides."""
  return winograd_apply(x, weight_transform(weight, m), bias, padding, m)

def winograd_apply(x: "Tensor", u: "Tensor", bias: Optional["Tensor"], padding: tuple[int, int], m: int) -> "Tensor":
  """winograd_conv2d with the weights already transformed: u = weight_transform(weight, m), (a^2, cout / B, cin, B)."""
  a = m + 2
  n, cin, h, w = x.shape
  nblk, blk = u.shape[1], u.shape[3]
  cout = nblk * blk
  oh, ow = h + 2 * padding[0] - 2, w + 2 * padding[1] - 2
  if oh <= 0 or ow <= 0: raise ValueError(f"conv2d: 3x3 window larger than the padded input {h}x{w} + {padding}")
  ty, tx = -(-oh // m), -(-ow // m)
  # input tiles: (a x a) windows every m pixels of the input, padded to whole tiles
  xp = x.pad(((0, 0), (0, 0), (padding[0], ty * m + 2 - h - padding[0]), (padding[1], tx * m + 2 - w - padding[1])))
  win = xp._pool((a, a), (m, m), (1, 1)).permute(0, 2, 3, 1, 4, 5).reshape(1, n * ty * tx, cin, a * a)  # (1, t, c, k)
  v = (win * _coef("in", m, x).reshape(a * a, 1, 1, a * a)).sum(-1)  # V (e, t, c)
  mm = (v.reshape(a * a, -1, 1, cin, 1) * u.reshape(a * a, 1, nblk, cin, blk)).sum(3).reshape(a * a, -1, cout)  # M (e, t, co)
  # output transform: Y[n, ty, p, tx, q, co] = sum_e kron(A^T, A^T)[(p, q), e] M[e, (n, ty, tx), co], channels
  # contiguous (vector loads of M); the NCHW view of it is read by a kernel of its own, with the epilogue
  mv = mm.reshape(a * a, n, ty, tx, cout).permute(1, 2, 3, 4, 0).reshape(n, ty, 1, tx, 1, cout, a * a)
  y = (mv * _coef("out", m, x).reshape(1, 1, m, 1, m, 1, a * a)).sum(-1).reshape(n, ty * m, tx * m, cout)
  y = y[:, :oh, :ow].permute(0, 3, 1, 2)
  return y + bias.reshape(1, cout, 1, 1) if bias is not None else y
