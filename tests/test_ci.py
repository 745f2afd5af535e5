"""The test setup's CI rules (tests/conftest.py): in CI a device or tool that CI installs must work
(missing = failed test, not a skip), hypothesis is derandomized, tests have a time limit."""
from pathlib import Path
from types import SimpleNamespace
import pytest

@pytest.fixture
def conftest(request: pytest.FixtureRequest):
  """The conftest module pytest loaded (not importable by name under --import-mode=importlib)."""
  want = Path(__file__).with_name("conftest.py").resolve()
  return next(p for p in request.config.pluginmanager.get_plugins() if getattr(p, "__file__", None) and Path(p.__file__).resolve() == want)

@pytest.mark.parametrize("ci", ["", "false", "0"])
def test_missing_tool_skips_on_a_developers_machine(conftest, monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
  monkeypatch.setenv("CI", ci)
  with pytest.raises(pytest.skip.Exception, match="OPENCL can't be used here"): conftest.require_or_skip("OPENCL", "no platform")

@pytest.mark.parametrize("ci", ["true", "1", "TRUE"])
def test_missing_tool_fails_in_ci(conftest, monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
  monkeypatch.setenv("CI", ci)
  for name in ("OPENCL", "clang-15", "nvrtc"):
    with pytest.raises(pytest.fail.Exception, match=f"{name} is required in CI"): conftest.require_or_skip(name, "broken")
  with pytest.raises(pytest.skip.Exception): conftest.require_or_skip("nvcc", "CI doesn't install it")  # not in CI_INSTALLS: still a skip

def test_device_tests_fail_in_ci_when_the_device_wont_open(conftest, monkeypatch: pytest.MonkeyPatch) -> None:
  """The rule every `device`-parametrized and @opencl test goes through (pytest_runtest_setup)."""
  monkeypatch.setattr(conftest, "device_missing", lambda dev: "RuntimeError: clGetPlatformIDs failed" if dev == "OPENCL" else None)
  item = SimpleNamespace(callspec=SimpleNamespace(params={"device": "OPENCL"}), get_closest_marker=lambda name: None)
  monkeypatch.setenv("CI", "true")
  with pytest.raises(pytest.fail.Exception, match="OPENCL is required in CI.*clGetPlatformIDs"): conftest.pytest_runtest_setup(item)
  monkeypatch.delenv("CI")
  with pytest.raises(pytest.skip.Exception): conftest.pytest_runtest_setup(item)
  item.callspec.params["device"] = "CPU"
  conftest.pytest_runtest_setup(item)  # opens: nothing raised

def test_require_or_skip_fixture(require_or_skip, conftest) -> None:
  assert require_or_skip is conftest.require_or_skip

def test_hypothesis_is_derandomized_in_ci(conftest, monkeypatch: pytest.MonkeyPatch) -> None:
  pytest.importorskip("hypothesis")
  from hypothesis import settings
  monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
  monkeypatch.setenv("CI", "true")
  assert conftest.hypothesis_profile("not slow") == "default-ci" and conftest.hypothesis_profile("slow") == "slow-ci"
  assert settings.get_profile("default-ci").derandomize and settings.get_profile("slow-ci").derandomize
  monkeypatch.delenv("CI")
  assert conftest.hypothesis_profile("not slow") == "default" and not settings.get_profile("default").derandomize
  monkeypatch.setenv("HYPOTHESIS_PROFILE", "slow")
  assert conftest.hypothesis_profile("not slow") == "slow"

def test_tests_have_a_time_limit(request: pytest.FixtureRequest, require_or_skip) -> None:
  """pytest-timeout (in the test extras) with the limit from pyproject.toml."""
  if not request.config.pluginmanager.hasplugin("timeout"): require_or_skip("pytest-timeout", "the plugin is not installed (pip install -e '.[test]')")
  assert float(request.config.getini("timeout")) >= 60

def test_ci_installs_what_ci_installs_lists(conftest) -> None:
  """Only what `.ci/run` installs may be required in CI."""
  run = (Path(__file__).parents[1] / ".ci" / "run").read_text()
  apt = next(l for l in run.splitlines() if "apt-get install" in l)
  assert "pocl-opencl-icd" in apt and "clang-15" in apt  # OPENCL, clang-15
  assert "gpucheck" in run and "test" in run  # nvrtc (the gpucheck extra), pytest-timeout (test)
  pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
  assert "nvidia-cuda-nvrtc" in next(l for l in pyproject.splitlines() if l.startswith("gpucheck"))
  assert "pytest-timeout" in next(l for l in pyproject.splitlines() if l.startswith("test ="))
  pip = next(l for l in run.splitlines() if "pip install" in l)
  assert ",ray]" in pip and "ray==" in pip  # ray (the ray extra, pinned: the tests use its 2.60 CLI)
  assert conftest.CI_INSTALLS == {"CPU", "OPENCL", "clang-15", "nvrtc", "pytest-timeout", "ray"}
