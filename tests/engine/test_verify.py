"""Output checking (tilecraft.engine.verify) and its two users: the fuzzer's run_program and the
search's verify job. Hand-written CPU kernels inject the bugs: a store that skips one element whose
right value is 0, True or False (a single sentinel fill misses one of them), and accesses one
element before a buffer's start."""
from __future__ import annotations
import dataclasses
import numpy as np
import pytest
from tilecraft.device import Device
from tilecraft.dtype import dtypes
from tilecraft.engine import isolation
from tilecraft.engine.search import worker
from tilecraft.engine.verify import SENTINELS, compare, filled, max_abs_error, random_array, raw_bytes, shift_ast, tolerance
from tilecraft.ops import BinaryOps
from tilecraft.testing import fuzz
from tilecraft.testing.corpus import ST, alu, const, kernel, ld, store

# ---- compare -------------------------------------------------------------------------------------

def test_compare_semantics():
  f32 = dtypes.float32
  assert compare(np.array([np.nan, np.inf, -np.inf, 1.0], np.float32), np.array([np.nan, np.inf, -np.inf, 1.00001], np.float32), f32) is None
  assert compare(np.array([np.inf], np.float32), np.array([1e30], np.float32), f32) is not None
  assert compare(np.array([np.nan], np.float32), np.array([0.0], np.float32), f32) is not None
  assert compare(np.array([1.0], np.float32), np.array([np.nan], np.float32), f32) is not None
  assert compare(np.array([1.0], np.float32), np.array([1.01], np.float32), f32) is not None
  assert compare(np.array([1.0], np.float16), np.array([1.005], np.float16), dtypes.float16) is None
  assert compare(np.array([3], np.int32), np.array([3], np.int32), dtypes.int32) is None
  assert compare(np.array([3], np.int32), np.array([4], np.int32), dtypes.int32) is not None  # ints are exact
  assert compare(np.array([True]), np.array([False]), dtypes.bool) is not None
  msg = compare(np.array([1, 2, 3], np.int8), np.array([1, 5, 6], np.int8), dtypes.int8)
  assert msg is not None and "2/3 elements differ" in msg and "max error 3" in msg
  assert compare(np.zeros(3, np.float32), np.zeros(4), f32) is not None

def test_compare_scale_and_tolerances():
  """atol is multiplied by `scale` (the search passes the reference's median magnitude, bench its max)."""
  ref = np.array([1000.0, 2000.0, 0.0], np.float64)
  off = ref + np.array([0.0, 0.0, 0.05])
  assert compare(off, ref, dtypes.float32) is not None  # 0.05 off a 0: over atol 1e-4
  assert compare(off, ref, dtypes.float32, rtol=0.0, atol=1e-4, scale=1000.0) is None
  assert compare(off, ref, dtypes.float32, rtol=0.0, atol=1e-5, scale=1000.0) is not None
  assert tolerance(dtypes.int32) == (0.0, 0.0) and tolerance(dtypes.float16)[0] > tolerance(dtypes.float32)[0] > tolerance(dtypes.float64)[0]
  assert max_abs_error(np.array([1.0, np.nan]), np.array([1.5, np.nan])) == 0.5
  assert max_abs_error(np.array([1.0]), np.array([np.nan])) == np.inf

def test_sentinel_fills_expose_every_value():
  """Whatever a skipped element's right value, one of the two fills differs from it."""
  for dt, values in [(dtypes.float32, [0.0, -0.0, np.nan, 1.0, -2.9e-16]), (dtypes.bool, [False, True]), (dtypes.int32, [0, -1, 7]),
                     (dtypes.uint8, [0, 255]), (dtypes.float16, [0.0, np.nan])]:
    fills = [filled(dt, 1, b).view(dt.np)[0] for b in SENTINELS]
    for v in values:
      assert any(compare(np.array([f], dt.np), np.array([v], dt.np), dt) is not None for f in fills), (dt, v, fills)
    assert (raw_bytes(filled(dt, 3, SENTINELS[1]).view(dt.np), dt) == SENTINELS[1]).all()

