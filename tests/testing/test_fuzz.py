"""The differential opt fuzzer (tilecraft.testing.fuzz): it catches broken kernels (wrong values,
out-of-bounds writes, crashes, exceptions), shrinks failures to minimal opt lists, and a default-tier
run of >= 1,250 (kernel, opt sequence) pairs on CPU finds no mismatch (the slow tier: 5,000+)."""
import dataclasses, os
import numpy as np
import pytest
from tilecraft.codegen.kernel import Kernel, Opt, OptOps
from tilecraft.device import Device
from tilecraft.dtype import dtypes
from tilecraft import Context, Tensor
from tilecraft.testing import fuzz
from tilecraft.testing.corpus import ST, corpus, kernel, known_bug, ld, store
from tilecraft.testing.fuzz import (FuzzReport, GuardZoneError, IsolatedRunner, KernelCrash, check_opts, compare,
                                   entry_inputs, fuzz_entry, get_program, run_ast, run_program,
                                   sample_opt_sequences, shrink, st_indices)
from tilecraft.testing.opt_sampler import FUZZ_OPS, random_opts
from tilecraft.ops import BinaryOps, LazyOp
from tilecraft.shape.shapetracker import ShapeTracker
from tilecraft.shape.symbolic import Variable, sym_eval
from tilecraft.shape.view import View

ENTRIES = corpus()
DEVICES = ("CPU", "OPENCL", "LLVM")

@pytest.fixture(scope="module")
def iso():
  with IsolatedRunner() as r: yield r

# ---- the pieces ----------------------------------------------------------------------------------

@pytest.mark.parametrize("st", [
  ST((5, 7)), ST((5, 7)).permute((1, 0)), ST((5, 7)).pad(((1, 2), (0, 3))), ST((8, 12)).shrink(((1, 7), (2, 10))).flip((0,)).stride((1, 2)),
  ST((4,)).reshape((1, 4)).expand((3, 4)), ST((6, 10)).flip((1,)).shrink(((0, 6), (1, 9))).pad(((1, 0), (0, 3))),
  ShapeTracker(ST((2, 3, 4)).pad(((0, 0), (1, 1), (1, 1))).views + (View.create((2, 2, 3, 3), (30, 0, 6, 1)),)),
  ST((3, 4)).permute((1, 0)).reshape((12,)).reshape((2, 6)),
], ids=lambda st: str(st.shape))
def test_st_indices_agree_with_expr_idxs(st: ShapeTracker):
  """run_ast reads outputs (and decides what a kernel may write) through st_indices: it must agree
  with the ShapeTracker's own index expression, element by element."""
  idx, valid = st_indices(st)
  for pos in np.ndindex(*idx.shape):
    e_idx, e_valid = st.expr_idxs(tuple(pos))
    e_valid = bool(sym_eval(e_valid, {})) if not isinstance(e_valid, int) else bool(e_valid)
    assert bool(valid[pos]) == e_valid, pos
    if e_valid: assert idx[pos] == (e_idx if isinstance(e_idx, int) else sym_eval(e_idx, {})), pos

def test_st_indices_symbolic():
  n = Variable("n", 1, 10)
  idx, valid = st_indices(ST((n, 3)).permute((1, 0)), {n: 4})
  assert idx.shape == (3, 4) and valid.all()
  assert (idx == np.arange(12).reshape(4, 3).T).all()

def test_run_ast_output_shape_and_values():
  e = ENTRIES["sum_axis1_5x7x9"]
  x = entry_inputs(e)
  out = run_ast(e.ast, x)
  assert out[0].shape == (5, 1, 9) and np.allclose(out[0], x[1].sum(1, keepdims=True), atol=1e-5)

