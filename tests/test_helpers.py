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

def test_getenv_sees_every_change_of_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
  """Values are read from os.environ's own mapping and their parses memoized: a change is still seen at once."""
  monkeypatch.delenv("TC_TEST_FLAG", raising=False)
  assert getenv("TC_TEST_FLAG", 7) == 7
  for raw, want in (("3", 3), ("4", 4), ("3", 3)):
    monkeypatch.setenv("TC_TEST_FLAG", raw)
    assert getenv("TC_TEST_FLAG", 0) == want
  assert getenv("TC_TEST_FLAG", "") == "3" and getenv("TC_TEST_FLAG", 0.0) == 3.0 and getenv("TC_TEST_FLAG", False) is True
  with Context(TC_TEST_FLAG=9): assert getenv("TC_TEST_FLAG", 0) == 9
  assert getenv("TC_TEST_FLAG", 0) == 3
  monkeypatch.setenv("TC_TEST_FLAG", "x")
  for _ in range(2):  # a bad value fails every time (failures are not memoized)
    with pytest.raises(SettingError, match="TC_TEST_FLAG='x'"): getenv("TC_TEST_FLAG", 0)
  monkeypatch.delenv("TC_TEST_FLAG")
  assert getenv("TC_TEST_FLAG", 5) == 5

def test_realize_follows_settings_changed_between_calls(monkeypatch: pytest.MonkeyPatch) -> None:
  """The opts settings are read on every realize: env and Context changes pick other runners at once."""
  import numpy as np
  from tilecraft import Tensor
  from tilecraft.engine.realize import get_runner
  x = Tensor(np.arange(64 * 64, dtype=np.float32).reshape(64, 64)).realize()
  def opts() -> tuple:
    out = x.sum(1)
    (si,) = out.schedule()
    out.realize()
    return get_runner(si.ast, si.bufs[0].device).p.applied_opts
  monkeypatch.delenv("NOOPT", raising=False)
  hand = opts()
  assert hand
  monkeypatch.setenv("NOOPT", "1")
  assert opts() == ()
  monkeypatch.setenv("NOOPT", "0")
  assert opts() == hand
  with Context(NOOPT=1): assert opts() == ()
  assert opts() == hand