def test_random_array_signed_ints():
  rng = np.random.default_rng(0)
  a = random_array(dtypes.int32, 1000, rng)
  assert a.dtype == np.int32 and (a < 0).any() and (a > 0).any() and not (a == 0).any() and np.abs(a).max() <= 7
  u = random_array(dtypes.uint16, 1000, rng)
  assert u.dtype == np.uint16 and u.min() >= 1 and u.max() <= 7
  b = random_array(dtypes.bool, 1000, rng)
  assert b.dtype == np.bool_ and b.any() and not b.all()

def test_shift_ast_moves_every_global_access():
  ast = kernel(store(0, dtypes.float32, ST((4, 3)), ld(1, dtypes.float32, ST((3, 4)).permute((1, 0)))))
  sh = shift_ast(ast, 64)
  assert shift_ast(ast, 0) is ast and sh.key != ast.key
  mbs = [x.arg for x in sh.lazyops if hasattr(x.arg, "st")]
  assert mbs and all(mb.st.views[0].offset == 64 for mb in mbs)
  assert [mb.st.real_size() for mb in mbs] == [64 + 12, 64 + 12]

# ---- injected bugs: hand-written kernels ---------------------------------------------------------

N, SKIP = 16, 3
# (output dtype, C type, the kernel's value for element i: the same right answer for any input in [-1, 1))
CASES = {"zero": (dtypes.float32, "float", "data1[i] * 0.0f"), "true": (dtypes.bool, "_Bool", "data1[i] < 2.0f"),
         "false": (dtypes.bool, "_Bool", "data1[i] > 2.0f")}

def _ast(dt):
  """An AST with the hand-written kernels' buffers: output 0 of dt, float input 1, N elements."""
  x = ld(1, dtypes.float32, ST((N,)))
  val = alu(BinaryOps.MUL, x, const(0.0, dtypes.float32, ST((N,)))) if dt == dtypes.float32 else alu(BinaryOps.CMPLT, x, const(2.0, dtypes.float32, ST((N,))))
  return kernel(store(0, dt, ST((N,)), val))

def _src(ctype: str, body: str, front: int) -> str:
  return (f"void hand_kernel({ctype}* restrict data0, const float* restrict data1) {{\n  data0 += {front}; data1 += {front};\n"
          f"  {body}\n}}\n")

def _fuzz_run(dt, src: str) -> list[np.ndarray]:
  ast = _ast(dt)
  p = dataclasses.replace(fuzz.get_program(ast, [], "CPU"), name="hand_kernel", src=src)
  return fuzz.run_program(ast, p, {1: np.linspace(-1, 1, N, dtype=np.float32)}, "CPU", front=fuzz.FRONT_GUARD)

def _verify(dt, ref_src: str, cand_srcs: list[str], front: int = 0) -> list[tuple]:
  comp = Device["CPU"].compiler
  prog = lambda src: ("hand_kernel", comp.compile_cached(src), None, None, [])  # noqa: E731
  job = isolation.Job("verify", ("CPU", prog(ref_src), [prog(s) for s in cand_srcs], [(N, dt), (N, dtypes.float32)], 1, False, 7, 64, front), 60.0)
  status, res = isolation.get_pool(worker.HANDLER).run([job], 1)[0]
  assert status == "ok", res
  return res

@pytest.mark.parametrize("case", list(CASES))
def test_skipped_element_is_caught(case: str):
  """A store that skips element SKIP, whose right value is 0 / True / False: the fuzzer raises
  'never written', the search's verify rejects the candidate; the correct kernel passes both."""
  dt, ctype, val = CASES[case]
  F = fuzz.FRONT_GUARD
  good, skip = f"for (int i = 0; i < {N}; i++) data0[i] = {val};", f"for (int i = 0; i < {N}; i++) if (i != {SKIP}) data0[i] = {val};"
  out = _fuzz_run(dt, _src(ctype, good, F))[0]
  assert compare(out, np.full(N, {"zero": 0.0, "true": True, "false": False}[case]), dt) is None
  with pytest.raises(fuzz.GuardZoneError, match=rf"never written.*\[{SKIP}\]"): _fuzz_run(dt, _src(ctype, skip, F))
  (ok_good, _, note_good), (ok_skip, _, note_skip) = _verify(dt, _src(ctype, good, 0), [_src(ctype, good, 0), _src(ctype, skip, 0)])
  assert ok_good and not note_good
  assert not ok_skip and "output 0" in note_skip

