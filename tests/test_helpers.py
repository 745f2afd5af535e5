"""Settings (helpers.getenv / Context) and the cache dir."""
import pytest
from tilecraft.helpers import BEAM, Context, SettingError, cache_dir, getenv

def test_getenv_types_and_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("BEAM", "3")
  assert getenv("BEAM", 0) == 3 and BEAM >= 3
  with Context(BEAM=5): assert getenv("BEAM", 0) == 5
  monkeypatch.setenv("SOMEFLAG", "0")
  assert getenv("SOMEFLAG", False) is False

@pytest.mark.parametrize("name, val, default, kind", [("BEAM", "abc", 0, "int"), ("BEAM", "1.5", 0, "int"), ("BEAM_BUDGET", "soon", 0.0, "float")])
def test_getenv_bad_value_names_the_variable(monkeypatch: pytest.MonkeyPatch, name: str, val: str, default: object, kind: str) -> None:
  monkeypatch.setenv(name, val)
  with pytest.raises(SettingError, match=f"environment variable {name}={val!r} is not a valid {kind}"): getenv(name, default)
  assert issubclass(SettingError, ValueError)

def test_cache_dir_is_only_a_path(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("XDG_CACHE_HOME", "/proc/x")
  assert cache_dir() == "/proc/x/tilecraft"  # no makedirs here: the cache's users treat an unusable dir as no cache
