"""The OPENCL runtime's PoCL kernel cache: every live process has a cache directory of its own
(PoCL corrupts binaries when processes share one; runtime/opencl.py explains)."""
import os, subprocess, sys, time
import pytest

pytestmark = pytest.mark.opencl

# A process that claims its PoCL cache dir (importing the OPENCL runtime does), with `build` also
# builds and runs one kernel, prints its POCL_CACHE_DIR, then waits for a line on stdin (so several
# are alive at once) before exiting.
_CHILD = """
import os, sys
import tilecraft.runtime.opencl
if {build}:
  import numpy as np
  from tilecraft.device import Buffer, Device
  from tilecraft.dtype import dtypes
  prg = tilecraft.runtime.opencl.CLProgram("k", Device["OPENCL"].compiler.compile("__kernel void k(__global float* o) {{ o[get_global_id(0)] = 3.0f; }}"))
  out = Buffer("OPENCL", 8, dtypes.float32).allocate()
  prg(out._buf, global_size=[2], local_size=[4])
  assert (out.numpy() == 3).all()
print(os.environ.get("POCL_CACHE_DIR"), flush=True)
sys.stdin.readline()
"""

def _start(env: dict, build: bool = False) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, "-c", _CHILD.format(build=build)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env)

def _cache_dir_of(p: subprocess.Popen) -> str:
  assert p.stdout is not None
  line = p.stdout.readline().strip()
  if not line:
    p.wait(timeout=60)
    raise AssertionError(f"child failed: {p.stderr.read() if p.stderr else ''}")
  return line

def _finish(p: subprocess.Popen) -> None:
  p.communicate("\n", timeout=60)
  assert p.returncode == 0

@pytest.fixture
def env(tmp_path) -> dict:
  e = {k: v for k, v in os.environ.items() if k not in ("POCL_CACHE_DIR", "_TILECRAFT_POCL_CACHE_PID")}
  e["XDG_CACHE_HOME"] = str(tmp_path)
  e["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
  return e

def test_live_processes_never_share_a_pocl_cache_dir(env: dict, tmp_path):
  slots = tmp_path / "tilecraft" / "pocl"
  a = _start(env, build=True)
  dir_a = _cache_dir_of(a)
  assert dir_a == str(slots / "0")
  assert any((slots / "0").iterdir()), "PoCL did not use the cache directory it was given"
  # a worker process inherits its parent's environment: it must still get a directory of its own
  b = _start({**env, "POCL_CACHE_DIR": dir_a, "_TILECRAFT_POCL_CACHE_PID": str(a.pid)})
  assert _cache_dir_of(b) == str(slots / "1")
  _finish(a)
  # a slot is free again once its process is gone (and what PoCL compiled there is reused)
  c = _start(env)
  assert _cache_dir_of(c) == str(slots / "0")
  for p in (b, c): _finish(p)

def test_a_pocl_cache_dir_set_by_the_user_is_kept(env: dict, tmp_path):
  mine = str(tmp_path / "mine")
  p = _start({**env, "POCL_CACHE_DIR": mine})
  assert _cache_dir_of(p) == mine
  _finish(p)
  assert not (tmp_path / "tilecraft" / "pocl").exists()

def test_no_disk_cache_means_a_private_pocl_cache_dir(env: dict, tmp_path):
  """CACHELEVEL=0 (or an unusable cache dir): a temporary directory of the process's own, removed at exit."""
  p = _start({**env, "CACHELEVEL": "0"})
  d = _cache_dir_of(p)
  assert os.path.basename(d).startswith("pocl-") and os.path.basename(os.path.dirname(d)) == f"tilecraft-{p.pid}.d" and os.path.isdir(d)
  _finish(p)
  assert not os.path.exists(d)

_STRESS = """
import sys, time, numpy as np
from tilecraft.device import Buffer, Device
from tilecraft.dtype import dtypes
from tilecraft.runtime.opencl import CLProgram
tag, start = sys.argv[1], float(sys.argv[2])
out = Buffer("OPENCL", 256, dtypes.float32).allocate()
while time.time() < start: time.sleep(0.001)
for i in range(8):
  name = f"k_{tag}_{i}"
  lib = Device["OPENCL"].compiler.compile(f"__kernel void {name}(__global float* o) {{ o[get_global_id(0)] = {i}.0f; }}")
  for ls in (1, 4, 16, 32):
    CLProgram(name, lib)(out._buf, global_size=[256 // ls], local_size=[ls])
    assert (out.numpy() == i).all()
"""

@pytest.mark.slow
def test_concurrent_processes_building_the_same_programs(env: dict):
  """The race itself: 6 processes build, serialize, load and run the same sources at the same moment.
  With one shared PoCL cache dir (the old behaviour: POCL_CACHE_DIR set for all) about half of such
  runs lost a process to a PoCL assertion; with a directory per process none may."""
  tag, start = f"t{os.getpid()}", time.time() + 5
  ps = [subprocess.Popen([sys.executable, "-c", _STRESS, tag, str(start)], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True) for _ in range(6)]
  errs = [(p.wait(timeout=600), p.stderr.read() if p.stderr else "") for p in ps]
  bad = [f"rc={rc}: {err.strip().splitlines()[-1:]}" for rc, err in errs if rc != 0]
  assert not bad, bad