def test_random_opts_are_valid_and_refusals_counted():
  e = ENTRIES["matmul_16x16x16"]
  k = Kernel(e.ast, opts=Device["CPU"].renderer)
  rng = np.random.default_rng(0)
  before = (tuple(k.sts), k.upcasted, list(k.applied_opts))
  seqs = [random_opts(k, rng, 4) for _ in range(30)]
  assert (tuple(k.sts), k.upcasted, list(k.applied_opts)) == before, "random_opts must not modify the kernel it is given"
  assert all(s.error is None for s in seqs)
  assert sum(s.refusals for s in seqs) > 0 and any(len(s) >= 2 for s in seqs)
  for s in seqs:
    k2 = k.copy()
    for o in s: k2.apply_opt(o)  # every kept opt replays
  # on a CPU the GPU-only opts are always refused, so every kept opt is one the CPU lowers
  assert {o.op for s in seqs for o in s} <= {OptOps.UPCAST, OptOps.UNROLL, OptOps.PADTO, OptOps.SWAP, OptOps.BLOCK, OptOps.PACK}
  assert set(FUZZ_OPS) >= {OptOps.UPCAST, OptOps.UNROLL, OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.PADTO, OptOps.SWAP, OptOps.NOLOCALS}

def test_sampler_makes_multi_group_lists():
  """On a GPU target the sampler reaches several group axes on one reduce, and UNROLLs of group axes."""
  multi = unrolled_group = 0
  for name in ("sum_axis1_5x7x9", "sum_axis02_5x7x9", "matmul_16x16x16", "sum_all_7x25", "sum_1d_49"):
    e = ENTRIES[name]
    for s in sample_opt_sequences(e, fuzz._seeded(0, e.name, "opts"), 20, "PYTHON")[0]:
      multi += s.kernel.group_for_reduces >= 2
      k = Kernel(fuzz.guarded(e.ast), opts=Device["PYTHON"].renderer)
      for o in s:
        unrolled_group += o.op is OptOps.UNROLL and k.first_reduce + o.axis < k.first_reduce + k.group_for_reduces
        k.apply_opt(o)
  assert multi >= 5 and unrolled_group >= 1, (multi, unrolled_group)

# ---- the fuzzer catches broken kernels -----------------------------------------------------------

def _oob_program(ast: LazyOp, body: str):
  """A hand-written CPU program for `ast`'s buffers (float data0 out, float data1 in)."""
  p = get_program(ast, [], "CPU")
  src = f"void oob_kernel(float* restrict data0, float* restrict data1) {{\n{body}\n}}\n"
  return dataclasses.replace(p, name="oob_kernel", src=src)

def _ew7() -> LazyOp: return kernel(store(0, dtypes.float32, ST((7,)), LazyOp(BinaryOps.ADD, (ld(1, dtypes.float32, ST((7,))), ld(1, dtypes.float32, ST((7,)))))))

def test_guard_zone_catches_write_past_the_end():
  ast = _ew7()
  x = {1: np.arange(7, dtype=np.float32)}
  ok = _oob_program(ast, "  for (int i = 0; i < 7; i++) data0[i] = data1[i] * 2.0f;")
  assert np.array_equal(run_program(ast, ok, x)[0], np.arange(7) * 2)
  bad = _oob_program(ast, "  for (int i = 0; i < 9; i++) data0[i] = 1.0f;")  # two elements too many
  with pytest.raises(GuardZoneError, match=r"output buffer 0: 2 element\(s\).*past the end.*\[7, 8\]"): run_program(ast, bad, x)
  far = _oob_program(ast, "  data0[7 + 63] = 1.0f;")  # the last guard element
  with pytest.raises(GuardZoneError, match="output buffer 0"): run_program(ast, far, x)

def test_guard_zone_catches_write_into_an_input_and_into_holes():
  ast = _ew7()
  x = {1: np.arange(7, dtype=np.float32)}
  with pytest.raises(GuardZoneError, match="input buffer 1"):
    run_program(ast, _oob_program(ast, "  for (int i = 0; i < 7; i++) { data0[i] = 0.0f; data1[i] = 5.0f; }"), x)
  # an output stored through a strided view: the elements between must stay untouched
  strided = kernel(store(0, dtypes.float32, ST((14,)).stride((2,)), ld(1, dtypes.float32, ST((7,)))))
  good = _oob_program(strided, "  for (int i = 0; i < 7; i++) data0[2*i] = data1[i];")
  assert np.array_equal(run_program(strided, good, x)[0], np.arange(7))
  hole = dataclasses.replace(good, src=good.src.replace("data0[2*i] = data1[i];", "data0[2*i] = data1[i]; data0[1] = 0.0f;"))
  with pytest.raises(GuardZoneError, match="output buffer 0.*inside the buffer.*\\[1\\]"): run_program(strided, hole, x)

