"""The PYTHON device (runtime/python.py, runtime/emulate.py): UOps executed with GPU semantics.

Semantics are checked three ways: against numpy, against the CPU device running the same kernel
(the C renderer defines what each op means: the emulator must agree bit for bit where C is
deterministic), and with hand-built UOp programs for what kernels rarely reach (C's truncating
division, races, missing barriers, out-of-bounds access). Then the differential opt fuzzer runs
the corpus on the emulator under every EMULATE target."""
import numpy as np
import pytest
from tilecraft.codegen.kernel import Kernel, Opt, OptOps
from tilecraft.codegen.linearize import linearize_uops
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.device import Buffer, CompileError, CompiledRunner, Device
from tilecraft.dtype import DType, dtypes
from tilecraft.testing import fuzz
from tilecraft.testing.corpus import ST, alu, cast, corpus, kernel, known_bug, ld, store
from tilecraft.helpers import Context
from tilecraft.ops import BinaryOps
from tilecraft.renderer import Program
from tilecraft.runtime.emulate import HANDLERS, EmulatorError, OutOfBoundsError
from tilecraft.runtime.python import PythonRenderer, instructions, parse_listing, render_listing

ENTRIES = corpus()
I32 = dtypes.int32

# ---- hand-built programs ---------------------------------------------------------------------------

def g(i: int, dt: DType) -> UOp: return UOp(UOps.DEFINE_GLOBAL, dt.ptr(), (), i)
def c(v, dt: DType = I32) -> UOp: return UOp.const(dt, v)
def gid(n: int, kind: str = "group", dim: int = 0) -> UOp: return UOp(UOps.SPECIAL, I32, (), (f"{'gidx' if kind != 'local' else 'lidx'}{dim}", n, dim, kind))
def load(buf: UOp, idx: UOp, dt: DType, *extra: UOp) -> UOp: return UOp(UOps.LOAD, dt, (buf, idx) + extra)
def st(buf: UOp, idx: UOp, val: UOp, *gate: UOp) -> UOp: return UOp(UOps.STORE, dtypes.void, (buf, idx, val) + gate)

def run_uops(stores: list[UOp], arrays: dict[int, np.ndarray], gs: list[int], ls: list[int] = None, name: str = "handmade"):
  """Linearize, render and run hand-built stores on PYTHON; arrays[i] is copied into buffer i (outputs too)."""
  uops = linearize_uops(UOp(UOps.SINK, dtypes.void, tuple(stores)))
  p = Program(name, render_listing(name, uops), "PYTHON", gs, ls, uops, [], sorted(arrays), [0])
  bufs = [Buffer("PYTHON", a.size, dtypes.from_np(a.dtype)).copyin(a) for _, a in sorted(arrays.items())]
  CompiledRunner(p)(bufs)
  return [b.numpy() for b in bufs]

def binop_program(op, dt: DType, a: np.ndarray, b: np.ndarray) -> np.ndarray:
  n = a.size
  i = gid(n)
  out_dt = dtypes.bool if op in (BinaryOps.CMPLT, BinaryOps.CMPNE) else dt
  v = UOp.alu(op, load(g(1, dt), i, dt), load(g(2, dt), i, dt))
  return run_uops([st(g(0, out_dt), i, v)], {0: np.zeros(n, out_dt.np), 1: a, 2: b}, [n])[0]

# ---- the device ------------------------------------------------------------------------------------

def test_device_opens_and_runs_a_tensor():
  from tilecraft import Tensor
  x = np.arange(12, dtype=np.float32).reshape(3, 4)
  t = Tensor(x, device="PYTHON")
  assert np.allclose(((t * 2 + 1).sum(axis=1)).numpy(), (x * 2 + 1).sum(axis=1))
  assert Device["python"] is Device["PYTHON"]  # opens once (Device.available() would open every device: other tests rely on some staying closed)

