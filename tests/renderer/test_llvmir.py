"""The LLVM IR renderer (tilecraft.renderer.llvmir) against numpy: every ALU op on every dtype it
applies to, edge values (NaN, inf, -0.0, integer extremes, x//0, MIN//-1), every cast between
dtypes, vector lanes (and the vector exp2), Variables, reduces, and the IR's semantics flags
(no nsw/nuw, only `contract`). Kernels hold many outputs each, so a table is one compile."""
from __future__ import annotations
import itertools, platform, re
from typing import Any
import numpy as np
import pytest
from tilecraft import Context, Tensor
from tilecraft.codegen.kernel import Kernel, Opt, OptOps
from tilecraft.device import Device
from tilecraft.dtype import DType, dtypes
from tilecraft.testing.corpus import ST, alu, bf16, cast, const, kernel, ld, np_floordiv, np_mod, red, store
from tilecraft.testing.fuzz import get_program, run_ast
from tilecraft.ops import BinaryOps, LazyOp, ReduceOps, TernaryOps, UnaryOps
from tilecraft.shape.symbolic import Variable

pytestmark = pytest.mark.skipif(__import__("importlib").util.find_spec("llvmlite") is None, reason="llvmlite is not installed")

INTS = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64]
FLOATS = [dtypes.float16, dtypes.float32, dtypes.float64]

def run(ast: LazyOp, inputs: dict[int, np.ndarray], opts: tuple = (), var_vals: Any = None) -> list[np.ndarray]:
  return run_ast(ast, inputs, list(opts), "LLVM", var_vals)

def same(got: np.ndarray, want: np.ndarray, dt: DType, what: str) -> None:
  got, want = np.asarray(got).reshape(-1), np.asarray(want).reshape(-1)
  if dtypes.is_float(dt):
    tol = {dtypes.float16: 1e-3, dtypes.bfloat16: 1e-2, dtypes.float32: 1e-6, dtypes.float64: 1e-13}[dt]
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol, equal_nan=True, err_msg=what)
    # -0.0 and 0.0 must not be confused (MAX of +-0 returns either, in C as in numpy)
    if not what.startswith("MAX"): assert (np.signbit(got[want == 0]) == np.signbit(want[want == 0])).all(), f"{what}: sign of zero"
  else: np.testing.assert_array_equal(got, want.astype(got.dtype), err_msg=what)

def _edge_values(dt: DType, n: int, rng: np.random.Generator) -> np.ndarray:
  if dt == dtypes.bool: return rng.integers(0, 2, n).astype(np.bool_)
  if dtypes.is_float(dt):
    special = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 0.5, -2.5, 3.0], np.float64)
    x = np.concatenate([special, rng.uniform(-8, 8, n - len(special))])
    return x.astype(np.float32) if dt == dtypes.bfloat16 else x.astype(dt.np)
  info = np.iinfo(dt.np)
  special = np.array([0, 1, info.max, info.min, info.max - 1, 2, 3, -1 if info.min < 0 else 7, -7 if info.min < 0 else 100], dtype=object)
  x = np.concatenate([special, rng.integers(max(info.min, -100), min(info.max, 100) + 1, n - len(special))])
  return x.astype(dt.np)

BIN_INT = {BinaryOps.ADD: np.add, BinaryOps.SUB: np.subtract, BinaryOps.MUL: np.multiply, BinaryOps.IDIV: np_floordiv, BinaryOps.MOD: np_mod,
           BinaryOps.MAX: np.maximum, BinaryOps.CMPLT: np.less, BinaryOps.CMPNE: np.not_equal, BinaryOps.XOR: np.bitwise_xor,
           BinaryOps.OR: np.bitwise_or, BinaryOps.AND: np.bitwise_and}
BIN_FLOAT = {BinaryOps.ADD: np.add, BinaryOps.SUB: np.subtract, BinaryOps.MUL: np.multiply, BinaryOps.MAX: np.maximum,
             BinaryOps.CMPLT: np.less, BinaryOps.CMPNE: np.not_equal}
