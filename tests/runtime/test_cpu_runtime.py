"""The CPU runtime end to end: hand-written C kernels compiled by the system compiler, run on Buffers."""
import os
import numpy as np
import pytest
from tilecraft.device import Buffer, CompileError, CompiledRunner, Device
from tilecraft.dtype import dtypes
from tilecraft.renderer import Program
from tilecraft.runtime.cpu import CPUCompiler, CPUProgram

VADD = """void vadd(float* restrict data0, const float* restrict data1, const float* restrict data2, long long n) {
#pragma omp parallel for
  for (long long i = 0; i < n; i++) data0[i] = data1[i] + data2[i];
}
"""

SCALE = """void scale(double* restrict data0, const double* restrict data1) {
#pragma omp parallel for
  for (int i = 0; i < 100; i++) data0[i] = data1[i] * 2.5;
}
"""

TID = """int omp_get_thread_num(void);
void tid(int* restrict data0, long long n) {
#pragma omp parallel for schedule(static)
  for (long long i = 0; i < n; i++) data0[i] = omp_get_thread_num();
}
"""

@pytest.fixture
def cache_home(tmp_path, monkeypatch):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  return tmp_path / "tilecraft"

def fbuf(x: np.ndarray) -> Buffer: return Buffer("CPU", x.size, dtypes.from_np(x.dtype)).copyin(x)

def test_static_kernel(rng):
  runner = CompiledRunner(Program("scale", SCALE, "CPU", globals=[0, 1], outs=[0]))
  x = rng.standard_normal(100)
  out = Buffer("CPU", 100, dtypes.float64).allocate()
  t = runner([out, fbuf(x)])
  assert isinstance(t, float) and t >= 0
  np.testing.assert_allclose(out.numpy(), x * 2.5)
  assert runner([out, fbuf(x)], wait=False) is None

def test_launch_takes_buffers_as_pointers(rng):
  """CPUProgram.launch (what a plan calls): the CPUBuffers themselves, converted by ctypes; same result as a call."""
  runner = CompiledRunner(Program("scale", SCALE, "CPU", globals=[0, 1], outs=[0]))
  x = rng.standard_normal(100)
  out, inp = Buffer("CPU", 100, dtypes.float64).allocate(), fbuf(x)
  prg = runner.launcher()
  assert prg is runner.clprg
  assert prg.launch(out._buf, inp._buf) is None
  np.testing.assert_allclose(out.numpy(), x * 2.5)
  runner([out, fbuf(np.zeros(100))])  # the untyped call still works after the typed one
  np.testing.assert_array_equal(out.numpy(), np.zeros(100))
  from tilecraft.shape.symbolic import Variable
  vadd = CompiledRunner(Program("vadd", VADD, "CPU", globals=[0, 1, 2], outs=[0], vars=[Variable("n", 1, 100)]))
  with pytest.raises(ValueError, match="Variables"): vadd.launcher()

def test_symbolic_vadd(rng):
  sym = pytest.importorskip("tilecraft.shape.symbolic")
  n = sym.Variable("n", 1, 1 << 20)
  runner = CompiledRunner(Program("vadd", VADD, "cpu", global_size=[n, 1, 1], local_size=[1, 1, 1], vars=[n], globals=[0, 1, 2]))
  for size in (1, 7, 1000, 100_003):
    a, b = rng.standard_normal(size).astype(np.float32), rng.standard_normal(size).astype(np.float32)
    out = Buffer("CPU", size, dtypes.float32).allocate()
    runner([out, fbuf(a), fbuf(b)], {n: size})
    np.testing.assert_array_equal(out.numpy(), a + b)
  # a bound Variable's value, or the name, work as well
  out, a = Buffer("CPU", 5, dtypes.float32).allocate(), rng.standard_normal(5).astype(np.float32)
  runner([out, fbuf(a), fbuf(a)], {n.bind(5): 5})
  np.testing.assert_array_equal(out.numpy(), a + a)
  with pytest.raises(ValueError, match="needs a value for Variable 'n'"): runner([out, fbuf(a), fbuf(a)])
  with pytest.raises(ValueError, match="needs a value for Variable 'n'"): runner([out, fbuf(a), fbuf(a)], {sym.Variable("m", 1, 9): 3})