def test_emulate_picks_the_target_per_lookup():
  base = Device["PYTHON"].renderer
  assert isinstance(base, PythonRenderer) and base.target == "" and base.has_local and base.has_shared
  with Context(EMULATE="CUDA"):
    r = Device["PYTHON"].renderer
    assert r.target == "CUDA" and r is Device["PYTHON"].renderer  # one renderer per target: caches see a stable object
    from tilecraft.renderer.cuda import CUDARenderer
    assert isinstance(r.base, CUDARenderer) and (r.shared_max, r.local_max, r.max_threads) == (49152, (1024, 1024, 64), 1024)
    assert r.vector_dtypes == r.base.vector_dtypes and r.tensor_cores == r.base.tensor_cores
  with Context(EMULATE="AMD"): assert type(Device["PYTHON"].renderer.base).__name__ == "HIPRenderer" and Device["PYTHON"].renderer.shared_max == 65536
  with Context(EMULATE="METAL"): assert type(Device["PYTHON"].renderer.base).__name__ == "MetalRenderer"
  assert Device["PYTHON"].renderer is base
  with Context(EMULATE="VAX"), pytest.raises(ValueError, match="EMULATE='VAX'.*CUDA, METAL, AMD"): Device["PYTHON"].renderer

def test_emulated_capabilities_are_declared_renderer_fields():
  """The capabilities the PYTHON renderer takes from its target are fields Renderer declares (a name
  that isn't one would be a capability nothing reads), and each is the target's own value."""
  from tilecraft.renderer import Renderer
  from tilecraft.runtime.python import _CAPS, EMULATED_TARGETS
  assert not (undeclared := [a for a in _CAPS if a not in vars(Renderer)]), f"not Renderer fields: {undeclared}"
  for target in ("",) + EMULATED_TARGETS:
    r = PythonRenderer(target)
    assert all(getattr(r, a) == getattr(r.base, a) for a in _CAPS), target

def test_listing_round_trips():
  """The source is the listing; parsing it gives back every instruction's op, dtype, sources and arg."""
  e = ENTRIES["sum_axis1_5x7x9"]
  k = Kernel(e.ast, opts=Device["PYTHON"].renderer)
  for o in (Opt(OptOps.GROUPTOP, 0, 7), Opt(OptOps.LOCAL, 1, 3), Opt(OptOps.UPCAST, 0, 5)): k.apply_opt(o)
  p = k.to_program()
  name, ins = parse_listing(p.src)
  assert name == p.name and len(ins) == len(p.uops)
  assert ins == instructions(p.uops)  # what the renderer hands the runtime without parsing
  ref = {u: i for i, u in enumerate(p.uops)}
  for x, u in zip(ins, p.uops):
    assert (x.op, x.dtype) == (u.op, u.dtype)
    assert all(s == ref[t] for s, t in zip(x.src, [t for t in u.src if t in ref]))
    if u.op not in (UOps.SPECIAL,): assert x.arg == u.arg or (x.arg != x.arg and u.arg != u.arg)
  assert {x.op for x in ins} >= {UOps.DEFINE_LOCAL, UOps.BARRIER, UOps.SPECIAL, UOps.RANGE}
  with pytest.raises(CompileError, match="not a PYTHON kernel listing"): Device["PYTHON"].compiler.compile("int main() {}")
  bad = p.src.replace("BinaryOps.ADD", "__import__('os')", 1)
  with pytest.raises(CompileError, match="not a listing expression"): Device["PYTHON"].compiler.compile(bad)

def test_bad_instruction_is_a_compile_error():
  """An instruction the emulator can't build (here a WMMA without fragments or a tensor core) fails at compile time."""
  e = ENTRIES["ew_7"]
  p = fuzz.get_program(e.ast, [], "PYTHON")
  line = p.src.splitlines()[-1]
  n = len(p.src.splitlines()) - 1
  src = p.src + f"%{n} = WMMA dtypes.float () None\n"
  with pytest.raises(CompileError, match="WMMA at .* takes A, B and C|no valid tensor core"): Device["PYTHON"].compiler.compile(src)
  assert line.startswith(f"%{n - 1} = STORE")

# ---- ALU semantics ---------------------------------------------------------------------------------

INT_DTS = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64]
FLOAT_DTS = [dtypes.float16, dtypes.float32, dtypes.float64]

def _values(dt: DType, rng: np.random.Generator, n: int = 64) -> np.ndarray:
  if dt == dtypes.bool: return rng.integers(0, 2, n).astype(np.bool_)
  if dtypes.is_float(dt):
    x = rng.uniform(-100, 100, n).astype(dt.np)
    x[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0]
    return x
  info = np.iinfo(dt.np)
  x = rng.integers(info.min, int(info.max) + 1, n, dtype=np.int64 if info.min < 0 else np.uint64).astype(dt.np)
  x[:5] = [info.min, info.max, 0, 1, info.max - 1]
  return x

