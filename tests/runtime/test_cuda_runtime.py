"""The CUDA device on a real GPU: buffers, launches and timing, and the corpus fuzzed on CUDA against
numpy and the unoptimized kernel. Skipped where CUDA is render + compile-check only (no GPU or no
cuda-python): bench/gpu_check.sh runs these on a GPU machine."""
import numpy as np
import pytest
from tilecraft.codegen.kernel import Kernel, Opt, OptOps
from tilecraft.device import Buffer, CompiledRunner, Device
from tilecraft.dtype import dtypes
from tilecraft.testing import fuzz
from tilecraft.testing.corpus import corpus, known_bug

def _cuda_or_skip():
  if (why := Device["CUDA"].render_only) is not None: pytest.skip(f"CUDA can't run here: {why}")

def test_buffers_and_a_kernel():
  _cuda_or_skip()
  x = np.arange(1000, dtype=np.float32)
  b = Buffer("CUDA", 1000, dtypes.float32).copyin(x)
  assert np.array_equal(b.numpy(), x)
  e = corpus()["sum_axis1_5x7x9"]
  k = Kernel(e.ast, opts=Device["CUDA"].renderer)
  for o in (Opt(OptOps.LOCAL, 1, 9), Opt(OptOps.GROUP, 0, 7)): k.apply_opt(o)
  inputs = fuzz.entry_inputs(e)
  out = fuzz.run_program(e.ast, k.to_program(), inputs, "CUDA")
  assert fuzz.compare_outputs(out, e.reference(inputs, {}), e.ast) is None
  t = CompiledRunner(k.to_program())([Buffer("CUDA", 45, dtypes.float32).allocate(), Buffer("CUDA", 315, dtypes.float32).allocate()])
  assert isinstance(t, float) and 0 < t < 1

@pytest.mark.fuzz
def test_fuzz_corpus_on_cuda():
  _cuda_or_skip()
  total = fuzz.FuzzReport()
  for name, e in corpus().items():
    if known_bug(name, "CUDA", "fuzz"): continue
    rep = fuzz.fuzz_entry(e, 5, "CUDA", seed=1)
    assert rep.ok, f"{name} on CUDA: {rep.summary()}"
    total = total.merge(rep)
  assert total.pairs >= 300, total.summary()

_STUB_CHECK = r'''
import ctypes, sys
import numpy as np
stub = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)  # soname libcuda.so.1: cuda-python's dlopen finds it
stub.stub_last_function.restype = ctypes.c_char_p
stub.stub_last_dims.restype = ctypes.POINTER(ctypes.c_uint)
stub.stub_last_args.restype = ctypes.POINTER(ctypes.c_uint64)
from tilecraft.codegen.kernel import Kernel, Opt, OptOps
from tilecraft.device import Buffer, CompiledRunner, Device
from tilecraft.dtype import dtypes
from tilecraft.testing.corpus import corpus
dev = Device["CUDA"]
assert dev.render_only is None, dev.render_only
assert dev.compiler.arch == "sm_90", dev.compiler.arch
x = np.arange(100, dtype=np.float32)
b = Buffer("CUDA", 100, dtypes.float32).copyin(x)
assert np.array_equal(b.numpy(), x)
e = corpus()["sym_reduce_4xn"]
k = Kernel(e.ast, opts=dev.renderer)
k.apply_opt(Opt(OptOps.LOCAL, 0, 2))
p = k.to_program()
bufs = [Buffer("CUDA", 64, dtypes.float32).allocate() for _ in p.globals]
v = p.vars[0]
stub.stub_expect_args(len(bufs) + 1)
t = CompiledRunner(p)(bufs, {v: 5})
assert t == 0.25e-3, t
assert stub.stub_last_function().decode() == p.name
dims = stub.stub_last_dims()[:6]
gs, ls = p.launch_dims({v: 5})
assert dims == (gs + [1, 1, 1])[:3] + (ls + [1, 1, 1])[:3], (dims, gs, ls)
args = stub.stub_last_args()[:len(bufs) + 1]
assert args[:-1] == [int(b_._buf) for b_ in bufs] and args[-1] == 5, args
k2 = Kernel(corpus()["ew_50257"].ast, opts=dev.renderer)
k2.apply_opt(Opt(OptOps.NOLOCALS))
p2 = k2.to_program()
stub.stub_expect_args(len(p2.globals))
CompiledRunner(p2)([Buffer("CUDA", 50257, dtypes.float32).allocate() for _ in p2.globals])
dims = stub.stub_last_dims()[:6]
assert dims[0] * dims[3] == 50257 and dims[3] > 1, dims
print("STUB OK")
'''

def test_runtime_on_a_stub_driver(tmp_path):
  """Without a GPU: the runtime drives cuda-python against a stand-in libcuda (cuda_stub_driver.c)
  that records launches: device open, memory round trip, module load, launch geometry, parameters,
  Variables, event timing. Needs cuda-python, gcc and a CUDA compiler; in a fresh process, because
  cuda-python loads libcuda once."""
  import os, shutil, subprocess, sys
  if Device["CUDA"].render_only is None: pytest.skip("a real GPU is here: the other tests cover it")
  try: import cuda.bindings.driver  # noqa: F401
  except ImportError:
    try: from cuda import cuda  # noqa: F401
    except ImportError: pytest.skip("cuda-python is not installed")
  from tilecraft.runtime.cuda import cuda_compiler_missing
  if cuda_compiler_missing() or not shutil.which("gcc"): pytest.skip("needs gcc and a CUDA compiler")
  lib = tmp_path / "libcuda.so.1"
  src = os.path.join(os.path.dirname(__file__), "cuda_stub_driver.c")
  subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-Wl,-soname,libcuda.so.1", "-o", str(lib), src], check=True)
  res = subprocess.run([sys.executable, "-c", _STUB_CHECK, str(lib)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
  assert res.returncode == 0 and "STUB OK" in res.stdout, res.stdout + res.stderr
