"""The IMAGE setting (frontend/image.py): conv2d and matmul operands read through OpenCL images."""
import numpy as np
import pytest
from tilecraft import Tensor
from tilecraft.dtype import ImageDType
from tilecraft.helpers import Context
from tilecraft.ops import BufferOps

def image_bufs(t: Tensor) -> list:
  """(kernel, buffer idx, image dtype) of every image access in t's schedule."""
  return [(i, x.arg.idx, x.arg.dtype) for i, si in enumerate(t.schedule()) for x in si.ast.lazyops
          if x.op in (BufferOps.LOAD, BufferOps.STORE) and isinstance(x.arg.dtype, ImageDType)]

def conv_ref(x, w, b, pad):
  n, cin, h, ww = x.shape
  cout, _, kh, kw = w.shape
  xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
  oh, ow = h + 2 * pad - kh + 1, ww + 2 * pad - kw + 1
  out = np.zeros((n, cout, oh, ow)) + b.reshape(1, cout, 1, 1)
  for ky in range(kh):
    for kx in range(kw): out += np.einsum("nihw,oi->nohw", xp[:, :, ky:ky + oh, kx:kx + ow], w[:, :, ky, kx])
  return out

@pytest.mark.opencl
def test_image_conv2d_and_matmul_match_numpy(rng):
  """IMAGE=2: weights and inputs in images (copied in by small kernels), results as numpy's."""
  x, w, b = rng.standard_normal((1, 4, 6, 6)).astype(np.float32), rng.standard_normal((8, 4, 3, 3)).astype(np.float32), rng.standard_normal(8).astype(np.float32)
  a, m = rng.standard_normal((5, 8)).astype(np.float32), rng.standard_normal((8, 12)).astype(np.float32)
  with Context(IMAGE=2):
    out = Tensor(x, device="OPENCL").conv2d(Tensor(w, device="OPENCL"), Tensor(b, device="OPENCL"), padding=1)
    imgs = {d.shape for _, _, d in image_bufs(out)}
    assert imgs == {(36, 2, 4), (6, 6, 4)}, imgs  # weights (kh*kw*cin, cout/4, 4), input (n*h, w*cin/4, 4)
    np.testing.assert_allclose(out.numpy(), conv_ref(x, w, b, 1), rtol=1e-4, atol=1e-4)
    mm = Tensor(a, device="OPENCL") @ Tensor(m, device="OPENCL")
    assert {d.shape for _, _, d in image_bufs(mm)} == {(8, 3, 4), (5, 2, 4)}
    np.testing.assert_allclose(mm.numpy(), a.astype(np.float64) @ m, rtol=1e-4, atol=1e-4)

@pytest.mark.opencl
def test_image_level_1_is_weights_only(rng):
  x, w = Tensor(rng.standard_normal((1, 4, 6, 6)).astype(np.float32), device="OPENCL"), Tensor(rng.standard_normal((8, 4, 3, 3)).astype(np.float32), device="OPENCL")
  with Context(IMAGE=1):
    assert {d.shape for _, _, d in image_bufs(x.conv2d(w))} == {(36, 2, 4)}
    assert {d.shape for _, _, d in image_bufs(x.reshape(24, 6)[:, :4] @ w.reshape(8, 36)[:4, :8])} == {(4, 2, 4)}
  assert not image_bufs(x.conv2d(w))  # IMAGE=0: none

@pytest.mark.opencl
def test_unsuitable_operands_stay_plain(rng):
  """cout not a multiple of 4, odd N, grouped convs and a CPU tensor: no images, same results."""
  x, w = rng.standard_normal((1, 2, 5, 5)).astype(np.float32), rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
  with Context(IMAGE=2):
    out = Tensor(x, device="OPENCL").conv2d(Tensor(w, device="OPENCL"))
    assert not image_bufs(out)
    np.testing.assert_allclose(out.numpy(), conv_ref(x, w, np.zeros(6), 0), rtol=1e-4, atol=1e-4)
    a, m = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal((5, 7)).astype(np.float32)
    assert not image_bufs(Tensor(a, device="OPENCL") @ Tensor(m, device="OPENCL"))
    cpu = Tensor(a) @ Tensor(rng.standard_normal((5, 8)).astype(np.float32))
    assert not image_bufs(cpu)
