"""The C renderer's vector max (CRenderer._max_helper): NaN-propagating like numpy on every vector width and ISA,
the ISA's max instruction where the vector is one x86 register, the portable blend elsewhere."""
import numpy as np
import pytest
from tilecraft import Context, Tensor
from tilecraft.codegen.kernel import Kernel
from tilecraft.device import Device
from tilecraft.host import cpu_target, missing_features

ARCHS = ["native", "haswell", "x86-64-v2", "x86-64"]

def _runnable() -> bool: return not missing_features(cpu_target())

@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_vector_max_propagates_nan_like_numpy(arch, dt):
  rng = np.random.default_rng(3)
  a, b = rng.standard_normal((33, 48)).astype(dt), rng.standard_normal((33, 48)).astype(dt)
  a[rng.random(a.shape) < 0.05], b[rng.random(b.shape) < 0.05] = np.nan, np.nan
  a[0, :4], b[0, :4] = [0.0, -0.0, np.inf, np.nan], [-0.0, 0.0, -np.inf, np.nan]
  x = rng.standard_normal((1, 4, 21, 21)).astype(dt)
  x[0, 2, 3, 4] = np.nan
  with Context(CPU_ARCH=arch):
    if not _runnable(): pytest.skip(f"this host can't run {arch} code")
    got, want = Tensor(a).maximum(Tensor(b)).numpy(), np.maximum(a, b)
    assert np.array_equal(got, want, equal_nan=True) and np.array_equal(np.signbit(got), np.signbit(want))
    for axis in (0, 1): assert np.array_equal(Tensor(a).max(axis=axis).numpy(), a.max(axis=axis), equal_nan=True)
    pooled = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))[:, :, ::2, ::2].max(axis=(-1, -2))
    assert np.array_equal(Tensor(x).max_pool2d(3, 2).numpy(), pooled, equal_nan=True)

@pytest.mark.parametrize("arch,lanes,intrinsic", [("skylake-avx512", 16, "_mm512_max_ps"), ("haswell", 8, "_mm256_max_ps")])
def test_vector_max_uses_the_isa_max(arch, lanes, intrinsic):
  """Built for the arch, not run: the vector max of a max-pool row is the ISA's max with a's NaN lanes blended back,
  the portable bit blend only where the ISA macro is undefined."""
  x = Tensor(np.zeros((1, 8, 109, 109), np.float32))
  with Context(CPU_ARCH=arch):
    (si,) = [s for s in x.max_pool2d(3, 2).schedule() if s.ast.op.name == "KERNEL"]
    src = Kernel(si.ast, Device["CPU"].renderer).hand_coded_optimizations().to_program().src
  assert f"float{lanes} tc_max_float{lanes}" in src and intrinsic in src and "_CMP_UNORD_Q" in src, src
