"""frontend/pointwise_layout.py: a constant 1x1 conv weight stored in panels of output channels, (Cout / 64, Cin, 64),
and the conv that reads it."""
import numpy as np
import pytest
from tilecraft import Context, Tensor
from tilecraft.dtype import dtypes
from tilecraft.frontend.pointwise_layout import PANEL, pointwise_conv, pointwise_eligible, pointwise_layout

@pytest.mark.parametrize("n,hw,stride", [(1, 7, 1), (2, 9, 1), (1, 14, 2), (1, 13, 2)])
def test_pointwise_conv_matches_numpy(n, hw, stride):
  rng = np.random.default_rng(0)
  x, w = rng.standard_normal((n, 24, hw, hw), dtype=np.float32), rng.standard_normal((2 * PANEL, 24, 1, 1), dtype=np.float32)
  wp = pointwise_layout(w)
  assert wp.shape == (2, 24, PANEL) and wp.flags.c_contiguous and np.array_equal(wp[1, :, 5], w[PANEL + 5, :, 0, 0])
  got = pointwise_conv(Tensor(x), Tensor(wp), (stride, stride)).numpy()
  ref = np.einsum("nchw,oc->nohw", x[:, :, ::stride, ::stride].astype(np.float64), w[:, :, 0, 0])
  assert got.shape == ref.shape
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)

def test_pointwise_eligibility():
  f32 = dtypes.float32
  with Context(CPU_ARCH="skylake-avx512"):
    assert pointwise_eligible((1, 512, 7, 7), (2048, 512, 1, 1), (1, 1), 1, f32, "CPU")
    assert pointwise_eligible((1, 1024, 14, 14), (256, 1024, 1, 1), (1, 1), 1, f32, "LLVM")
    assert pointwise_eligible((1, 1024, 14, 14), (2048, 1024, 1, 1), (2, 2), 1, f32, "CPU")   # 7x7 out
    assert not pointwise_eligible((1, 256, 14, 14), (1024, 256, 1, 1), (1, 1), 1, f32, "CPU")  # under 512 input channels
    assert pointwise_eligible((1, 160, 7, 7), (960, 160, 1, 1), (1, 1), 1, f32, "CPU")  # 49 pixels: from 64 channels
    assert pointwise_eligible((1, 64, 14, 14), (256, 64, 1, 1), (2, 2), 1, f32, "CPU")
    assert not pointwise_eligible((1, 32, 7, 7), (192, 32, 1, 1), (1, 1), 1, f32, "CPU")
    assert not pointwise_eligible((1, 160, 14, 14), (960, 160, 1, 1), (1, 1), 1, f32, "CPU")  # 196 pixels: vectors pad them little
    assert not pointwise_eligible((1, 512, 28, 28), (128, 512, 1, 1), (1, 1), 1, f32, "CPU")   # 784 pixels: whole vectors
    assert not pointwise_eligible((1, 512, 13, 13), (1024, 512, 1, 1), (1, 1), 1, f32, "CPU")  # 169: no 7-pixel rows
    assert not pointwise_eligible((1, 512, 7, 7), (1000, 512, 1, 1), (1, 1), 1, f32, "CPU")   # not a multiple of a panel
    assert not pointwise_eligible((1, 512, 7, 7), (2048, 512, 3, 3), (1, 1), 1, f32, "CPU")   # a 3x3 window
    assert not pointwise_eligible((1, 512, 7, 7), (2048, 256, 1, 1), (1, 1), 2, f32, "CPU")   # groups
    assert not pointwise_eligible((1, 512, 7, 7), (2048, 512, 1, 1), (1, 1), 1, dtypes.float16, "CPU")
    assert not pointwise_eligible((1, 512, 7, 7), (2048, 512, 1, 1), (1, 1), 1, f32, "OPENCL")  # CPU layouts only
  with Context(CPU_ARCH="haswell"):  # 16 registers: no tile for it
    assert not pointwise_eligible((1, 512, 7, 7), (2048, 512, 1, 1), (1, 1), 1, f32, "CPU")
