"""The C renderer's vector transcendentals (exp2, log2 without library calls, so kernels with them
stay vectorized), on both vector widths: special values exactly, the rest within float32 rounding."""
import shutil, subprocess
import numpy as np
import pytest
from tilecraft import Context, Tensor
from tilecraft.codegen.kernel import Kernel
from tilecraft.device import Device
from op_checks import require_arch

ARCHS = ("native", "haswell")
SPECIAL = np.array([0, -0.0, -1, np.inf, -np.inf, np.nan, 1e-45, 1e-40, 1.17e-38, 3.4e38, 1, 2, 0.5, 1.41421356, 1.4142137, -150, -149.5, -126.5,
                    127.9, 128, 129, 200, -200], dtype=np.float32)

def _inputs(rng):
  return np.concatenate([SPECIAL, rng.standard_normal(2000).astype(np.float32) * 60, np.exp(np.clip(rng.standard_normal(2000) * 30, -87, 88)).astype(np.float32)])

def _check(got, want):
  with np.errstate(over="ignore"): want32 = want.astype(np.float32)
  assert np.array_equal(np.isnan(got), np.isnan(want32))
  inf = np.isinf(want32)
  assert np.array_equal(got[inf], want32[inf])
  fin = np.isfinite(want32) & (np.abs(want32) > 1e-37)
  np.testing.assert_allclose(got[fin], want[fin], rtol=3e-7, atol=0)

@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("fn", ["exp2", "log2"])
def test_vector_math_float32(arch, fn, rng):
  require_arch(arch)
  x = _inputs(rng)
  x = x[: len(x) // 16 * 16]
  with Context(CPU_ARCH=arch):
    si = getattr(Tensor(x), fn)().schedule()[-1]
    k = Kernel(si.ast, Device["CPU"].renderer).hand_coded_optimizations()
    src = k.to_program().src
    assert f"tc_{fn}_float{Device['CPU'].renderer.vector_width}" in src  # the vector form is used
    got = getattr(Tensor(x), fn)().numpy()
  with np.errstate(all="ignore"): want = getattr(np, fn)(x.astype(np.float64))
  _check(got, want)

@pytest.mark.parametrize("fn", ["exp2", "log2"])
def test_vector_math_float64_lanewise(fn, rng):
  x = np.abs(rng.standard_normal(64)) * 10
  got = getattr(Tensor(x), fn)().numpy()
  np.testing.assert_allclose(got, getattr(np, fn)(x), rtol=1e-12)

@pytest.mark.skipif(shutil.which("objdump") is None, reason="no objdump")
@pytest.mark.parametrize("arch", ARCHS)
def test_softmax_sigmoid_log_kernels_call_no_libm(arch, tmp_path):
  with Context(CPU_ARCH=arch):
    x = Tensor.empty(64, 256)
    # per-element exp2/log2 are vector code; a log2 per row after a reduce (log_softmax) may stay a call
    for t, per_element in ((x.softmax(1), ("exp2f",)), (x.sigmoid(), ("exp2f",)), (x.log(), ("log2f",)), (x.gelu(), ("exp2f",)),
                           (x.log_softmax(1), ("exp2f",))):
      for si in t.schedule():
        k = Kernel(si.ast, Device["CPU"].renderer).hand_coded_optimizations()
        (tmp_path / "k.so").write_bytes(Device["CPU"].compiler.compile(k.to_program().src))
        asm = subprocess.run(["objdump", "-d", str(tmp_path / "k.so")], capture_output=True, text=True).stdout
        assert not any(f"{fn}@plt" in asm for fn in per_element), k.name

# ---- the MLP epilogue functions, built on exp2/log2: accuracy against numpy, one vector kernel each ----

def _epilogue_refs():
  import math
  def gelu(x): return x / (1 + np.exp(-2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))  # = 0.5 x (1 + tanh(u)), no cancellation
  return {"exp": (lambda t: t.exp(), np.exp), "log": (lambda t: t.abs().log(), lambda x: np.log(np.abs(x))),
          "tanh": (lambda t: t.tanh(), np.tanh), "sigmoid": (lambda t: t.sigmoid(), lambda x: 1 / (1 + np.exp(-x))),
          "gelu": (lambda t: t.gelu(), gelu)}

@pytest.mark.parametrize("fn", ["exp", "log", "tanh", "sigmoid", "gelu"])
def test_epilogue_functions_accuracy_and_one_vector_kernel(fn, rng):
  """Each is one elementwise kernel whose lanes are full-width vectors calling the vector exp2/log2
  (gelu was three kernels when written with tanh's branches), accurate to a few float32 ulps:
  relative where the result is well above the subnormals, absolute 1e-6 near the zeros of gelu."""
  tc_fn, ref_fn = _epilogue_refs()[fn]
  x = np.concatenate([np.array([0, -0.0, 1e-30, -1e-30, 1e-6, 0.29, 0.3, 0.31, -0.3, 5, -5, 9, -9, 15, -15, 40, -40, 88, -88, 100, -100], np.float32),
                      rng.standard_normal(4000).astype(np.float32) * 4])
  x = x[: len(x) // 16 * 16]
  sched = [si for si in tc_fn(Tensor(x)).schedule() if si.ast.op.name == "KERNEL"]
  assert len(sched) == 1, f"{fn}: {len(sched)} kernels"
  k = Kernel(sched[0].ast, Device["CPU"].renderer).hand_coded_optimizations()
  vw = Device["CPU"].renderer.vector_width
  src = k.to_program().src
  assert f"float{vw}" in src and (fn == "log" or f"tc_exp2_float{vw}" in src) and (fn != "log" or f"tc_log2_float{vw}" in src)
  got = tc_fn(Tensor(x)).numpy().astype(np.float64)
  with np.errstate(all="ignore"):
    want = ref_fn(x.astype(np.float64))
    want32 = want.astype(np.float32).astype(np.float64)  # (exp(100) is inf in float32)
  fin = np.isfinite(want32)
  assert np.array_equal(np.isfinite(got), fin) and np.array_equal(got[~fin], want32[~fin])
  big = fin & (np.abs(want) > 1e-30)
  # exp's argument a is rounded to float32 (and scaled by log2(e)) first: a relative error up to ~|a| * 1.2e-7 in the result
  ax = np.abs(x.astype(np.float64))
  arg = {"exp": ax, "log": 0 * ax, "tanh": 2 * ax, "sigmoid": ax, "gelu": 1.6 * (ax + 0.045 * ax ** 3)}[fn]
  rtol = 1e-6 + 1.5e-7 * arg
  assert (np.abs(got[big] - want[big]) <= rtol[big] * np.abs(want[big]) + (1e-6 if fn == "gelu" else 0)).all(), fn
  assert (np.abs(got[fin & ~big] - want[fin & ~big]) <= 1e-30).all()