def test_input_guard_is_poisoned():
  """An out-of-bounds read sees NaN in the input's guard zone, so it shows up as a mismatch."""
  ast = _ew7()
  p = _oob_program(ast, "  for (int i = 0; i < 7; i++) data0[i] = data1[i + 1];")  # reads one past the end
  out = run_program(ast, p, {1: np.arange(7, dtype=np.float32)})[0]
  assert np.isnan(out[6]) and np.array_equal(out[:6], np.arange(1, 7))

class _DieInWorker:
  """Unpickling this in the worker kills it, like a kernel that corrupts the heap would."""
  def __reduce__(self): return (os._exit, (7,))

def test_isolated_runner_survives_a_crashing_kernel():
  """A kernel that kills its process kills the worker, not the test: the call raises KernelCrash
  (a failure of kind "crash" in the fuzzer) and the next call gets a fresh worker."""
  e = ENTRIES["ew_7"]
  x = entry_inputs(e)
  with IsolatedRunner() as r:
    assert np.allclose(r.run(e, [], x, "CPU", 0)[0], e.reference(x, {})[0])
    with pytest.raises(KernelCrash, match="died.*exited with code 7"): r.run(e, [], {1: _DieInWorker(), 2: x[2]}, "CPU", 0)
    assert np.allclose(r.run(e, [], x, "CPU", 0)[0], e.reference(x, {})[0])
  assert not r.pool.workers  # closed on exit

def _corrupt_unrolled(monkeypatch):
  """Break the compiler on purpose: programs of kernels with an UNROLL opt add 1 to output 0 at the end."""
  orig = Kernel.to_program
  def to_program(self: Kernel, name_override=None):
    p = orig(self, name_override)
    if any(o.op is OptOps.UNROLL for o in self.applied_opts):
      body = p.src.rstrip()
      assert body.endswith("}")
      p = dataclasses.replace(p, src=body[:-1] + f"  data0[{fuzz.FRONT_GUARD}] = data0[{fuzz.FRONT_GUARD}] + 1.0f;\n}}\n// corrupted\n")
    return p
  monkeypatch.setattr(Kernel, "to_program", to_program)
  monkeypatch.setattr(fuzz, "_program_cache", type(fuzz._program_cache)())

def test_fuzzer_catches_a_wrong_kernel_and_shrinks_it(monkeypatch):
  _corrupt_unrolled(monkeypatch)
  e = ENTRIES["matmul_16x16x16"]
  rep = fuzz_entry(e, 25, "CPU", seed=1)
  assert not rep.ok and rep.pairs > 0
  ff = rep.first_failure
  assert ff.kind == "mismatch" and ff.name == "matmul_16x16x16" and any(o.op is OptOps.UNROLL for o in ff.opts)
  assert ff.minimal_opts is not None and len(ff.minimal_opts) == 1 and ff.minimal_opts[0].op is OptOps.UNROLL, ff
  # every failure has an UNROLL, and every sequence without one passed
  assert all(any(o.op is OptOps.UNROLL for o in f.opts) for f in rep.failures)

def test_shrink_removes_innocent_opts(monkeypatch):
  _corrupt_unrolled(monkeypatch)
  e = ENTRIES["matmul_16x16x16"]
  opts = [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 2), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.UPCAST, 0, 2)]
  assert check_opts(e, opts, entry_inputs(e)) is not None
  assert shrink(e, opts) == [Opt(OptOps.UNROLL, 0, 4)]
  assert shrink(e, [Opt(OptOps.UPCAST, 0, 4)]) == [Opt(OptOps.UPCAST, 0, 4)]  # a passing list is returned as is

