"""Temp files don't outlive their process (issue 28): the compiler's output and the copies dlopen maps
go to the process's own tilecraft-<pid>.d in the temp dir, removed at exit; one a killed process left
(kill -9 of a search's parent) is removed by the next process, as are stale bare tilecraft-*.so files."""
from __future__ import annotations
import os, subprocess, sys, time
import pytest

RUN_A_KERNEL = ("import numpy as np; from tilecraft import Tensor; "
                "assert (Tensor(np.arange(37, dtype=np.float32)) * 3 + 0.25).numpy()[5] == 15.25; ")

def _python(code: str, tmp: str) -> subprocess.CompletedProcess:
  env = {**os.environ, "TMPDIR": tmp}
  return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)

def test_a_killed_process_leaves_nothing_for_long(tmp_path) -> None:
  tmp = str(tmp_path)
  # a process killed with -9 while its own dir holds a kernel library (as if mid-compile)
  killed = _python(RUN_A_KERNEL + "import os, signal; from tilecraft.runtime.cpu import own_temp_dir; d = own_temp_dir(); "
                   "open(os.path.join(d, 'cc-partial.so'), 'wb').write(b'x'); print(d, flush=True); os.kill(os.getpid(), signal.SIGKILL)", tmp)
  assert killed.returncode == -9, killed.stderr
  dead_dir = killed.stdout.strip()
  assert os.path.isdir(dead_dir) and os.path.dirname(dead_dir) == tmp
  # bare files of versions before: an old one (from a dead process) and a fresh one (maybe someone's, in use)
  old, fresh = tmp_path / "tilecraft-abcd1234.so", tmp_path / "tilecraft-efgh5678.so"
  old.write_bytes(b"x")
  fresh.write_bytes(b"x")
  os.utime(old, (time.time() - 7200, time.time() - 7200))
  # the next process cleans up, and leaves nothing of its own behind
  nxt = _python(RUN_A_KERNEL + "from tilecraft.runtime.cpu import own_temp_dir; print(own_temp_dir())", tmp)
  assert nxt.returncode == 0, nxt.stderr
  assert not os.path.exists(dead_dir), "the killed process's dir is still there"
  assert not old.exists() and fresh.exists()
  assert not os.path.exists(nxt.stdout.strip()), "a process's own dir outlived it"
  assert [p.name for p in tmp_path.iterdir() if p.name.startswith("tilecraft-")] == [fresh.name]

def test_the_sweep_spares_live_processes(tmp_path) -> None:
  from tilecraft.runtime import cpu
  live = tmp_path / f"tilecraft-{os.getppid()}.d"  # (our parent: alive)
  live.mkdir()
  other = tmp_path / "tilecraft-notapid.d"
  other.mkdir()
  cpu._sweep_dead(str(tmp_path))
  assert live.is_dir() and other.is_dir()
  own = cpu.own_temp_dir(str(tmp_path))
  assert os.path.basename(own) == f"tilecraft-{os.getpid()}.d" and os.path.isdir(own)

def test_the_compilers_own_temp_files_go_to_the_process_dir(monkeypatch) -> None:
  """gcc writes its intermediate files to TMPDIR; a compiler killed with its process (ccXXXX.s was
  left in /tmp) leaves them in the process's own dir, which the next process removes."""
  from tilecraft.runtime import cpu
  seen = []
  real = cpu.run_compiler
  def spy(args, input=None, timeout=None, env=None):
    seen.append(env and env.get("TMPDIR"))
    return real(args, input=input, timeout=timeout, env=env)
  monkeypatch.setattr(cpu, "run_compiler", spy)
  cpu.CPUCompiler().compile("void k(float* restrict a) { a[0] = 1.0f; }\n")
  assert seen and all(t == cpu.own_temp_dir() for t in seen)