BIN_BOOL = {BinaryOps.MAX: np.maximum, BinaryOps.CMPLT: np.less, BinaryOps.CMPNE: np.not_equal, BinaryOps.XOR: np.bitwise_xor,
            BinaryOps.OR: np.bitwise_or, BinaryOps.AND: np.bitwise_and}
UNARY_FLOAT = {UnaryOps.EXP2: np.exp2, UnaryOps.LOG2: np.log2, UnaryOps.SIN: np.sin, UnaryOps.SQRT: np.sqrt,
               UnaryOps.RECIP: np.reciprocal, UnaryOps.NEG: np.negative}

@pytest.mark.parametrize("dt", [dtypes.bool] + INTS + FLOATS, ids=lambda d: d.name)
def test_every_alu_op(dt: DType, rng: np.random.Generator):
  """Each applicable ALU op (and WHERE, MULACC-free a*b+c) on edge values and every pair of them, one kernel per dtype."""
  vals = _edge_values(dt, 24, rng)
  a_np, b_np = (np.array(list(x), dtype=vals.dtype) for x in zip(*itertools.product(vals, vals)))  # every pair
  n = a_np.size
  a, b = ld(100, dt, ST((n,))), ld(101, dt, ST((n,)))
  table = BIN_BOOL if dt == dtypes.bool else BIN_FLOAT if dtypes.is_float(dt) else BIN_INT
  outs: list[tuple[str, LazyOp, Any, DType]] = []
  for op, f in table.items():
    res_dt = dtypes.bool if op in (BinaryOps.CMPLT, BinaryOps.CMPNE) else dt
    outs.append((op.name, alu(op, a, b), f, res_dt))
  if dtypes.is_float(dt):
    for op, f in UNARY_FLOAT.items(): outs.append((op.name, alu(op, a), lambda x, y, f=f: f(x), dt))
  elif dt != dtypes.bool:
    outs.append(("NEG", alu(UnaryOps.NEG, a), lambda x, y: -x, dt))
    bits = dt.itemsize * 8
    sh = alu(BinaryOps.AND, b, const(bits - 1, dt, ST((n,))))  # shift amounts in range, as C requires
    outs.append(("SHL", alu(BinaryOps.SHL, a, sh), lambda x, y: np.left_shift(x, y & (bits - 1)), dt))
    outs.append(("SHR", alu(BinaryOps.SHR, a, sh), lambda x, y: np.right_shift(x, y & (bits - 1)), dt))
  else: outs.append(("NEG", alu(UnaryOps.NEG, a), lambda x, y: ~x, dt))
  outs.append(("WHERE", alu(TernaryOps.WHERE, alu(BinaryOps.CMPLT, a, b), a, b), lambda x, y: np.where(x < y, x, y), dt))
  ast = kernel(*[store(i, rdt, ST((n,)), o) for i, (_, o, _, rdt) in enumerate(outs)])
  got = run(ast, {100: a_np, 101: b_np})
  with np.errstate(all="ignore"):
    for (name, _, f, rdt), g in zip(outs, got): same(g, f(a_np, b_np), rdt, f"{name} on {dt.name}")

def test_bfloat16_arithmetic(rng: np.random.Generator):
  """bfloat16 is computed in float32 and rounded back (nearest even, NaN stays NaN)."""
  bf = dtypes.bfloat16
  x = bf16(_edge_values(dtypes.float32, 40, rng))
  y = bf16(rng.uniform(-4, 4, 40).astype(np.float32))
  a, b = ld(3, bf, ST((40,))), ld(4, bf, ST((40,)))
  ast = kernel(store(0, bf, ST((40,)), alu(BinaryOps.ADD, alu(BinaryOps.MUL, a, b), a)), store(1, bf, ST((40,)), alu(BinaryOps.MAX, a, b)),
               store(2, dtypes.bool, ST((40,)), alu(BinaryOps.CMPLT, a, b)))
  out = run(ast, {3: x, 4: y})
  with np.errstate(all="ignore"):
    same(out[0], bf16(bf16(x * y) + x), bf, "bf16 a*b+a")
    same(out[1], np.maximum(x, y), bf, "bf16 max")
    same(out[2], x < y, dtypes.bool, "bf16 <")