def test_exceptions_are_failures_not_refusals(monkeypatch):
  """Anything but KernelOptError while rendering/compiling/running counts as a failure."""
  orig = Kernel.to_program
  def to_program(self: Kernel, name_override=None):
    if self.upcasted >= 2: raise IndexError("lowering bug")
    return orig(self, name_override)
  monkeypatch.setattr(Kernel, "to_program", to_program)
  monkeypatch.setattr(fuzz, "_program_cache", type(fuzz._program_cache)())
  e = ENTRIES["matmul_16x16x16"]
  rep = fuzz_entry(e, 30, "CPU", seed=2)
  kinds = {f.kind for f in rep.failures}
  assert kinds == {"exception"} and "IndexError: lowering bug" in rep.first_failure.message
  assert len(rep.first_failure.minimal_opts) == 2

def test_apply_opt_crash_is_a_failure(monkeypatch):
  """An apply_opt that raises something other than KernelOptError is reported, with the opt."""
  orig = Kernel.shift_to
  def shift_to(self, axis, amount, top=False, insert_before=None):
    if amount == 3: raise RuntimeError("shift_to bug")
    return orig(self, axis, amount, top, insert_before)
  monkeypatch.setattr(Kernel, "shift_to", shift_to)
  e = ENTRIES["sum_axis1_5x7x9"]  # its 9 and 7... axes: amount 3 divides 9
  _, _, fails = sample_opt_sequences(e, np.random.default_rng(0), 40)
  assert fails and all(f.kind == "exception" and "shift_to bug" in f.message and f.opts[-1].amt == 3 for f in fails)

def test_fuzz_is_reproducible():
  e = ENTRIES["sum_axis02_5x7x9"]
  a = sample_opt_sequences(e, fuzz._seeded(0, e.name, "opts"), 15)[0]
  b = sample_opt_sequences(e, fuzz._seeded(0, e.name, "opts"), 15)[0]
  assert [list(s) for s in a] == [list(s) for s in b] and len(a) == 15

# ---- the fuzz runs -------------------------------------------------------------------------------

N_PER_KERNEL = 16   # x the corpus: >= 1,250 distinct (kernel, opt sequence) pairs on CPU (checked below; the
                    # masked kernels get 5 CPU_ARCHs more in tests/testing/test_fuzz_cpu_archs.py; the slow tier 5,000+)
N_PER_KERNEL_GPU = 3  # PoCL compiles take 0.3-3 s each: OPENCL is most of this test's cold-cache time (slow tier: 4,000+ pairs)
N_PER_KERNEL_LLVM = 8  # >= 650 pairs on LLVM (its O3 pipeline takes ~80 ms a kernel and can't batch; the masked
                       # kernels get 5 CPU_ARCHs more in test_fuzz_cpu_archs.py, the slow tier 4,000+ pairs)
MIN_PAIRS = {"CPU": 1250, "LLVM": 650}

def _params(n_cpu: int, n_gpu: int) -> list:
  return [pytest.param(name, d, n_cpu if d == "CPU" else N_PER_KERNEL_LLVM if d == "LLVM" else n_gpu, id=f"{d}-{name}",
                       marks=[pytest.mark.xfail(strict=True, reason=r)] if (r := known_bug(name, d, "fuzz")) else [])
          for d in DEVICES for name in ENTRIES]

@pytest.mark.fuzz
@pytest.mark.parametrize("name,device,n", _params(N_PER_KERNEL, N_PER_KERNEL_GPU))
def test_fuzz_corpus_entry(name: str, device: str, n: int, iso: IsolatedRunner):
  rep = fuzz_entry(ENTRIES[name], n, device, seed=0, isolated=iso)
  assert rep.ok, f"{name} on {device}: {rep.summary()}"

@pytest.mark.parametrize("device,n", [("CPU", N_PER_KERNEL), ("LLVM", N_PER_KERNEL_LLVM)])
def test_fuzz_default_tier_covers_enough_pairs(device: str, n: int):
  """The per-entry runs above sample their opt sequences from generators seeded by (0, entry name),
  so their pair counts are known without compiling: together they must reach MIN_PAIRS[device]."""
  total = 0
  for e in ENTRIES.values():
    if known_bug(e.name, device, "fuzz"): continue  # expected to fail: its pairs don't count
    seqs, _, _ = sample_opt_sequences(e, fuzz._seeded(0, e.name, "opts"), n, device)
    total += len(seqs)
  assert total >= MIN_PAIRS[device], f"only {total} distinct (kernel, opts) pairs on {device}; raise its N_PER_KERNEL"