_AST_BINOPS = [BinaryOps.ADD, BinaryOps.SUB, BinaryOps.MUL, BinaryOps.MAX, BinaryOps.CMPLT, BinaryOps.CMPNE, BinaryOps.IDIV, BinaryOps.MOD,
               BinaryOps.XOR, BinaryOps.OR, BinaryOps.AND]

def _ast_binop(op, dt: DType, n: int):
  out = dtypes.bool if op in (BinaryOps.CMPLT, BinaryOps.CMPNE) else dt
  return kernel(store(0, out, ST((n,)), alu(op, ld(1, dt, ST((n,))), ld(2, dt, ST((n,))))))

@pytest.mark.parametrize("dt", INT_DTS + FLOAT_DTS + [dtypes.bool], ids=lambda d: d.name)
def test_binary_ops_match_cpu_bit_for_bit(dt: DType, rng):
  """Every binary op the dtype has, on the C path (CPU) and on the emulator, with edge values:
  wrap-around, min // -1, division by zero, NaN, infinities, signed zeros."""
  n = 64
  a, b = _values(dt, rng, n), _values(dt, rng, n)
  b[-8:] = a[-8:]
  if dtypes.is_int(dt): b[5:9] = [0, 0, 1, (-1 if dtypes.is_unsigned(dt) is False else 2)]
  ops = [o for o in _AST_BINOPS if not (dtypes.is_float(dt) and o in (BinaryOps.IDIV, BinaryOps.MOD, BinaryOps.XOR, BinaryOps.OR, BinaryOps.AND))]
  if dt == dtypes.bool: ops = [BinaryOps.ADD, BinaryOps.MUL, BinaryOps.MAX, BinaryOps.CMPLT, BinaryOps.CMPNE, BinaryOps.XOR, BinaryOps.OR, BinaryOps.AND]
  for op in ops:
    ast = _ast_binop(op, dt, n)
    inputs = {1: a, 2: b}
    want = fuzz.run_ast(ast, inputs, [], "CPU")[0]
    got = fuzz.run_ast(ast, inputs, [], "PYTHON")[0]
    assert got.dtype == want.dtype
    same = (got == want) | ((got != got) & (want != want)) if dtypes.is_float(dt) else got == want
    assert same.all(), f"{op} {dt.name}: {a[~same][:4]} {b[~same][:4]} -> emulator {got[~same][:4]}, C {want[~same][:4]}"