CAST_DTS = [dtypes.bool] + INTS + FLOATS + [dtypes.bfloat16]

def _cast_ref(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
  if dst == dtypes.bfloat16: return bf16(x.astype(np.float32))
  return x.astype(np.float32 if src == dtypes.bfloat16 and dst == dtypes.float32 else dst.np)

@pytest.mark.parametrize("src", CAST_DTS, ids=lambda d: d.name)
def test_casts_from(src: DType, rng: np.random.Generator):
  """src -> every dtype, on values every target holds (so C and numpy agree on each)."""
  n = 30
  if src == dtypes.bool: x = rng.integers(0, 2, n).astype(np.bool_)
  elif dtypes.is_float(src):
    x = np.concatenate([[0.0, -0.0, 1.0, 127.0, 100.5, 0.999, 3.5], rng.integers(0, 120, n - 7) + rng.choice([0.0, 0.25, 0.5], n - 7)])
    x = bf16(x.astype(np.float32)) if src == dtypes.bfloat16 else x.astype(src.np)
  else: x = np.concatenate([[0, 1, 127], rng.integers(0, 128, n - 3)]).astype(src.np)
  a = ld(50, src, ST((n,)))
  targets = [d for d in CAST_DTS if d != src]
  ast = kernel(*[store(i, d, ST((n,)), cast(a, d)) for i, d in enumerate(targets)])
  for d, g in zip(targets, run(ast, {50: x})):
    want = (x != 0) if d == dtypes.bool else _cast_ref(x.astype(np.float32) if src == dtypes.bfloat16 else x, src, d)
    same(g, want, d, f"cast {src.name} -> {d.name}")

def test_casts_wrap_like_c(rng: np.random.Generator):
  """Narrowing integer casts wrap; float -> narrow int goes through int32 as gcc does (numpy agrees on x86)."""
  x = np.array([70000, -70000, 2**31 - 1, -2**31, 255, 256, -1, 40000], np.int32)
  f = np.array([200.0, -3.7, 300.9, 65535.0, -1.0, 0.0, 127.5, 1e3], np.float32)
  a, b = ld(9, dtypes.int32, ST((8,))), ld(10, dtypes.float32, ST((8,)))
  targets = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.uint32, dtypes.uint64, dtypes.int64]
  ast = kernel(*[store(i, d, ST((8,)), cast(a, d)) for i, d in enumerate(targets)],
               store(7, dtypes.int8, ST((8,)), cast(b, dtypes.int8)), store(8, dtypes.uint8, ST((8,)), cast(b, dtypes.uint8)))
  out = run(ast, {9: x, 10: f})
  for d, g in zip(targets, out): same(g, x.astype(d.np), d, f"int32 -> {d.name}")
  same(out[7], f.astype(np.int32).astype(np.int8), dtypes.int8, "float -> int8")
  same(out[8], f.astype(np.int32).astype(np.uint8), dtypes.uint8, "float -> uint8")