@pytest.mark.slow
@pytest.mark.fuzz
@pytest.mark.parametrize("device", DEVICES)
def test_fuzz_big_corpus(device: str):
  with IsolatedRunner(small=False) as big:
    # PoCL compiles take ~0.7 s each: 50 sequences per kernel (4,029 pairs) take ~10 minutes there
    n, min_pairs = (100, 5000) if device == "CPU" else (50, 4000)
    reps = {name: fuzz_entry(e, n, device, seed=1, isolated=big, max_opts=6, max_lanes=1024) for name, e in corpus(small=False).items()
            if not known_bug(name, device, "fuzz")}
  total = FuzzReport()
  for r in reps.values(): total = total.merge(r)
  bad = {n: r for n, r in reps.items() if not r.ok}
  assert not bad, "\n".join(f"{n}: {r.summary()}" for n, r in list(bad.items())[:5])
  assert total.pairs >= min_pairs

def test_program_cache_keys_on_render_settings() -> None:
  """A program rendered under one setting the renderer reads (CPU_STREAM_MIN_BYTES here; CPU_ARCH
  likewise) is not handed out under another: the renderer's settings_key is part of the key."""
  from tilecraft.ops import MetaOps
  a, b = Tensor(np.ones(4096, np.float32)).realize(), Tensor(np.ones(4096, np.float32)).realize()
  ast = next(si.ast for si in (a + b).schedule() if si.ast.op is MetaOps.KERNEL)
  opts = [Opt(OptOps.UPCAST, 0, 8)]
  plain = get_program(ast, opts)
  with Context(CPU_STREAM_MIN_BYTES=0): streamed = get_program(ast, opts)
  assert "stream" not in plain.src and "stream" in streamed.src
  assert get_program(ast, opts) is plain

# ---- recorded kernels (fuzz_recorded, `tilecraft fuzz --replay`) -----------------------------------

def _model_kernels() -> dict[str, LazyOp]:
  """Kernels shaped like a model's: a 1x1 conv with a residual and relu at 7x7, a 3x3 stride-2 conv, a max
  pool, a matmul against weights in column panels with a bias."""
  from tilecraft.frontend.panels import panel_matmul
  from tilecraft.ops import MetaOps
  rng = np.random.default_rng(0)
  def t(*shape: int) -> Tensor: return Tensor(rng.standard_normal(shape).astype(np.float32)).realize()
  x7, r7 = t(1, 64, 7, 7), t(1, 32, 7, 7)
  exprs = {"conv1x1_residual": (x7.conv2d(t(32, 64, 1, 1)) + r7).relu(), "conv3x3_s2": t(1, 16, 15, 15).conv2d(t(32, 16, 3, 3), stride=2, padding=1),
           "maxpool": t(1, 16, 13, 13).max_pool2d(3, 2), "panel_matmul": panel_matmul(t(24, 96), t(4, 96, 16)) + t(64)}
  return {name: next(si.ast for si in e.schedule() if si.ast.op is MetaOps.KERNEL) for name, e in exprs.items()}

@pytest.fixture(scope="module")
def recorded_db(tmp_path_factory):
  """A process-replay DB of the model-shaped kernels above, each with its hand-coded opts."""
  db = str(tmp_path_factory.mktemp("replay") / "replay.db")
  with pytest.MonkeyPatch.context() as m:
    m.setenv("REPLAY_DB", db)
    m.setenv("RUN_PROCESS_REPLAY", "1")
    for name, ast in _model_kernels().items(): Kernel(ast, opts=Device["CPU"].renderer).hand_coded_optimizations().to_program(name_override=f"rec_{name}")
  return db

