"""Shared test setup: a deterministic RNG per test, the hypothesis profiles, and devices.

Devices: a test that takes a `device` parameter (the `device` fixture here runs it on CPU and
OPENCL) or carries `@pytest.mark.opencl` is skipped, with the reason, where that device can't be
opened (no PoCL/pyopencl here); it never fails for that."""
import functools, os, zlib
from typing import Optional
import numpy as np
import pytest

try:
  from hypothesis import HealthCheck, settings
  # compiling kernels is slow and its time varies, so no deadlines and no too_slow health check
  settings.register_profile("default", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
  settings.register_profile("slow", max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
except ImportError:  # hypothesis is optional outside the test extras
  settings = None

def pytest_configure(config: pytest.Config) -> None:
  if settings is None: return
  markexpr = config.getoption("markexpr", "") or ""
  wants_slow = "slow" in markexpr and "not slow" not in markexpr
  settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("slow" if wants_slow else "default"))

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
  """Why `dev` can't be opened here, or None when it can."""
  from tilecraft.device import Device
  try: Device[dev]
  except Exception as e: return f"{type(e).__name__}: {e}"  # noqa: BLE001
  return None

def pytest_runtest_setup(item: pytest.Item) -> None:
  params = getattr(getattr(item, "callspec", None), "params", {})
  devs = [params["device"]] if isinstance(params.get("device"), str) else []
  if item.get_closest_marker("opencl") is not None: devs.append("OPENCL")
  for dev in devs:
    if (why := device_missing(dev)) is not None: pytest.skip(f"{dev} can't be opened here ({why})")

@pytest.fixture(params=["CPU", "OPENCL"])
def device(request: pytest.FixtureRequest) -> str:
  """Both devices, for tests whose every case runs on both."""
  return request.param