def test_vector_lanes_and_vector_exp2(rng: np.random.Generator):
  """UPCAST on the contiguous axis makes LLVM vectors (<8 x float>); exp2 on them is the software
  polynomial, which must match numpy over the whole float range, NaN and infinities included."""
  n = 256
  x = np.concatenate([[0.0, -0.0, np.nan, np.inf, -np.inf, 128.0, 127.9, -126.0, -149.5, -160.0, 200.0, 0.5],
                      rng.uniform(-140, 130, n - 12)]).astype(np.float32)
  y = rng.standard_normal(n).astype(np.float32)
  a, b = ld(2, dtypes.float32, ST((n,))), ld(3, dtypes.float32, ST((n,)))
  ast = kernel(store(0, dtypes.float32, ST((n,)), alu(UnaryOps.EXP2, alu(BinaryOps.MAX, a, b))),
               store(1, dtypes.float32, ST((n,)), alu(BinaryOps.SUB, alu(BinaryOps.MUL, a, b), alu(UnaryOps.NEG, b))))
  opts = (Opt(OptOps.UPCAST, 0, 8),)
  src = get_program(ast, list(opts), "LLVM").src
  assert "<8 x float>" in src and "@tc_exp2_v8" in src and "llvm.exp2.f32" not in src
  out = run(ast, {2: x, 3: y}, opts)
  with np.errstate(all="ignore"):
    np.testing.assert_allclose(out[0], np.exp2(np.maximum(x, y)), rtol=2e-6, atol=0, equal_nan=True)
    np.testing.assert_allclose(out[1], x * y + y, rtol=1e-6, atol=1e-6, equal_nan=True)
  scalar = run(ast, {2: x, 3: y})  # the scalar kernel calls libm's exp2f
  with np.errstate(all="ignore"): np.testing.assert_allclose(scalar[0], np.exp2(np.maximum(x, y)), rtol=1e-6, equal_nan=True)

@pytest.mark.parametrize("dt", [dtypes.int32, dtypes.int64, dtypes.float64], ids=lambda d: d.name)
def test_vector_int_and_double_lanes(dt: DType, rng: np.random.Generator):
  n = 64
  x, y = _edge_values(dt, n, rng), _edge_values(dt, n, rng)[::-1].copy()
  a, b = ld(2, dt, ST((n,))), ld(3, dt, ST((n,)))
  ast = kernel(store(0, dt, ST((n,)), alu(BinaryOps.MAX, alu(BinaryOps.ADD, alu(BinaryOps.MUL, a, b), a), alu(UnaryOps.NEG, b))))
  opts = (Opt(OptOps.UPCAST, 0, 4),)
  assert f"<4 x {'double' if dt == dtypes.float64 else 'i' + str(dt.itemsize * 8)}>" in get_program(ast, list(opts), "LLVM").src
  with np.errstate(all="ignore"): same(run(ast, {2: x, 3: y}, opts)[0], np.maximum(x * y + x, -y), dt, f"vector {dt.name}")

def test_reduces_with_opts(rng: np.random.Generator):
  """Sum and max over an axis, unrolled (vector accumulators + horizontal reduce) and upcast."""
  x = rng.standard_normal((12, 40)).astype(np.float32)
  x[3, 7] = np.nan
  a = ld(2, dtypes.float32, ST((12, 40)))
  ast = kernel(store(0, dtypes.float32, ST((12, 1)), red(ReduceOps.SUM, a, (1,))), store(1, dtypes.float32, ST((12, 1)), red(ReduceOps.MAX, a, (1,))))
  for opts in [(), (Opt(OptOps.UNROLL, 0, 8),), (Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 4))]:
    s, m = run(ast, {2: x}, opts)
    np.testing.assert_allclose(s.reshape(-1), x.sum(1), rtol=1e-5, atol=1e-5, equal_nan=True)
    np.testing.assert_array_equal(m.reshape(-1), x.max(1))

def test_variables_are_int64_args(rng: np.random.Generator):
  n = Variable("n", 1, 40)
  a = ld(1, dtypes.int32, ST((n, 3)))
  ast = kernel(store(0, dtypes.int32, ST((n, 3)), alu(BinaryOps.ADD, a, const(n, dtypes.int32, ST((1, 1)).expand((n, 3))))))
  x = rng.integers(-50, 50, 120).astype(np.int32)
  src = get_program(ast, [], "LLVM").src
  assert re.search(r'i64 %"var\.n"', src), src
  for v in (1, 13, 40):
    np.testing.assert_array_equal(run(ast, {1: x}, var_vals={n: v})[0].reshape(-1), x[:v * 3] + v)