def test_fuzz_recorded_checks_recorded_and_random_opts(recorded_db):
  kernels = fuzz.recorded_kernels(recorded_db, "CPU")
  assert sorted(n for n, _ in kernels) == sorted(f"rec_{n}" for n in _model_kernels())
  assert fuzz.recorded_kernels(recorded_db, "LLVM") == []
  e, opts = fuzz.recorded_entry(recorded_db, kernels[0][1])
  assert e.reference is None and e.atol_scaled and opts  # (differential only; the heuristics chose opts for each)
  reps = fuzz.fuzz_recorded(recorded_db, "CPU", n=3)
  assert set(reps) == {n for n, _ in kernels} and all(r.ok for r in reps.values()), {n: r.summary() for n, r in reps.items()}
  assert all(r.pairs >= 2 for r in reps.values())  # the recorded opts and random ones
  assert set(fuzz.fuzz_recorded(recorded_db, "CPU", n=0, names=["maxpool"])) == {"rec_maxpool"}

def test_fuzz_recorded_catches_wrong_recorded_opts(recorded_db, monkeypatch):
  """A compiler that breaks every kernel with an UPCAST: each recorded kernel's own opts (all upcast) fail."""
  orig = Kernel.to_program
  def to_program(self: Kernel, name_override=None):
    p = orig(self, name_override)
    if any(o.op is OptOps.UPCAST for o in self.applied_opts):
      body = p.src.rstrip()
      p = dataclasses.replace(p, src=body[:-1] + f"  data0[{fuzz.FRONT_GUARD}] = data0[{fuzz.FRONT_GUARD}] * 2.0f + 1.0f;\n}}\n// corrupted\n")
    return p
  monkeypatch.setattr(Kernel, "to_program", to_program)
  monkeypatch.setattr(fuzz, "_program_cache", type(fuzz._program_cache)())
  monkeypatch.setattr(fuzz, "_runner_cache", type(fuzz._runner_cache)())
  reps = fuzz.fuzz_recorded(recorded_db, "CPU", n=0, isolate=False)
  assert reps and all(not r.ok and r.first_failure.kind == "mismatch" and "(the given opts)" in r.first_failure.message for r in reps.values())
  # (shrunk: each minimal list keeps an UPCAST, what breaks them, and the lists get shorter)
  recorded = {n: fuzz.recorded_entry(recorded_db, k, n)[1] for n, k in fuzz.recorded_kernels(recorded_db, "CPU")}
  assert all(any(o.op is OptOps.UPCAST for o in r.first_failure.minimal_opts) for r in reps.values())
  assert sum(len(r.first_failure.minimal_opts) for r in reps.values()) < sum(len(o) for o in recorded.values())

def test_scaled_tolerance_passes_rounding_and_catches_wrong_elements():
  """atol_scaled: an error far below the output's scale passes even on a result near 0 (cancellation in a long
  reduce), an element off by the output's scale fails."""
  ast = kernel(store(0, dtypes.float32, ST((4,)), ld(1, dtypes.float32, ST((4,)))))
  want = [np.array([100.0, -50.0, 0.001, 3.0], np.float32)]
  near = [want[0] + np.array([0, 0, 0.004, 0], np.float32)]  # 4x the result, 4e-5 of the scale
  assert fuzz.compare_outputs(near, want, ast) is not None and fuzz.compare_outputs(near, want, ast, atol=2e-4, atol_scaled=True) is None
  wrong = [want[0] + np.array([0, 0, 1.0, 0], np.float32)]
  assert fuzz.compare_outputs(wrong, want, ast, atol=2e-4, atol_scaled=True) is not None

def test_fuzz_cli_replay(recorded_db, capsys):
  from tilecraft.__main__ import main
  assert main(["fuzz", "--replay", recorded_db, "-n", "1", "-k", "conv", "--quiet"]) == 0
  out = capsys.readouterr().out
  assert "fuzzed 2 recorded kernels" in out and "no unexpected failures" in out
  assert main(["fuzz", "--replay", recorded_db, "--list"]) == 0 and "rec_maxpool" in capsys.readouterr().out
  assert main(["fuzz", "--replay", recorded_db + ".missing"]) == 2 and "no process-replay DB" in capsys.readouterr().err