def test_runner_argument_errors():
  runner = CompiledRunner(Program("scale", SCALE, "CPU", globals=[0, 1], outs=[0]))
  ok = Buffer("CPU", 100, dtypes.float64).allocate()
  with pytest.raises(ValueError, match="takes 2 buffers.*got 1"): runner([ok])
  with pytest.raises(RuntimeError, match="buffer 1 .* not allocated"): runner([ok, Buffer("CPU", 100, dtypes.float64)])
  with pytest.raises(TypeError, match="argument 1 is ndarray"): runner([ok, np.zeros(100)])
  other = Buffer("CPU", 100, dtypes.float64).allocate()
  other.device = "OPENCL"  # pretend it lives elsewhere
  with pytest.raises(ValueError, match="runs on CPU, but buffer 1 is on OPENCL"): runner([ok, other])
  del other.device

def test_disk_cache_hit_skips_compiler(cache_home, monkeypatch):
  compiler = CPUCompiler()
  calls = []
  real = CPUCompiler._run
  monkeypatch.setattr(CPUCompiler, "_run", lambda self, src, openmp: (calls.append(src), real(self, src, openmp))[1])
  lib = compiler.compile_cached(SCALE)
  assert len(calls) == 1 and lib[:4] == b"\x7fELF"
  assert CPUCompiler().compile_cached(SCALE) == lib and len(calls) == 1
  assert compiler.compile_cached(SCALE + "\n") != b"" and len(calls) == 2
  # the Device's runner goes through the same cache
  monkeypatch.setattr(Device["CPU"].compiler, "compile", lambda src: pytest.fail("compiler called on a cache hit"))
  CompiledRunner(Program("scale", SCALE, "CPU"))

def test_corrupted_cache_is_recompiled(cache_home, rng):
  compiler = CPUCompiler()
  lib = compiler.compile_cached(SCALE)
  (entry,) = list((cache_home / "binaries").iterdir())
  entry.write_bytes(entry.read_bytes()[:200])  # truncated binary
  assert compiler.compile_cached(SCALE) == lib
  x = rng.standard_normal(100)
  out = Buffer("CPU", 100, dtypes.float64).allocate()
  CompiledRunner(Program("scale", SCALE, "CPU"))([out, fbuf(x)])
  np.testing.assert_allclose(out.numpy(), x * 2.5)

def test_compile_error_has_stderr_and_source():
  bad = "void broken(float* data0) {\n  data0[0] = undefined_thing;\n}\n"
  with pytest.raises(CompileError) as e: CPUCompiler().compile(bad)
  msg = str(e.value)
  assert "undefined_thing" in e.value.stderr and "error" in msg
  assert "   2 |   data0[0] = undefined_thing;" in msg

def test_openmp_fallback(monkeypatch, recwarn):
  compiler = CPUCompiler()
  real = CPUCompiler._run
  def no_openmp(self, src, openmp):
    if openmp: return None, "cc: error: unrecognized command-line option '-fopenmp'"
    return real(self, src, openmp)
  monkeypatch.setattr(CPUCompiler, "_run", no_openmp)
  lib = compiler.compile(SCALE)
  assert lib[:4] == b"\x7fELF" and compiler.openmp is False
  assert any("-fopenmp" in str(w.message) for w in recwarn)
  # a real error in the kernel still raises, without retrying OpenMP forever
  with pytest.raises(CompileError): compiler.compile("void f( {")

def test_openmp_pragma_error_is_not_mistaken_for_missing_openmp():
  compiler = CPUCompiler()
  with pytest.raises(CompileError, match="omp"):
    compiler.compile("void f(int* d) {\n#pragma omp parallel for\n  d[0] = 1;\n}\n")
  assert compiler.openmp is not False

def test_global_loop_uses_all_threads():
  compiler = Device["CPU"].compiler
  threads = int(os.environ.get("OMP_NUM_THREADS") or len(os.sched_getaffinity(0)))
  if threads < 2: pytest.skip("one core/thread only")
  runner = CompiledRunner(Program("tid", TID, "CPU", vars=[]))
  if compiler.openmp is False: pytest.skip("compiler has no OpenMP")
  out = Buffer("CPU", 4096, dtypes.int32).allocate()
  runner.clprg(out._buf, vals=(4096,))
  used = set(out.numpy().tolist())
  assert len(used) > 1 and used <= set(range(threads))

