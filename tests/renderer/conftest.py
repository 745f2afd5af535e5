"""The GPU compile checks' compilers: a test that takes `cuda_compiler_ok` / `hip_clang_ok` needs
NVRTC or nvcc / a clang with the amdgcn target. Where one is missing the test skips, but in CI, which
installs both (`.ci/run`: NVRTC from the gpucheck extra, clang-15 from apt), it fails
(tests/conftest.py: require_or_skip, CI_INSTALLS)."""
import pytest

@pytest.fixture
def cuda_compiler_ok(require_or_skip) -> None:
  from tilecraft.runtime.cuda import cuda_compiler_missing
  if (why := cuda_compiler_missing()) is not None: require_or_skip("nvrtc", why)

@pytest.fixture
def hip_clang_ok(require_or_skip) -> None:
  from tilecraft.runtime.hip import find_hip_clang
  if find_hip_clang() is None: require_or_skip("clang-15", "no clang with the amdgcn target (clang-15) was found")
