"""The image kernels of the corpus (tilecraft.testing.corpus re-exports `image_corpus`): OPENCL
images, imagef/imageh buffers of (height, width, 4) texels. An image holds its elements in row-major
(height, width, 4) order, the same flat order as a plain buffer: the layouts below are the ones the
IMAGE frontend setting uses (channels last, texels along the channel axis). Only targets with images
run these (Renderer.supports_images)."""
from __future__ import annotations
import numpy as np
from tilecraft.dtype import DType, dtypes
from tilecraft.ops import BinaryOps, ReduceOps
from tilecraft.shape.shapetracker import ShapeTracker
from tilecraft.shape.view import View
from tilecraft.testing.corpus_build import ST, CorpusEntry, Inputs, VarVals, alu, bcast, cast, const, kernel, ld, rand, red, store

_F = dtypes.float32


def _image_matmul(M: int, K: int, N: int, dt: DType = dtypes.imagef) -> CorpusEntry:  # type: ignore[assignment]
  """out[M, N] = A[M, K] @ B[K, N], all three images: A (M, K/4, 4), B (K, N/4, 4), out (M, N/4, 4)."""
  base = dtypes.half if dt is dtypes.imageh else _F
  full = (M, N, K)
  a = ld(1, dt((M, K // 4, 4)), ST((M, K)).reshape((M, 1, K)).expand(full))
  b = ld(2, dt((K, N // 4, 4)), ST((K, N)).permute((1, 0)).reshape((1, N, K)).expand(full))
  ast = kernel(store(0, dt((M, N // 4, 4)), ST((M, N, 1)), cast(red(ReduceOps.SUM, alu(BinaryOps.MUL, cast(a, _F), cast(b, _F)), (2,)), base)))
  def ref(x: Inputs, vv: VarVals) -> list[np.ndarray]: return [(x[1].astype(np.float64) @ x[2].astype(np.float64)).astype(base.np)]
  return CorpusEntry(f"image{'h' if base is dtypes.half else 'f'}_matmul_{M}x{K}x{N}", ast,
                     lambda rng: {1: rand(rng, base, (M, K), -1, 1), 2: rand(rng, base, (K, N), -1, 1)}, ref,
                     rtol=1e-2 if base is dtypes.half else None, atol=1e-2 if base is dtypes.half else None, tags=("reduce", "matmul", "image"))

def _image_conv(hw: int, cin: int, cout: int, k: int, pad: int) -> CorpusEntry:
  """A channels-last conv + bias: out[y, x, co] = b[co] + sum_{ky, kx, ci} xpad[y+ky, x+kx, ci] * w[ky, kx, ci, co].
  The input image is (hw, hw*cin/4, 4) read through a padded (masked) window, the weights image is
  (k*k*cin, cout/4, 4), the output image (o, o*cout/4, 4); the bias is a plain buffer."""
  H, o = hw + 2 * pad, hw + 2 * pad - k + 1
  xp = ST((hw, hw, cin)).pad(((pad, pad), (pad, pad), (0, 0)))  # (H, H, cin), masked border
  full = (o, o, cout, k, k, cin)
  xst = ShapeTracker(xp.views + (View.create(full, (H * cin, cin, 0, H * cin, cin, 1)),))
  wst = ShapeTracker((View.create(full, (0, 0, 1, k * cin * cout, cin * cout, cout)),))
  x = ld(1, dtypes.imagef((hw, hw * cin // 4, 4)), xst)
  w = ld(2, dtypes.imagef((k * k * cin, cout // 4, 4)), wst)
  bias = ld(3, _F, bcast((1, 1, cout, 1, 1, 1), (o, o, cout, 1, 1, 1)))
  conv = red(ReduceOps.SUM, alu(BinaryOps.MUL, x, w), (3, 4, 5))
  ast = kernel(store(0, dtypes.imagef((o, o * cout // 4, 4)), ST((o, o, cout, 1, 1, 1)), alu(BinaryOps.ADD, conv, bias)))
  def ref(xs: Inputs, vv: VarVals) -> list[np.ndarray]:
    xx = np.pad(xs[1].reshape(hw, hw, cin).astype(np.float64), ((pad, pad), (pad, pad), (0, 0)))
    ww = xs[2].reshape(k, k, cin, cout).astype(np.float64)
    out = np.zeros((o, o, cout)) + xs[3].astype(np.float64)
    for ky in range(k):
      for kx in range(k): out += np.einsum("yxi,ic->yxc", xx[ky:ky + o, kx:kx + o], ww[ky, kx])
    return [out.astype(np.float32)]
  return CorpusEntry(f"imagef_conv_{hw}x{hw}x{cin}_w{k}x{k}x{cout}_p{pad}", ast,
                     lambda rng: {1: rand(rng, _F, (hw, hw, cin), -1, 1), 2: rand(rng, _F, (k, k, cin, cout), -1, 1), 3: rand(rng, _F, cout, -1, 1)},
                     ref, tags=("reduce", "conv", "masked", "image"))

def _image_half_ew() -> CorpusEntry:
  """An imageh elementwise kernel: out = x * 3 - y (x, out imageh (4, 2, 4); y a plain float buffer, cast to half)."""
  h, shape = dtypes.half, (4, 8)
  x, y = ld(1, dtypes.imageh((4, 2, 4)), ST(shape)), cast(ld(2, _F, ST(shape)), h)
  ast = kernel(store(0, dtypes.imageh((4, 2, 4)), ST(shape), alu(BinaryOps.SUB, alu(BinaryOps.MUL, x, const(3.0, h, ST(shape).expand(shape))), y)))
  return CorpusEntry("imageh_ew_4x8", ast, lambda rng: {1: rand(rng, h, shape, -1, 1), 2: rand(rng, _F, shape, -1, 1)},
                     lambda xs, vv: [(xs[1] * np.float16(3) - xs[2].astype(np.float16)).astype(np.float16)], tags=("elementwise", "image"))

def image_corpus() -> dict[str, CorpusEntry]:
  """The image kernels, by name (for targets with images: see Renderer.supports_images)."""
  entries = [_image_matmul(8, 12, 16), _image_matmul(4, 8, 8, dtypes.imageh), _image_conv(6, 4, 8, 3, 1), _image_half_ew()]  # type: ignore[arg-type]
  return {e.name: e for e in entries}