def test_program_errors():
  with pytest.raises(RuntimeError, match="no function named 'nope'"): CPUProgram("nope", CPUCompiler().compile_cached(SCALE))

def test_compiler_choice(monkeypatch):
  monkeypatch.setenv("CPU_COMPILER", "definitely-not-a-compiler")
  with pytest.warns(UserWarning, match="not found"): c = CPUCompiler()
  assert os.path.basename(c.cc) in ("gcc", "cc", os.path.basename(os.environ.get("CC", "gcc")))

# ---- where the library is mapped from: a noexec temp dir must not break the CPU device -------------

def _fresh_lib_dir(monkeypatch):
  import weakref
  from tilecraft.runtime import cpu
  monkeypatch.setattr(cpu, "_lib_dir", None)
  monkeypatch.setattr(cpu, "_loaded", weakref.WeakValueDictionary())  # (else a library loaded before is handed out again)
  return cpu

def test_noexec_tmpdir_is_detected_and_skipped(monkeypatch, tmp_path, rng):
  cpu = _fresh_lib_dir(monkeypatch)
  monkeypatch.setattr(cpu.tempfile, "tempdir", str(tmp_path))  # the temp dir, as TMPDIR would set it
  monkeypatch.setattr(cpu, "_is_noexec", lambda d: d == str(tmp_path))  # ... mounted noexec
  x = rng.standard_normal(100)
  out = Buffer("CPU", 100, dtypes.float64).allocate()
  CPUProgram("scale", CPUCompiler().compile_cached(SCALE))(out._buf, fbuf(x)._buf)
  np.testing.assert_allclose(out.numpy(), x * 2.5)
  assert cpu._lib_dir not in (None, str(tmp_path)) and list(tmp_path.iterdir()) == []

def test_dlopen_failure_falls_back_to_another_dir(monkeypatch, tmp_path):
  """noexec that statvfs doesn't show (e.g. a security module): dlopen itself fails there."""
  cpu = _fresh_lib_dir(monkeypatch)
  monkeypatch.setattr(cpu.tempfile, "tempdir", str(tmp_path))
  real = cpu.ctypes.CDLL
  tried = []
  def cdll(path, *a, **kw):
    tried.append(path)
    if path.startswith(str(tmp_path)): raise OSError(f"{path}: failed to map segment from shared object")
    return real(path, *a, **kw)
  monkeypatch.setattr(cpu.ctypes, "CDLL", cdll)
  CPUProgram("scale", CPUCompiler().compile_cached(SCALE))
  assert tried[0].startswith(str(tmp_path)) and not tried[-1].startswith(str(tmp_path)) and cpu._lib_dir != str(tmp_path)
  # the temp file is gone (the process's own dir stays until it exits)
  assert [(p.name, list(p.iterdir())) for p in tmp_path.iterdir()] in ([], [(f"tilecraft-{os.getpid()}.d", [])])

def test_no_loadable_dir_names_them_all(monkeypatch, tmp_path):
  cpu = _fresh_lib_dir(monkeypatch)
  monkeypatch.setattr(cpu, "_is_noexec", lambda d: True)
  with pytest.raises(OSError, match="could not load a CPU kernel library.*mounted noexec"):
    CPUProgram("scale", CPUCompiler().compile_cached(SCALE))

def test_openmp_threads_spin_briefly_unless_told_otherwise():
  """Importing the CPU runtime sets libgomp's wait: a spin of ~1.5 ms (GOMP_SPINCOUNT=30000) then sleep, unless the
  user set OMP_WAIT_POLICY or GOMP_SPINCOUNT, which are left exactly as given."""
  import subprocess, sys
  code = "import os, tilecraft.runtime.cpu; print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))"
  def env_after(**env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True, check=True).stdout.split()
  assert env_after() == ["PASSIVE", "30000"]
  assert env_after(OMP_WAIT_POLICY="PASSIVE") == ["PASSIVE", "None"]
  assert env_after(OMP_WAIT_POLICY="ACTIVE") == ["ACTIVE", "None"]
  assert env_after(GOMP_SPINCOUNT="0") == ["PASSIVE", "0"]