def test_access_before_the_start_is_caught():
  """Guard zones before every buffer: a write to data0[-1] and a read of data1[-1]."""
  dt, ctype, val = CASES["zero"]
  F = fuzz.FRONT_GUARD
  good = f"for (int i = 0; i < {N}; i++) data0[i] = {val};"
  with pytest.raises(fuzz.GuardZoneError, match=r"output buffer 0: 1 element.*before the start.*\[-1\]"):
    _fuzz_run(dt, _src(ctype, good + " data0[-1] = 1.0f;", F))
  out = _fuzz_run(dt, _src(ctype, f"for (int i = 0; i < {N}; i++) data0[i] = data1[i - 1];", F))[0]
  assert np.isnan(out[0]) and not np.isnan(out[1:]).any()  # the input's front guard is poisoned
  res = _verify(dt, _src(ctype, good, 64), [_src(ctype, good, 64), _src(ctype, good + " data0[-1] = 1.0f;", 64)], front=64)
  assert res[0][0] and not res[1][0] and "before the start of output 0" in res[1][2]

# ---- the search's tolerance (issue 28, item 10) ---------------------------------------------------

def _relu_of_sums(order: np.ndarray, terms: np.ndarray) -> np.ndarray:
  """relu of each row's float32 sum of terms, added in the given order (a candidate's reordered reduce)."""
  acc = np.zeros(terms.shape[0], np.float32)
  for j in order: acc = acc + terms[:, j]
  return np.maximum(acc, np.float32(0))

def test_search_tolerance_scales_by_a_magnitude_a_relu_cannot_zero():
  """relu((a@a)) is 0 in half its elements, so its median magnitude is 0; candidates that merely sum
  in another order differ by a rounding error where the sum is near 0 and were called code generation
  bugs. The tolerance scales by the size of the nonzero values, and real errors are still caught."""
  rng = np.random.default_rng(28)
  half = rng.uniform(-4, 4, (256, 32)).astype(np.float32)
  # each row's exact sum is 0 for even rows (every term cancelled), clearly nonzero (either sign) for odd ones
  terms = np.concatenate([half, -half], axis=1)
  terms[1::2, 0] += rng.uniform(-8, 8, 128).astype(np.float32)
  ref = _relu_of_sums(np.arange(64), terms)
  cand = _relu_of_sums(rng.permutation(64), terms)
  assert (ref == 0).mean() >= 0.5 and np.median(np.abs(ref)) == 0.0
  assert not np.array_equal(ref, cand)  # rounding differs where the sums cancel
  assert worker.check_output(cand, ref, dtypes.float32) is None
  assert worker._magnitude(ref, dtypes.float32) > 1.0
  # a real bug: one element off by 5% of its value, or a zero where the value is not
  bad = cand.copy()
  k = int(np.argmax(ref))
  bad[k] *= 1.05
  assert (msg := worker.check_output(bad, ref, dtypes.float32)) is not None and "1/256 elements differ" in msg
  bad = cand.copy()
  bad[k] = 0.0
  assert worker.check_output(bad, ref, dtypes.float32) is not None
  # all zeros: exact (nothing to scale by); ints stay exact
  assert worker._magnitude(np.zeros(4, np.float32), dtypes.float32) == 0.0
  assert worker.check_output(np.array([1e-6, 0], np.float32), np.zeros(2, np.float32), dtypes.float32) is not None
  assert worker.check_output(np.array([1, 2], np.int32), np.array([1, 3], np.int32), dtypes.int32) is not None
