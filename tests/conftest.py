"""Shared test setup: a deterministic RNG per test, the hypothesis profiles, and devices.

Devices: a test that takes a `device` parameter (the `device` fixture here runs it on CPU and
OPENCL, and on the GPU devices named in env TEST_GPU: op_checks.gpu_test_devices) or carries
`@pytest.mark.opencl` needs that device. A GPU device that can only render and compile here (no GPU)
is missing. Where it can't be opened the test is
skipped, with the reason -- on a developer's machine. In CI (env CI=true, which `.ci/run` sets) a
device or tool that CI installs (CI_INSTALLS) must work: the test FAILS instead, so a broken PoCL
or compiler can't turn hundreds of tests into green skips.

Other tools (a GPU compiler, ...): call `require_or_skip(name, reason)` -- the fixture of that name
hands you the function -- when the tool is missing; add `name` to CI_INSTALLS once `.ci/run`
installs it, e.g.

    def test_hip_source_compiles(require_or_skip):
      if shutil.which("clang-15") is None: require_or_skip("clang-15", "clang-15 is not installed")

Hypothesis: the "default" profile (50 examples), "slow" with `-m slow`; in CI the "-ci" variant of
either, derandomized (the same examples every run). HYPOTHESIS_PROFILE overrides."""
import functools, os, zlib
from typing import Optional
import numpy as np
import pytest
from op_checks import gpu_test_devices

def in_ci() -> bool:
  """Whether this run is CI's (env CI=true/1/yes, as CI services and `.ci/run` set it)."""
  return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")

# What `.ci/run` installs on CI's machine: missing there is a failure, not a skip. (apt: PoCL for OPENCL,
# clang-15 for the HIP compile checks; pip extras: pytest-timeout, NVRTC ("nvrtc") for the CUDA ones, ray.
# nvcc is not installed there: a test needing nvcc itself skips in CI too.)
CI_INSTALLS = frozenset({"CPU", "OPENCL", "clang-15", "nvrtc", "pytest-timeout", "ray"})

def require_or_skip(name: str, reason: str) -> None:
  """`name` (a device or tool) is missing because of `reason`: skip the test, or in CI, where
  `name` is one of CI_INSTALLS, fail it."""
  if in_ci() and name in CI_INSTALLS: pytest.fail(f"{name} is required in CI (.ci/run installs it) but is not usable: {reason}", pytrace=False)
  pytest.skip(f"{name} can't be used here ({reason})")

@pytest.fixture(name="require_or_skip", scope="session")
def _require_or_skip_fixture():
  """The require_or_skip function, for tests (conftest isn't importable under --import-mode=importlib)."""
  return require_or_skip

try:
  from hypothesis import HealthCheck, settings
  # compiling kernels is slow and its time varies, so no deadlines and no too_slow health check
  for _ci in (False, True):
    settings.register_profile("default" + "-ci" * _ci, max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=_ci)
    settings.register_profile("slow" + "-ci" * _ci, max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=_ci)
except ImportError:  # hypothesis is optional outside the test extras
  settings = None

def hypothesis_profile(markexpr: str) -> str:
  """The profile for a run selecting `markexpr` (see the module docstring)."""
  if (name := os.environ.get("HYPOTHESIS_PROFILE")): return name
  wants_slow = "slow" in markexpr and "not slow" not in markexpr
  return ("slow" if wants_slow else "default") + ("-ci" if in_ci() else "")

def pytest_configure(config: pytest.Config) -> None:
  if settings is None: return
  settings.load_profile(hypothesis_profile(config.getoption("markexpr", "") or ""))

def _seed(request: pytest.FixtureRequest) -> int: return zlib.crc32(request.node.nodeid.encode())

@pytest.fixture(autouse=True)
def _seed_legacy_numpy(request: pytest.FixtureRequest) -> None:
  """Tests that use np.random.* directly are reproducible too (seeded from the test's id)."""
  np.random.seed(_seed(request))

@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
  """A numpy Generator seeded from the test's id: the same per test, independent of order and workers."""
  return np.random.default_rng(_seed(request))

# ---- devices ---------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def device_missing(dev: str) -> Optional[str]:
  """Why `dev` can't be opened (or can't run kernels) here, or None when it can."""
  from tilecraft.device import Device
  try: d = Device[dev]
  except Exception as e: return f"{type(e).__name__}: {e}"  # noqa: BLE001
  return None if getattr(d, "render_only", None) is None else f"render + compile-check only: {d.render_only}"

def pytest_runtest_setup(item: pytest.Item) -> None:
  params = getattr(getattr(item, "callspec", None), "params", {})
  devs = [params["device"]] if isinstance(params.get("device"), str) else []
  if item.get_closest_marker("opencl") is not None: devs.append("OPENCL")
  for dev in devs:
    if (why := device_missing(dev)) is not None: require_or_skip(dev, f"{dev} can't be opened: {why}")

@pytest.fixture(params=["CPU", "OPENCL", *gpu_test_devices()])
def device(request: pytest.FixtureRequest) -> str:
  """Both devices (and TEST_GPU's), for tests whose every case runs on each."""
  return request.param
