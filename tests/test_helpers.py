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

def test_settings_memo_recomputes_when_a_setting_it_read_changes(monkeypatch: pytest.MonkeyPatch) -> None:
  """settings_memo records the settings its function reads (nested memos' too) and computes again after
  any Context enter/exit or a change of one of those variables; other variables don't matter."""
  from tilecraft.helpers import settings_memo
  calls: list[str] = []
  @settings_memo
  def inner() -> int:
    calls.append("inner")
    return getenv("TC_MEMO_B", 0)
  @settings_memo
  def outer(k: int) -> tuple:
    calls.append("outer")
    return (k, getenv("TC_MEMO_A", 0), inner())
  for v in ("TC_MEMO_A", "TC_MEMO_B"): monkeypatch.delenv(v, raising=False)
  assert inner() == 0 and calls == ["inner"]  # inner is cached before outer first reads it
  assert outer(1) == (1, 0, 0) and outer(1) == (1, 0, 0) and calls == ["inner", "outer"]
  monkeypatch.setenv("TC_UNRELATED", "1")
  assert outer(1) == (1, 0, 0) and len(calls) == 2
  monkeypatch.setenv("TC_MEMO_B", "5")  # read by inner only, but outer depends on it through inner's cached value
  assert outer(1) == (1, 0, 5) and calls[2:] == ["outer", "inner"]
  assert outer(2) == (2, 0, 5) and calls[4:] == ["outer"]  # arguments are part of the key
  monkeypatch.setenv("TC_MEMO_A", "3")
  assert outer(1) == (1, 3, 5)
  with Context(TC_MEMO_A=7): assert outer(1) == (1, 7, 5)
  assert outer(1) == (1, 3, 5)
  with Context(SOMETHING_ELSE=1): assert outer(1) == (1, 3, 5)  # (computed again: any Context change counts)
  monkeypatch.setenv("TC_MEMO_A", "x")
  for _ in range(2):
    with pytest.raises(SettingError): outer(1)  # failures are not cached
  monkeypatch.delenv("TC_MEMO_A")
  assert outer(1) == (1, 0, 5)
