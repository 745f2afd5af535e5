"""Tensor cores on the PYTHON device under EMULATE=CUDA|METAL|AMD: the real instruction (use 1: the
emulator's WMMA runs each warp with the vendor's lane layout) for every dtype pair each vendor lists,
on the TC test cases (tilecraft/testing/tc_cases.py: matmuls of several sizes, padded non-multiples,
a batched matmul, a 3x3 conv with several reduce axes, CAST operands) for every accepted axis
choice; use 2 and 3 as well; and the differential fuzzer with TC-first opt sequences."""
import os, subprocess, sys
import numpy as np
import pytest
from tilecraft.codegen.kernel import OptOps
from tilecraft.codegen.uops import UOps
from tilecraft.device import Device
from tilecraft.dtype import dtypes
from tilecraft.helpers import Context
from tilecraft.renderer.tensor_cores import TENSOR_CORES, wmma_warps
from tilecraft.testing.fuzz import run_program
from tilecraft.testing.tc_cases import accepted_axes, cases, fuzz_tc, held, matmul, tc_kernels, tolerance as tol

VENDORS = ("CUDA", "AMD", "METAL")
ALL = [(v, tc) for v in VENDORS for tc in TENSOR_CORES[v]]


def reduce_size(k): return int(np.prod([s for s, o in zip(k.full_shape, k.output_shape) if s != o]))

def run(ast, inputs, k):
  p = k.to_program()
  return p, run_program(ast, p, inputs, "PYTHON")[0].astype(np.float64)

@pytest.mark.parametrize("vendor,tc", ALL, ids=[f"{v}-{tc}" for v, tc in ALL])
def test_wmma_matches_numpy_every_case_and_axis(vendor, tc):
  with Context(EMULATE=vendor):
    ks = tc_kernels(Device["PYTHON"].renderer, tc, seed=ALL.index((vendor, tc)))
    assert {c[0] for c in ks} == {"64x64x64", "32x48x64", "61x67x45", "batched", "conv3x3"}, "every case has an accepted axis"
    for name, ax, tc_opt, extra, ast, inputs, want, k in ks:
      p, got = run(ast, inputs, k)
      assert any(u.op is UOps.WMMA for u in p.uops), name
      np.testing.assert_allclose(got.reshape(want.shape), want, **tol(ast.src[0].arg.dtype, reduce_size(k)), err_msg=f"{name} axis {ax} {k.colored_shape()}")

@pytest.mark.parametrize("din", [dtypes.float16, dtypes.bfloat16], ids=lambda d: d.name)
def test_cuda_half_and_bf16_reduces_accumulate_in_float(din, rng):
  """A SUM in half/bfloat16 (what a@b gives) runs on the ->float core and is rounded once at the end."""
  from tilecraft.codegen.kernel import Kernel
  ast, inputs, want = matmul(rng, 32, 32, 64, din, din)
  with Context(EMULATE="CUDA"):
    k = Kernel(ast, opts=Device["PYTHON"].renderer)
    k.apply_tensor_cores(1)
    p, got = run(ast, inputs, k)
  assert k.tensor_core.dtype_out == dtypes.float32 and any(u.op is UOps.WMMA for u in p.uops)
  np.testing.assert_allclose(got.reshape(want.shape), held(want, din), rtol=1e-2, atol=1e-2)

@pytest.mark.parametrize("vendor", VENDORS)
def test_use2_and_use3_on_python(vendor, rng):
  from tilecraft.codegen.kernel import Kernel
  tc = TENSOR_CORES[vendor][0]
  with Context(EMULATE=vendor):
    ren = Device["PYTHON"].renderer
    for name, (ast, inputs, want), tc_opt, extra in [c for c in cases(rng, tc) if c[0] in ("32x48x64", "conv3x3")]:
      for use in (2, 3):
        k = Kernel(ast, opts=ren)
        k.apply_tensor_cores(use, extra_opts=extra, axis=accepted_axes(ast, ren, tc_opt)[0], tc_opt=tc_opt)
        p, got = run(ast, inputs, k)
        assert not any(u.op is UOps.WMMA for u in p.uops) and (use == 2) != any(u.op is UOps.DEFINE_LOCAL for u in p.uops)
        np.testing.assert_allclose(got.reshape(want.shape), want, **tol(ast.src[0].arg.dtype, reduce_size(k)), err_msg=f"{name} use {use}")

def test_emulator_rejects_fragments_in_another_layout(rng):
  """RDNA3's replicated lanes must agree: fragments in another layout are an error, not another answer."""
  a = rng.uniform(-1, 1, (1, 32, 16)).astype(np.float16)
  with pytest.raises(ValueError, match="replicated"): wmma_warps(TENSOR_CORES["AMD"][0], a, a, np.zeros((1, 32, 8), np.float32))

# ---- the differential fuzzer ----------------------------------------------------------------------

@pytest.mark.fuzz
@pytest.mark.parametrize("vendor", VENDORS)
def test_fuzz_tc(vendor):
  with Context(EMULATE=vendor): n, fails = fuzz_tc(Device["PYTHON"].renderer, "PYTHON", 25, seed=VENDORS.index(vendor))
  assert n == 25 and not fails, "\n".join(fails[:5])

@pytest.mark.slow
@pytest.mark.fuzz
@pytest.mark.parametrize("vendor", VENDORS)
def test_fuzz_tc_500(vendor):
  with Context(EMULATE=vendor): n, fails = fuzz_tc(Device["PYTHON"].renderer, "PYTHON", 500, seed=100 + VENDORS.index(vendor))
  assert n == 500 and not fails, "\n".join(fails[:5])

# ---- what a user sees -----------------------------------------------------------------------------

def test_show_explains_the_tc_opt_and_shows_wmma():
  env = dict(os.environ, EMULATE="CUDA")
  r = subprocess.run([sys.executable, "-m", "tilecraft", "show", "(a@b)", "--shapes", "a=64x64:half,b=64x64:half", "--device", "PYTHON", "-v"],
                     cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))), env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr
  assert "TC" in r.stdout and "tensor cores:" in r.stdout and "WMMA_8_16_16_half_float" in r.stdout, r.stdout[-3000:]
  assert "WMMA" in r.stdout.split("--- uops", 1)[1]

@pytest.mark.parametrize("use", [1, 2, 3])
def test_tensor_matmul_under_each_tc_setting(use, rng):
  """a @ b through the frontend: the hand-coded opts take the tensor core, per the TC setting."""
  from tilecraft import Tensor
  from tilecraft.engine import plan_cache
  a, b = rng.uniform(-1, 1, (64, 32)).astype(np.float16), rng.uniform(-1, 1, (32, 48)).astype(np.float16)
  with Context(EMULATE="AMD", TC=use):
    out = (Tensor(a, device="PYTHON") @ Tensor(b, device="PYTHON")).numpy()
    progs = [r.p for r in plan_cache.runners.values() if r.p.device == "PYTHON" and r.p.applied_opts and r.p.applied_opts[0].op is OptOps.TC]
  assert progs and any(any(u.op is UOps.WMMA for u in p.uops) == (use == 1) for p in progs)
  np.testing.assert_allclose(out.astype(np.float64), a.astype(np.float64) @ b.astype(np.float64), rtol=2e-2, atol=4e-2)
