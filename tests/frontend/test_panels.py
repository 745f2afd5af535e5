"""frontend/panels.py: a constant weight stored in column panels, (N / 16, K, 16), and the matmul that reads it."""
import numpy as np
import pytest
from tilecraft import Tensor
from tilecraft.dtype import dtypes
from tilecraft.frontend.panels import PANEL, panel_eligible, panel_layout, panel_matmul

@pytest.mark.parametrize("lead", [(32,), (2, 9), (8,)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_panel_matmul_matches_numpy(lead, dtype):
  rng = np.random.default_rng(0)
  x, w = rng.standard_normal((*lead, 40)).astype(dtype), rng.standard_normal((40, 3 * PANEL)).astype(dtype)
  wp = panel_layout(w)
  assert wp.shape == (3, 40, PANEL) and wp.flags.c_contiguous and np.array_equal(wp[1, :, 5], w[:, PANEL + 5])
  got = panel_matmul(Tensor(x), Tensor(wp)).numpy()
  assert got.shape == (*lead, 3 * PANEL) and got.dtype == dtype
  np.testing.assert_allclose(got, x @ w, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-5 if dtype == np.float32 else 1e-12)

def test_panel_eligibility():
  f32 = dtypes.float32
  assert panel_eligible((32, 64), (64, 48), f32, "CPU") and panel_eligible((4, 2, 64), (64, 32), f32, "LLVM")
  assert not panel_eligible((32, 64), (64, 40), f32, "CPU")       # N not a multiple of 16
  assert not panel_eligible((32, 64), (64, 16), f32, "CPU")       # one panel: nothing to stream apart
  assert not panel_eligible((4, 64), (64, 48), f32, "CPU")        # under 8 rows: the matrix-vector rules
  assert not panel_eligible((32, 8), (8, 48), f32, "CPU")         # K under a panel
  assert not panel_eligible((32, 64), (64, 48), dtypes.float16, "CPU")
  assert not panel_eligible((32, 64), (64, 48), f32, "OPENCL")    # CPU layouts only
  assert not panel_eligible((32, 64), (2, 64, 48), f32, "CPU")    # a batched weight