@pytest.mark.parametrize("dt", INT_DTS, ids=lambda d: d.name)
def test_ints_wrap_and_divide_like_numpy(dt: DType, rng):
  a, b = _values(dt, rng), _values(dt, rng)
  b[5:7] = [0, 1]
  with np.errstate(all="ignore"):
    assert np.array_equal(binop_program(BinaryOps.ADD, dt, a, b), a + b)
    assert np.array_equal(binop_program(BinaryOps.MUL, dt, a, b), a * b)
    assert np.array_equal(binop_program(BinaryOps.SUB, dt, a, b), a - b)
    # the AST's floor division (numpy's, 0 for x // 0), built by the lowering from C's truncating IDIV/MOD
    out = fuzz.run_ast(_ast_binop(BinaryOps.IDIV, dt, a.size), {1: a, 2: b}, [], "PYTHON")[0]
    assert np.array_equal(out, np.where(b == 0, 0, a // np.where(b == 0, 1, b)).astype(dt.np))

def test_uop_idiv_mod_truncate_like_c():
  a = np.array([7, -7, 7, -7, 0, 5, -2**31, 3], np.int32)
  b = np.array([2, 2, -2, -2, 3, 0, 7, 7], np.int32)
  q, r = binop_program(BinaryOps.IDIV, I32, a, b), binop_program(BinaryOps.MOD, I32, a, b)
  assert q.tolist() == [3, -3, -3, 3, 0, 0, -306783378, 0]
  assert r.tolist() == [1, -1, 1, -1, 0, 0, -2, 3]

def test_narrow_int_wrap():
  a = np.array([100, 127, -128, 50], np.int8)
  assert binop_program(BinaryOps.ADD, dtypes.int8, a, a).tolist() == [-56, -2, 0, 100]
  u = np.array([200, 255, 16, 0], np.uint8)
  assert binop_program(BinaryOps.MUL, dtypes.uint8, u, u).tolist() == [64, 1, 0, 0]
  assert binop_program(BinaryOps.SUB, dtypes.uint8, np.zeros(4, np.uint8), u).tolist() == [56, 1, 240, 0]

def test_half_rounds_after_every_op():
  """2048 + 1 is 2048 in float16: a chain of adds must not keep float32 precision in between."""
  x = np.full(4, 2048, np.float16)
  one = np.ones(4, np.float16)
  i = gid(4)
  v = load(g(1, dtypes.half), i, dtypes.half)
  o = load(g(2, dtypes.half), i, dtypes.half)
  chain = UOp.alu(BinaryOps.ADD, UOp.alu(BinaryOps.ADD, v, o), o)  # (2048 + 1) + 1 = 2048 in half, 2050 in float
  out = run_uops([st(g(0, dtypes.half), i, chain)], {0: np.zeros(4, np.float16), 1: x, 2: one}, [4])[0]
  assert out.tolist() == [2048.0] * 4
  assert binop_program(BinaryOps.MUL, dtypes.half, np.array([300.0], np.float16), np.array([300.0], np.float16))[0] == np.inf

def test_casts_match_cpu(rng):
  """Casts between every pair of dtypes (in-range values), bfloat16 rounding included, agree with the C path."""
  n = 32
  dts = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]
  for src in dts:
    x = np.concatenate([rng.uniform(0, 100, n - 4), [0.5, 1.5, 2.5, 100.499]]).astype(np.float32)
    if src == dtypes.bool: x = (x > 50).astype(np.float32)
    outs = [store(i, d, ST((n,)), cast(ld(len(dts), src, ST((n,))), d)) for i, d in enumerate(dts)]
    ast = kernel(*outs)
    arr = x.astype(src.np) if src.np is not None else x
    if src == dtypes.bfloat16:
      from tilecraft.testing.corpus import bf16
      arr = bf16(x)
    got = fuzz.run_ast(ast, {len(dts): arr}, [], "PYTHON")
    want = fuzz.run_ast(ast, {len(dts): arr}, [], "CPU")
    for d, a_, b_ in zip(dts, got, want): assert np.array_equal(a_, b_), f"cast {src.name} -> {d.name}: {arr[:6]} -> {a_[:6]} vs C {b_[:6]}"

def test_bfloat16_cast_rounds_to_nearest_even():
  from tilecraft.dtype import bf16_bits_from_f32
  x = np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8, np.nan, 3.4e38, -0.0, 1.0 + 2**-9], np.float32)  # ties, NaN, overflow to inf
  i = gid(x.size)
  v = UOp(UOps.CAST, dtypes.bfloat16, (load(g(1, dtypes.float32), i, dtypes.float32),))
  out = run_uops([st(g(0, dtypes.bfloat16), i, v)], {0: np.zeros(x.size, np.uint16), 1: x}, [x.size])[0]
  assert out.tolist() == bf16_bits_from_f32(x).tolist()  # the output buffer is uint16: the bits
  assert out[0] == 0x3F80 and out[1] == 0x3F82 and out[3] == 0x7F80 and out[4] == 0x8000 and out[5] == 0x3F80

# ---- memory, barriers, control -----------------------------------------------------------------------------

def test_out_of_bounds_load_and_store_name_the_buffer():
  i = gid(8)
  v = load(g(1, dtypes.float32), UOp.alu(BinaryOps.ADD, i, c(1)), dtypes.float32)
  with pytest.raises(OutOfBoundsError, match=r"load of data1 \(8 float elements\): index 8 .*group 7 thread 0"):
    run_uops([st(g(0, dtypes.float32), i, v)], {0: np.zeros(8, np.float32), 1: np.ones(8, np.float32)}, [8])
  with pytest.raises(OutOfBoundsError, match=r"store of data0 \(8 float elements\): index -1, 8 \(by 2 thread"):
    run_uops([st(g(0, dtypes.float32), UOp.alu(BinaryOps.ADD, UOp.alu(BinaryOps.MUL, i, c(9)), c(-1)), c(1.0, dtypes.float32))],
             {0: np.zeros(8, np.float32)}, [2])
  # gated off lanes don't access memory: no error, the alternative value is used
  gate = UOp.alu(BinaryOps.CMPLT, i, c(7))
  gl = load(g(1, dtypes.float32), UOp.alu(BinaryOps.ADD, i, c(1)), dtypes.float32, gate, c(-5.0, dtypes.float32))
  out = run_uops([st(g(0, dtypes.float32), i, gl)], {0: np.zeros(8, np.float32), 1: np.arange(8, dtype=np.float32)}, [8])[0]
  assert out.tolist() == [1, 2, 3, 4, 5, 6, 7, -5]

