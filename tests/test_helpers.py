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

# ---- Context is per thread (issue 28, item 9) -------------------------------------------------------

def _in_threads(*fns) -> None:
  """Run each fn in its own thread; re-raise the first exception one of them raised."""
  import threading
  errors: list[BaseException] = []
  def wrap(fn):
    def run():
      try: fn()
      except BaseException as e: errors.append(e)  # noqa: BLE001
    return run
  ts = [threading.Thread(target=wrap(fn)) for fn in fns]
  for t in ts: t.start()
  for t in ts: t.join(60)
  assert not any(t.is_alive() for t in ts), "a thread hung"
  if errors: raise errors[0]

def test_context_in_one_thread_does_not_move_another_threads_tensors() -> None:
  import threading
  from tilecraft import Device, Tensor
  default = Device.DEFAULT
  entered, checked = threading.Event(), threading.Event()
  def a():
    with Context(DEVICE="LLVM"):
      entered.set()
      assert Device.DEFAULT == "LLVM" and Tensor([1.0]).device == "LLVM"
      assert checked.wait(30)
  def b():
    assert entered.wait(30)
    try: assert Device.DEFAULT == default and Tensor([1.0]).device == default and getenv("DEVICE", "") != "LLVM"
    finally: checked.set()
  _in_threads(a, b)

def test_overlapping_contexts_in_two_threads_keep_their_own_values() -> None:
  """A enters X=1, B enters X=2, A leaves (B still sees 2), B leaves: each sees only its own."""
  import threading
  steps = [threading.Event() for _ in range(4)]
  def a():
    with Context(TC_THREAD_X=1):
      steps[0].set()
      assert steps[1].wait(30)
      assert getenv("TC_THREAD_X", 0) == 1
    assert getenv("TC_THREAD_X", 0) == 0
    steps[2].set()
    assert steps[3].wait(30)
    assert getenv("TC_THREAD_X", 0) == 0
  def b():
    assert steps[0].wait(30)
    with Context(TC_THREAD_X=2):
      steps[1].set()
      assert steps[2].wait(30)
      assert getenv("TC_THREAD_X", 0) == 2
      with Context(TC_THREAD_X=3): assert getenv("TC_THREAD_X", 0) == 3
      assert getenv("TC_THREAD_X", 0) == 2
    assert getenv("TC_THREAD_X", 0) == 0
    steps[3].set()
  _in_threads(a, b)
  assert getenv("TC_THREAD_X", 0) == 0

def test_one_context_object_entered_by_two_threads() -> None:
  """A Context used as a decorator is one object entered by every call, in any thread."""
  import threading
  inside = threading.Barrier(2, timeout=30)
  @Context(TC_THREAD_Y=5)
  def f(own: int) -> None:
    with Context(TC_THREAD_Z=own):
      inside.wait()
      assert getenv("TC_THREAD_Y", 0) == 5 and getenv("TC_THREAD_Z", 0) == own
      inside.wait()
    assert getenv("TC_THREAD_Z", 0) == 0
  _in_threads(lambda: f(1), lambda: f(2))
  assert getenv("TC_THREAD_Y", 0) == 0

def test_settings_memo_is_right_per_thread() -> None:
  """Two threads under different Contexts, calling one memo in turn, each get their own value."""
  import threading
  from tilecraft.helpers import settings_memo
  @settings_memo
  def value(k: int) -> tuple:
    return (k, getenv("TC_THREAD_MEMO", 0))
  turn = [threading.Semaphore(1), threading.Semaphore(0)]
  def worker(me: int) -> None:
    with Context(TC_THREAD_MEMO=10 + me):
      for _ in range(20):
        assert turn[me].acquire(timeout=30)
        try: assert value(1) == (1, 10 + me)
        finally: turn[1 - me].release()
    assert value(1) == (1, 0)
  _in_threads(lambda: worker(0), lambda: worker(1))
  assert value(1) == (1, 0)