def test_ir_semantics_flags():
  """Integer ops wrap (no nsw/nuw: -fwrapv), float ops may only contract (gcc gets -ffp-contract=fast, not -ffast-math)."""
  a, b = ld(2, dtypes.float32, ST((64,))), ld(3, dtypes.int32, ST((64,)))
  ast = kernel(store(0, dtypes.float32, ST((64,)), alu(BinaryOps.ADD, alu(BinaryOps.MUL, a, a), alu(UnaryOps.RECIP, a))),
               store(1, dtypes.int32, ST((64,)), alu(BinaryOps.MUL, alu(BinaryOps.ADD, b, b), b)))
  src = get_program(ast, [Opt(OptOps.UPCAST, 0, 4)], "LLVM").src
  assert not re.search(r"\b(nsw|nuw|fast|nnan|ninf|nsz|arcp|afn|reassoc)\b", src), src
  assert re.search(r"fmul contract", src) and re.search(r"fadd contract", src)

def test_parallel_kernel_splits_the_outer_loop(rng: np.random.Generator, monkeypatch):
  """A kernel of >= 32K elements is marked parallel and gives the same result split into any number of
  chunks (ragged ones too); small kernels are not split."""
  from tilecraft.runtime import llvm as rt
  n, m = 37, 1025  # 37 rows don't divide evenly into 2..5 chunks
  x = rng.standard_normal((n, m)).astype(np.float32)
  a = ld(1, dtypes.float32, ST((n, m)))
  ast = kernel(store(0, dtypes.float32, ST((n, 1)), red(ReduceOps.SUM, alu(BinaryOps.MUL, a, a), (1,))))
  p = get_program(ast, [], "LLVM")
  assert "@tc_parallel = constant i32 1" in p.src
  for threads in (1, 2, 3, 5):
    monkeypatch.setenv("LLVM_THREADS", str(threads))
    np.testing.assert_allclose(run(ast, {1: x})[0].reshape(-1), (x * x).sum(1), rtol=1e-4)
  small = kernel(store(0, dtypes.float32, ST((7,)), ld(1, dtypes.float32, ST((7,)))))
  assert "@tc_parallel = constant i32 0" in get_program(small, [], "LLVM").src
  assert rt.thread_count() == 5

def test_bad_ir_is_a_compile_error():
  from tilecraft.device import CompileError
  with pytest.raises(CompileError, match="LLVM rejected"): Device["LLVM"].compiler.compile("define void @f() {\n  ret i32 0\n}\n")

def test_locals_and_thread_ids_are_refused():
  r = Device["LLVM"].renderer
  assert not r.has_local and not r.has_shared
  k = Kernel(kernel(store(0, dtypes.float32, ST((4, 8)), ld(1, dtypes.float32, ST((4, 8))))), opts=r)
  from tilecraft.codegen.kernel import KernelOptError
  with pytest.raises(KernelOptError): k.apply_opt(Opt(OptOps.LOCAL, 0, 2))

@pytest.mark.skipif(__import__("platform").machine() not in ("x86_64", "AMD64"), reason="streaming stores are x86 only")
def test_streaming_stores(rng: np.random.Generator):
  """Big outputs the kernel never reads stream past the caches like the C renderer's: a !nontemporal
  store where the address is aligned (else a plain one) and a fence before returning; results are
  exact at every buffer offset, and a small output keeps plain stores."""
  from tilecraft import Context, Tensor
  a = rng.standard_normal(4099).astype(np.float32)
  with Context(CPU_STREAM_MIN_BYTES=0):
    for off in (0, 1, 3, 4, 16):
      np.testing.assert_array_equal((Tensor(a[off:off + 4000], device="LLVM") * 2 + 1).numpy(), a[off:off + 4000] * 2 + 1)
  def add(n: int) -> LazyOp: return kernel(store(0, dtypes.float32, ST((n,)), alu(BinaryOps.ADD, ld(1, dtypes.float32, ST((n,))), ld(2, dtypes.float32, ST((n,))))))
  big = add(1 << 22)
  src = get_program(big, [Opt(OptOps.UPCAST, 0, 8)], "LLVM").src
  assert "!nontemporal" in src and "fence seq_cst" in src and "ptrtoint" in src
  assert "!nontemporal" not in get_program(add(4096), [Opt(OptOps.UPCAST, 0, 8)], "LLVM").src