def test_gated_stores_and_vectors():
  i = gid(4)
  f4 = dtypes.float32.vec(4)
  base = UOp.alu(BinaryOps.MUL, i, c(4))
  v = load(g(1, dtypes.float32), base, f4)
  doubled = UOp.alu(BinaryOps.ADD, v, v)
  swapped = UOp(UOps.VECTORIZE, f4, tuple(doubled.gep(k) for k in (3, 2, 1, 0)))
  gate = UOp.alu(BinaryOps.CMPNE, i, c(2))
  x = np.arange(16, dtype=np.float32)
  out = run_uops([st(g(0, dtypes.float32), base, swapped, gate)], {0: np.full(16, -1, np.float32), 1: x}, [4])[0]
  want = (2 * x).reshape(4, 4)[:, ::-1].copy()
  want[2] = -1
  assert out.tolist() == want.reshape(-1).tolist()

def _local_program(barrier: bool, gate_barrier: bool = False, skip_write: bool = False):
  """Each thread writes its id to local memory, then reads its neighbour's."""
  n = 8
  lid = gid(n, "local")
  loc = UOp(UOps.DEFINE_LOCAL, dtypes.float32.ptr(local=True), (), ("temp1", n))
  val = UOp(UOps.CAST, dtypes.float32, (lid,))
  w = UOp.alu(BinaryOps.MOD, UOp.alu(BinaryOps.ADD, lid, c(1)), c(n))
  s = st(loc, lid, val, UOp.alu(BinaryOps.CMPNE, lid, c(3))) if skip_write else st(loc, lid, val)
  extra = (UOp(UOps.BARRIER, dtypes.void, (s,)),) if barrier else (s,)
  r = load(loc, w, dtypes.float32, *extra)
  return run_uops([st(g(0, dtypes.float32), lid, r)], {0: np.zeros(n, np.float32)}, [1], [n])[0]

def test_local_memory_and_barriers():
  assert _local_program(True).tolist() == [1, 2, 3, 4, 5, 6, 7, 0]
  with pytest.raises(EmulatorError, match="temp1 written by another thread since the last barrier"): _local_program(False)
  with pytest.raises(EmulatorError, match="temp1 that no thread of the workgroup wrote"): _local_program(True, skip_write=True)

def test_grouped_reduces_on_every_target(rng):
  """GROUP/GROUPTOP reduce through local memory and a barrier, on each target's limits."""
  e = ENTRIES["sum_axis1_5x7x9"]
  x = fuzz.entry_inputs(e)
  for t in ("", "CUDA", "METAL", "AMD"):
    with Context(EMULATE=t):
      for opts in ([Opt(OptOps.GROUP, 0, 7)], [Opt(OptOps.GROUPTOP, 0, 7), Opt(OptOps.LOCAL, 1, 3)], [Opt(OptOps.LOCAL, 1, 9), Opt(OptOps.GROUP, 0, 7)]):
        p = fuzz.get_program(e.ast, opts, "PYTHON")
        assert any(u.op is UOps.BARRIER for u in p.uops) and any(u.op is UOps.DEFINE_LOCAL for u in p.uops)
        out = fuzz.run_program(e.ast, p, x, "PYTHON")
        assert fuzz.compare_outputs(out, e.reference(x, {}), e.ast) is None, (t, opts)

def test_race_and_launch_limits():
  i = gid(4)
  with pytest.raises(EmulatorError, match="different values to data0\\[0\\]"):
    run_uops([st(g(0, I32), c(0), i)], {0: np.zeros(4, np.int32)}, [4])
  run_uops([st(g(0, I32), c(0), c(5))], {0: np.zeros(4, np.int32)}, [4])  # the same value from every thread is fine
  with Context(EMULATE="CUDA"):
    e = ENTRIES["ew_25"]
    p = fuzz.get_program(e.ast, [Opt(OptOps.LOCAL, 0, 25)], "PYTHON")
  big = Program(p.name, p.src, "PYTHON", [1], [2048], p.uops, p.vars, p.globals, p.outs)
  bufs = [Buffer("PYTHON", 25, dtypes.float32).allocate() for _ in p.globals]
  with pytest.raises(EmulatorError, match="local dim 0 is 2048, the target allows 1024"): CompiledRunner(big)(bufs)

