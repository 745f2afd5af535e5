"""The CUDA device on a real GPU: buffers, launches and timing; the corpus fuzzed on CUDA against
numpy and the unoptimized kernel; the tensor cores (every case and axis, use 2 and 3, fuzzed);
half/bfloat16 matmuls through the frontend; light ONNX models against onnxruntime. Skipped where CUDA
is render + compile-check only (no GPU or no cuda-python): bench/gpu_check.sh runs these on a GPU
machine, with TEST_GPU=CUDA for the frontend's op checks (tests/op_checks.py). Without a GPU, the
runtime's driver calls are checked against a stand-in libcuda (the last test)."""
import numpy as np
import pytest
from tilecraft.codegen.kernel import Kernel, Opt, OptOps
from tilecraft.codegen.uops import UOps
from tilecraft.device import Buffer, CompiledRunner, Device
from tilecraft.dtype import dtypes
from tilecraft.renderer.tensor_cores import TENSOR_CORES
from tilecraft.testing import fuzz
from tilecraft.testing.corpus import corpus, known_bug
from tilecraft.testing.tc_cases import accepted_axes, cases, fuzz_tc, tc_kernels, tolerance

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

# ---- tensor cores -----------------------------------------------------------------------------------

def _reduce_size(k: Kernel) -> int: return int(np.prod([s for s, o in zip(k.full_shape, k.output_shape) if s != o]))

@pytest.mark.parametrize("tc", TENSOR_CORES["CUDA"], ids=str)
def test_tensor_cores_every_case_and_axis(tc):
  """mma.sync on the GPU (use 1) for each core's dtypes: matmuls (padded non-multiples too), batched, a conv."""
  _cuda_or_skip()
  ks = tc_kernels(Device["CUDA"].renderer, tc, seed=TENSOR_CORES["CUDA"].index(tc))
  assert ks
  for name, ax, _, _, ast, inputs, want, k in ks:
    p = k.to_program()
    assert any(u.op is UOps.WMMA for u in p.uops), name
    got = fuzz.run_program(ast, p, inputs, "CUDA")[0].astype(np.float64)
    np.testing.assert_allclose(got.reshape(want.shape), want, **tolerance(ast.src[0].arg.dtype, _reduce_size(k)), err_msg=f"{name} axis {ax} {k.colored_shape()}")

def test_tensor_core_use_2_and_3(rng):
  """The TC layout without the instruction: use 2 (registers) and use 3 (through shared memory)."""
  _cuda_or_skip()
  ren = Device["CUDA"].renderer
  for name, (ast, inputs, want), tc_opt, extra in [c for c in cases(rng, TENSOR_CORES["CUDA"][0]) if c[0] in ("32x48x64", "conv3x3")]:
    for use in (2, 3):
      k = Kernel(ast, opts=ren)
      assert k.apply_tensor_cores(use, extra_opts=extra, axis=accepted_axes(ast, ren, tc_opt)[0], tc_opt=tc_opt)
      got = fuzz.run_program(ast, k.to_program(), inputs, "CUDA")[0].astype(np.float64)
      np.testing.assert_allclose(got.reshape(want.shape), want, **tolerance(ast.src[0].arg.dtype, _reduce_size(k)), err_msg=f"{name} use {use}")

@pytest.mark.fuzz
def test_fuzz_tensor_cores_on_cuda():
  _cuda_or_skip()
  n, fails = fuzz_tc(Device["CUDA"].renderer, "CUDA", 60, seed=7)
  assert n == 60 and not fails, "\n".join(fails[:5])

@pytest.mark.parametrize("dt", ["float16", "bfloat16", "float32"])
def test_frontend_matmul_takes_the_tensor_core(dt, rng):
  """a @ b through the frontend with the hand-coded opts: half and bf16 take the tensor core, float doesn't."""
  _cuda_or_skip()
  from tilecraft import Tensor
  from tilecraft.engine import plan_cache
  a, b = rng.uniform(-1, 1, (96, 80)).astype(np.float32), rng.uniform(-1, 1, (80, 112)).astype(np.float32)
  plan_cache.clear()
  out = (Tensor(a, device="CUDA").cast(dt) @ Tensor(b, device="CUDA").cast(dt)).cast("float32").numpy()
  progs = [r.p for r in plan_cache.runners.values() if r.p.device == "CUDA"]
  assert any(any(u.op is UOps.WMMA for u in p.uops) for p in progs) == (dt != "float32"), [p.applied_opts for p in progs]
  want = a.astype(np.float64) @ b.astype(np.float64)
  np.testing.assert_allclose(out, want, **(dict(rtol=1e-4, atol=1e-4) if dt == "float32" else dict(rtol=3e-2, atol=0.15)))

# ---- models -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["squeezenet", "shufflenet", "resnet50"])
def test_light_model_on_cuda_matches_onnxruntime(name):
  _cuda_or_skip()
  pytest.importorskip("onnxruntime")
  from onnx_checks import check_matches_onnxruntime
  from tilecraft.onnx.light import light_input, light_model
  check_matches_onnxruntime(light_model(name, seed=0), lambda m, seed: light_input(m, seed=seed), "CUDA", name)

# ---- without a GPU: a stand-in driver ---------------------------------------------------------------

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