def _half_cases() -> np.ndarray:
  """Doubles at, next to and around every kind of half rounding decision: midpoints between
  neighbouring halves (where rounding through float first goes wrong), subnormals, the overflow edge."""
  rng = np.random.default_rng(7)
  h = rng.integers(0, 0x7C00, 3000, dtype=np.uint16).view(np.float16)
  lo, hi = h.astype(np.float64), np.nextafter(h, np.float16(np.inf)).astype(np.float64)
  mid = (lo + hi) / 2
  x = np.concatenate([mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf), -mid, lo,
                      [0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65519.99, 65520.0, 1e6, 2.0 ** -25, 2.0 ** -24 * 1.5, 1e-30, 1e300]])
  return x

@pytest.mark.parametrize("arch", ["native", "x86-64-v2"])  # x86-64-v2: no F16C, every conversion by integer arithmetic
def test_half_conversions_without_runtime_helpers(arch):
  """double/float/int -> half round once to nearest even, half -> float/double is exact, half arithmetic
  rounds per op; no compiler-runtime symbol (__truncdfhf2, ...) is needed at link time."""
  if platform.machine() not in ("x86_64", "AMD64"): pytest.skip("x86-64 -march names")
  x = _half_cases()
  with Context(CPU_ARCH=arch):
    for src in (np.float64, np.float32):
      got = Tensor(x.astype(src), device="LLVM").cast("float16").numpy()
      want = x.astype(src).astype(np.float16)
      np.testing.assert_array_equal(got.view(np.uint16)[~np.isnan(want)], want.view(np.uint16)[~np.isnan(want)])
      assert np.isnan(got[np.isnan(want)]).all()
      back = Tensor(want, device="LLVM").cast(src.__name__).numpy()
      np.testing.assert_array_equal(back, want.astype(src))
    ints = np.arange(-70001, 70001, 7, dtype=np.int32)
    with np.errstate(over="ignore"): np.testing.assert_array_equal(Tensor(ints, device="LLVM").cast("float16").numpy(), ints.astype(np.float16))
    a, b = want[:2000], want[2000:4000]
    with np.errstate(all="ignore"):
      np.testing.assert_array_equal((Tensor(a, device="LLVM") * Tensor(b, device="LLVM")).numpy(), (a.astype(np.float32) * b.astype(np.float32)).astype(np.float16))
      np.testing.assert_array_equal((Tensor(a, device="LLVM") < Tensor(b, device="LLVM")).numpy(), a < b)

@pytest.mark.parametrize("name", ["LLVM_THREADS", "OMP_NUM_THREADS"])
def test_an_absurd_thread_count_is_a_clear_error(monkeypatch, name):
  """(issue 28) LLVM_THREADS=100000 tried to start 100000 threads ("can't start new thread");
  now it is a SettingError naming the variable and the usable range."""
  from tilecraft.helpers import SettingError
  from tilecraft.runtime import llvm as rt
  monkeypatch.delenv("LLVM_THREADS", raising=False)
  for bad in ("100000", "-2"):
    monkeypatch.setenv(name, bad)
    with pytest.raises(SettingError, match=f"{name}={bad} is not a usable thread count.* 1 to "): rt.thread_count()
  monkeypatch.setenv(name, "3")
  assert rt.thread_count() == 3
  monkeypatch.setenv("LLVM_THREADS", "100000")
  with pytest.raises(SettingError, match="LLVM_THREADS=100000"):
    (Tensor(np.ones(1 << 20, np.float32), device="LLVM") * 3).numpy()