def test_symbolic_variables():
  e = ENTRIES["sym_reduce_4xn"]
  x = fuzz.entry_inputs(e)
  for vv in e.var_vals:
    for opts in ([], [Opt(OptOps.LOCAL, 0, 2)], [Opt(OptOps.NOLOCALS)]):
      out = fuzz.run_ast(e.ast, x, opts, "PYTHON", vv)
      assert fuzz.compare_outputs(out, e.reference(x, vv), e.ast) is None, (vv, opts)
  v = next(iter(e.var_vals[0]))
  p = fuzz.get_program(e.ast, [], "PYTHON")
  bufs = [Buffer("PYTHON", 64, dtypes.float32).allocate() for _ in p.globals]
  with pytest.raises(EmulatorError, match=f"Variable {v.expr}={v.vmax + 1} is outside its range"):
    CompiledRunner(p)(bufs, {v: v.vmax + 1})

# ---- the differential fuzzer on every emulated target ----------------------------------------------------

TARGETS = ("", "CUDA", "METAL", "AMD")
MIN_PAIRS = 1400
MAX_SERIAL = 8192  # loop iterations per thread in the unoptimized kernel the emulator runs in python

def _serial_iterations(p: Program) -> int:
  """Loop iterations one thread runs (nested loops multiply; symbolic trip counts at their maximum)."""
  from tilecraft.codegen.uop_bounds import bound
  total, stack, mult = 0, [], 1
  for u in p.uops:
    if u.op is UOps.RANGE:
      stack.append(mult)
      mult *= max(0, bound(u.src[1]).vmax - bound(u.src[0]).vmin)
      total += mult
    elif u.op is UOps.ENDRANGE: mult = stack.pop()
  return total

def _fuzz_entries() -> list[str]:
  """Corpus entries whose unoptimized kernel loops at most MAX_SERIAL times (sum_1d_50257 loops 50,257
  times on one thread: seconds per run here; the CPU and OPENCL fuzz cover it)."""
  return [n for n, e in ENTRIES.items() if _serial_iterations(fuzz.get_program(e.ast, [], "PYTHON")) <= MAX_SERIAL]


@pytest.mark.fuzz
@pytest.mark.parametrize("target,more", [(t, False) for t in TARGETS] + [pytest.param(t, True, marks=pytest.mark.slow) for t in TARGETS],
                         ids=lambda v: (v or "generic") if isinstance(v, str) else ("more" if v else "default"))
def test_fuzz_corpus_on_emulator(target: str, more: bool, monkeypatch):
  """>= 1,400 (kernel, opt sequence) pairs over the four targets; the seeds and counts are the ones the
  CUDA/HIP compile checks (tests/renderer/test_gpu_compile.py) compile the same kernels with. The slow
  tier adds 15 sequences per kernel from other seeds (>= 4,000 pairs)."""
  from tilecraft.testing.gpu_compile import EMULATOR_FUZZ
  seed, n = EMULATOR_FUZZ[target]
  if more: seed, n = seed + 100, 15
  total, ops = fuzz.FuzzReport(), set()
  sample = fuzz.sample_opt_sequences
  def recording(*a, **kw):
    seqs, refusals, fails = sample(*a, **kw)
    ops.update(o.op for s in seqs for o in s)
    return seqs, refusals, fails
  monkeypatch.setattr(fuzz, "sample_opt_sequences", recording)
  # TC opts (targets with tensor cores) run the real WMMA once the emulator has a WMMA handler
  # (issue 12); until then TC=2: the same layouts and opts with a plain MUL/SUM
  with Context(EMULATE=target, TC=1 if UOps.WMMA in HANDLERS else 2):
    for name in _fuzz_entries():
      if known_bug(name, "PYTHON", "fuzz"): continue
      rep = fuzz.fuzz_entry(ENTRIES[name], n, "PYTHON", seed=seed)
      assert rep.ok, f"{name} on PYTHON EMULATE={target}: {rep.summary()}"
      total = total.merge(rep)
    # the corpus's matmuls are float32: only targets with a float32 tensor core (Metal) take TC opts
    has_tc = any(tc.dtype_in == dtypes.float32 for tc in Device["PYTHON"].renderer.tensor_cores)
  assert ops >= {OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.NOLOCALS, OptOps.PADTO, OptOps.UPCAST, OptOps.UNROLL} | ({OptOps.TC} if has_tc else set())
  assert total.pairs >= (MIN_PAIRS if not more else 4000) // len(TARGETS), total.summary()
