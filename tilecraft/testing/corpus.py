"""A corpus of named kernel ASTs with random-input makers and numpy references.

Each `CorpusEntry` is one kernel (elementwise, broadcast, casts, bool logic, integer division,
reduces, matmul, conv, masked views, arange, symbolic shapes, odd sizes). The building blocks
(`CorpusEntry`, the AST constructors, the numpy helpers) live in corpus_build.py and the image
kernels in corpus_images.py; every public name of both is importable from here. Tests and the fuzzer
(`tilecraft.testing.fuzz`) run an entry's AST on a device and compare with `reference`, which is
written directly in numpy (never derived from the AST), so the two are independent.

Conventions:
- `make_inputs(rng)` returns {buffer idx: array} for every input buffer (outputs are 0..n-1,
  inputs after). Arrays may be flat or shaped; they are copied in flat (C order) and must hold at
  least the elements the kernel's views touch (for symbolic shapes: at the Variables' maxima).
  bfloat16 buffers take float32 arrays whose values are already bfloat16-exact.
- `reference(inputs, var_vals)` returns one array per output, with as many elements as the
  output's STORE shape (evaluated at var_vals); bfloat16 outputs as float32.
- The AST's IDIV/MOD follow numpy: floor division, and 0 when dividing by 0.
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Any, Optional
import numpy as np
from tilecraft.dtype import DType, dtypes
from tilecraft.ops import BinaryOps, ReduceOps, TernaryOps, UnaryOps
from tilecraft.shape.shapetracker import ShapeTracker
from tilecraft.shape.symbolic import Variable
from tilecraft.shape.view import View
# the building blocks (corpus_build.py) and the image kernels (corpus_images.py) are public here too
from tilecraft.testing.corpus_build import (ST, CorpusEntry, Inputs, VarVals, _errstate, alu, bcast, bf16, cast, const,  # noqa: F401
                                            kernel, ld, np_floordiv, np_mod, rand, red, store)
from tilecraft.testing.corpus_images import image_corpus  # noqa: F401

# ---- the corpus ----------------------------------------------------------------------------------

_F = dtypes.float32

def _ew_broadcast(M: int, N: int) -> CorpusEntry:
  full = (M, N)
  a = ld(1, _F, ST(full))
  b = ld(2, _F, bcast((1, N), full))
  c = ld(3, _F, bcast((M, 1), full))
  ast = kernel(store(0, _F, ST(full), alu(BinaryOps.ADD, a, alu(BinaryOps.MUL, b, c))))
  return CorpusEntry(f"ew_broadcast_{M}x{N}", ast,
                     lambda rng: {1: rand(rng, _F, full), 2: rand(rng, _F, N), 3: rand(rng, _F, M)},
                     lambda x, vv: [x[1] + x[2][None, :] * x[3][:, None]], tags=("elementwise",))

def _ew_1d(n: int) -> CorpusEntry:
  a, b = ld(1, _F, ST((n,))), ld(2, _F, ST((n,)))
  ast = kernel(store(0, _F, ST((n,)), alu(BinaryOps.ADD, alu(BinaryOps.MUL, a, b), a)))
  return CorpusEntry(f"ew_{n}", ast, lambda rng: {1: rand(rng, _F, n), 2: rand(rng, _F, n)},
                     lambda x, vv: [x[1] * x[2] + x[1]], tags=("elementwise",))

def _ew_permute() -> CorpusEntry:
  full = (7, 25, 49)
  a = ld(1, _F, ST((49, 25, 7)).permute((2, 1, 0)))  # a transposed read
  b = ld(2, _F, ST((25, 7, 49)).permute((1, 0, 2)))
  c = const(0.5, _F, ST((1, 1, 1)).expand(full))
  ast = kernel(store(0, _F, ST(full), alu(BinaryOps.ADD, alu(BinaryOps.MUL, a, c), b)))
  return CorpusEntry("ew_permute_7x25x49", ast, lambda rng: {1: rand(rng, _F, (49, 25, 7)), 2: rand(rng, _F, (25, 7, 49))},
                     lambda x, vv: [x[1].transpose(2, 1, 0) * np.float32(0.5) + x[2].transpose(1, 0, 2)], tags=("elementwise",))

def _ew_permuted_store() -> CorpusEntry:
  # the output is written through a transposed view
  full = (9, 14)
  a = ld(1, _F, ST(full))
  ast = kernel(store(0, _F, ST((14, 9)).permute((1, 0)), alu(UnaryOps.NEG, a)))
  return CorpusEntry("ew_transposed_store_9x14", ast, lambda rng: {1: rand(rng, _F, full)},
                     lambda x, vv: [-x[1]], tags=("elementwise",))

def _unary_ops(dt: DType) -> CorpusEntry:
  shape = (7, 9)
  a, p = ld(7, dt, ST(shape)), ld(8, dt, ST(shape))
  outs = [alu(UnaryOps.EXP2, a), alu(UnaryOps.LOG2, p), alu(UnaryOps.SIN, a), alu(UnaryOps.SQRT, p), alu(UnaryOps.RECIP, p),
          alu(UnaryOps.NEG, a), alu(BinaryOps.MAX, a, p)]
  ast = kernel(*[store(i, dt, ST(shape), o) for i, o in enumerate(outs)])
  npdt = dt.np if dt.np is not None else np.float32
  def make(rng: np.random.Generator) -> Inputs:
    a_ = rand(rng, dt, shape, -4, 4)
    p_ = rand(rng, dt, shape, 0.05, 8).reshape(-1)
    p_[:4] = np.array([0.0, -1.0, 1.0, 0.25], dtype=p_.dtype)  # log2(0)=-inf, sqrt(-1)=nan, 1/0=inf
    return {7: a_, 8: p_.reshape(shape)}
  def ref(x: Inputs, vv: VarVals) -> list[np.ndarray]:
    a_, p_ = x[7].astype(npdt), x[8].astype(npdt)
    with _errstate():
      res = [np.exp2(a_), np.log2(p_), np.sin(a_), np.sqrt(p_), np.reciprocal(p_), -a_, np.maximum(a_, p_)]
    return [bf16(r) if dt == dtypes.bfloat16 else r.astype(npdt) for r in res]
  tol = {dtypes.float32: (1e-5, 1e-6), dtypes.float64: (1e-12, 1e-12), dtypes.float16: (2e-3, 2e-3), dtypes.bfloat16: (1e-2, 1e-2)}[dt]
  return CorpusEntry(f"unary_{dt.name}", ast, make, ref, rtol=tol[0], atol=tol[1], tags=("elementwise", "unary"))

def _arith(dt: DType) -> CorpusEntry:
  shape = (2, 8)  # 16 elements: every vector width, few opt states (13 dtypes)
  a, b = ld(1, dt, ST(shape)), ld(2, dt, ST(shape))
  ast = kernel(store(0, dt, ST(shape), alu(BinaryOps.MAX, alu(BinaryOps.ADD, alu(BinaryOps.MUL, a, b), a), b)))
  lo, hi = (0, 10) if dtypes.is_unsigned(dt) else (-10, 10)
  if dt == dtypes.bool: lo, hi = 0, 1
  def ref(x: Inputs, vv: VarVals) -> list[np.ndarray]:
    a_, b_ = x[1], x[2]
    if dt == dtypes.bfloat16: return [np.maximum(bf16(bf16(a_ * b_) + a_), b_)]
    if dt == dtypes.bool: return [(a_ & b_) | a_ | b_]
    return [np.maximum(a_ * b_ + a_, b_)]
  return CorpusEntry(f"arith_{dt.name}", ast, lambda rng: {1: rand(rng, dt, shape, lo, hi), 2: rand(rng, dt, shape, lo, hi)}, ref,
                     tags=("elementwise", "dtype"))

def _int8_wrap() -> CorpusEntry:
  # int8 arithmetic wraps after every op (numpy semantics); comparisons see the wrapped value
  shape = (4, 16)
  i8 = dtypes.int8
  a, b, c = ld(2, i8, ST(shape)), ld(3, i8, ST(shape)), ld(4, i8, ST(shape))
  prod_ = alu(BinaryOps.MUL, a, b)
  ast = kernel(store(0, i8, ST(shape), alu(BinaryOps.MAX, prod_, c)),
               store(1, dtypes.bool, ST(shape), alu(BinaryOps.CMPLT, alu(BinaryOps.ADD, a, b), c)))
  def ref(x: Inputs, vv: VarVals) -> list[np.ndarray]:
    with _errstate(): return [np.maximum(x[2] * x[3], x[4]), (x[2] + x[3]) < x[4]]
  return CorpusEntry("int8_wrap", ast, lambda rng: {k: rand(rng, i8, shape, -128, 127) for k in (2, 3, 4)}, ref, tags=("elementwise", "dtype"))

def _cast_f16() -> CorpusEntry:
  shape = (7, 9)
  h = dtypes.float16
  a, b = ld(2, h, ST(shape)), ld(3, _F, ST(shape))
  ast = kernel(store(0, h, ST(shape), alu(BinaryOps.ADD, a, alu(BinaryOps.MUL, cast(b, h), a))),
               store(1, _F, ST(shape), alu(BinaryOps.MUL, cast(a, _F), b)))
  def ref(x: Inputs, vv: VarVals) -> list[np.ndarray]:
    a_, b_ = x[2], x[3]
    return [a_ + b_.astype(np.float16) * a_, a_.astype(np.float32) * b_]
  return CorpusEntry("cast_float16", ast, lambda rng: {2: rand(rng, h, shape, -4, 4), 3: rand(rng, _F, shape, -4, 4)}, ref,
                     tags=("elementwise", "dtype"))

def _cast_bf16() -> CorpusEntry:
  shape = (7, 9)
  bf = dtypes.bfloat16
  a, b = ld(3, bf, ST(shape)), ld(4, _F, ST(shape))
  ast = kernel(store(0, bf, ST(shape), alu(BinaryOps.ADD, alu(BinaryOps.MUL, a, cast(b, bf)), a)),
               store(1, _F, ST(shape), alu(BinaryOps.ADD, cast(a, _F), b)),
               store(2, dtypes.float16, ST(shape), cast(a, dtypes.float16)))
  def ref(x: Inputs, vv: VarVals) -> list[np.ndarray]:
    a_, b_ = x[3], x[4]
    return [bf16(bf16(a_ * bf16(b_)) + a_), a_ + b_, a_.astype(np.float16)]
  return CorpusEntry("cast_bfloat16", ast, lambda rng: {3: rand(rng, bf, shape, -4, 4), 4: rand(rng, _F, shape, -4, 4)}, ref,
                     tags=("elementwise", "dtype"))

def _cast_ints() -> CorpusEntry:
  shape = (6, 11)
  i32 = dtypes.int32
  a = ld(6, i32, ST(shape))
  targets = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int64, dtypes.float32]
  ast = kernel(*[store(i, t, ST(shape), cast(a, t)) for i, t in enumerate(targets)])
  def ref(x: Inputs, vv: VarVals) -> list[np.ndarray]: return [x[6].astype(t.np) for t in targets]
  return CorpusEntry("cast_int32_to_all", ast, lambda rng: {6: rand(rng, i32, shape, -70000, 70000)}, ref, tags=("elementwise", "dtype"))

def _cast_float_int() -> CorpusEntry:
  shape = (6, 11)
  f = ld(4, _F, ST(shape))
  ast = kernel(store(0, dtypes.int32, ST(shape), cast(f, dtypes.int32)),
               store(1, dtypes.uint8, ST(shape), cast(f, dtypes.uint8)),
               store(2, dtypes.int64, ST(shape), cast(cast(f, dtypes.float64), dtypes.int64)),
               store(3, dtypes.float16, ST(shape), cast(cast(f, dtypes.int16), dtypes.float16)))
  def make(rng: np.random.Generator) -> Inputs: return {4: rand(rng, _F, shape, 0, 250)}
  def ref(x: Inputs, vv: VarVals) -> list[np.ndarray]:
    f_ = x[4]
    return [f_.astype(np.int32), f_.astype(np.uint8), f_.astype(np.float64).astype(np.int64), f_.astype(np.int16).astype(np.float16)]
  return CorpusEntry("cast_float_int", ast, make, ref, tags=("elementwise", "dtype"))

def _cast_bool() -> CorpusEntry:
  shape = (5, 8)
  f, i = ld(3, _F, ST(shape)), ld(4, dtypes.int32, ST(shape))
  ast = kernel(store(0, dtypes.bool, ST(shape), cast(f, dtypes.bool)),
               store(1, _F, ST(shape), cast(cast(i, dtypes.bool), _F)),
               store(2, dtypes.int32, ST(shape), alu(BinaryOps.ADD, cast(alu(BinaryOps.CMPLT, f, cast(i, _F)), dtypes.int32), i)))
  def make(rng: np.random.Generator) -> Inputs:
    f_ = rand(rng, _F, shape, -3, 3)
    f_.reshape(-1)[::3] = 0.0
    return {3: f_, 4: rand(rng, dtypes.int32, shape, -2, 2)}
  def ref(x: Inputs, vv: VarVals) -> list[np.ndarray]:
    f_, i_ = x[3], x[4]
    return [f_ != 0, (i_ != 0).astype(np.float32), (f_ < i_.astype(np.float32)).astype(np.int32) + i_]
  return CorpusEntry("cast_bool", ast, make, ref, tags=("elementwise", "dtype"))

def _bool_logic() -> CorpusEntry:
  shape = (6, 10)
  a, b = ld(3, _F, ST(shape)), ld(4, _F, ST(shape))
  c, d = ld(5, dtypes.int32, ST(shape)), ld(6, dtypes.int32, ST(shape))
  e = ld(7, dtypes.bool, ST(shape))
  lt, ne = alu(BinaryOps.CMPLT, a, b), alu(BinaryOps.CMPNE, c, d)
  logic = alu(BinaryOps.OR, alu(BinaryOps.AND, lt, ne), alu(BinaryOps.XOR, e, alu(BinaryOps.CMPLT, c, d)))
  two = const(2.0, _F, ST((1, 1)).expand(shape))
  ast = kernel(store(0, dtypes.bool, ST(shape), logic),
               store(1, _F, ST(shape), alu(TernaryOps.WHERE, lt, a, alu(BinaryOps.MUL, b, two))),
               store(2, dtypes.int32, ST(shape), alu(TernaryOps.WHERE, e, c, d)))
  def make(rng: np.random.Generator) -> Inputs:
    return {3: rand(rng, _F, shape), 4: rand(rng, _F, shape), 5: rand(rng, dtypes.int32, shape, -2, 2),
            6: rand(rng, dtypes.int32, shape, -2, 2), 7: rand(rng, dtypes.bool, shape)}
  def ref(x: Inputs, vv: VarVals) -> list[np.ndarray]:
    lt_, ne_ = x[3] < x[4], x[5] != x[6]
    return [(lt_ & ne_) | (x[7] ^ (x[5] < x[6])), np.where(lt_, x[3], x[4] * np.float32(2)), np.where(x[7], x[5], x[6])]
  return CorpusEntry("bool_logic", ast, make, ref, tags=("elementwise", "bool"))

def _idiv_mod(dt: DType) -> CorpusEntry:
  shape = (8, 13)
  a, b = ld(2, dt, ST(shape)), ld(3, dt, ST(shape))
  ast = kernel(store(0, dt, ST(shape), alu(BinaryOps.IDIV, a, b)), store(1, dt, ST(shape), alu(BinaryOps.MOD, a, b)))
  lo = 0 if dtypes.is_unsigned(dt) else -50
  def make(rng: np.random.Generator) -> Inputs:
    return {2: rand(rng, dt, shape, lo, 50), 3: rand(rng, dt, shape, lo // 7, 7)}  # includes 0 divisors
  def ref(x: Inputs, vv: VarVals) -> list[np.ndarray]: return [np_floordiv(x[2], x[3]), np_mod(x[2], x[3])]
  return CorpusEntry(f"idiv_mod_{dt.name}", ast, make, ref, tags=("elementwise", "int"))

def _idiv_mod_const() -> CorpusEntry:
  shape = (5, 21)
  i32 = dtypes.int32
  a = ld(6, i32, ST(shape))
  c = lambda v: const(v, i32, ST((1, 1)).expand(shape))  # noqa: E731
  ast = kernel(store(0, i32, ST(shape), alu(BinaryOps.IDIV, a, c(-3))), store(1, i32, ST(shape), alu(BinaryOps.MOD, a, c(4))),
               store(2, i32, ST(shape), alu(BinaryOps.IDIV, a, c(0))), store(3, i32, ST(shape), alu(BinaryOps.MOD, a, c(-5))),
               store(4, i32, ST(shape), alu(BinaryOps.MOD, c(17), a)), store(5, i32, ST(shape), alu(BinaryOps.IDIV, a, c(8))))
  def ref(x: Inputs, vv: VarVals) -> list[np.ndarray]:
    a_ = x[6]
    k = lambda v: np.full_like(a_, v)  # noqa: E731
    return [np_floordiv(a_, k(-3)), np_mod(a_, k(4)), np_floordiv(a_, k(0)), np_mod(a_, k(-5)), np_mod(k(17), a_), np_floordiv(a_, k(8))]
  return CorpusEntry("idiv_mod_const_int32", ast, lambda rng: {6: rand(rng, i32, shape, -40, 40)}, ref, tags=("elementwise", "int"))

def _reduce_all(op: ReduceOps, shape: tuple[int, ...]) -> CorpusEntry:
  x = ld(1, _F, ST(shape))
  axes = tuple(range(len(shape)))
  ast = kernel(store(0, _F, ST((1,) * len(shape)), red(op, x, axes)))
  fn = np.sum if op is ReduceOps.SUM else np.max
  name = f"{op.name.lower()}_all_{'x'.join(map(str, shape))}"
  return CorpusEntry(name, ast, lambda rng: {1: rand(rng, _F, shape, 0, 1) if op is ReduceOps.SUM else rand(rng, _F, shape, -100, 0)},
                     lambda x, vv: [np.array(fn(x[1].astype(np.float64))).astype(np.float32)], rtol=1e-4, atol=1e-4, tags=("reduce",))

def _reduce_axis(op: ReduceOps, axes: tuple[int, ...], shape: tuple[int, ...] = (5, 7, 9)) -> CorpusEntry:
  x = ld(1, _F, ST(shape))
  out_shape = tuple(1 if i in axes else s for i, s in enumerate(shape))
  ast = kernel(store(0, _F, ST(out_shape), red(op, x, axes)))
  fn = np.sum if op is ReduceOps.SUM else np.max
  name = f"{op.name.lower()}_axis{''.join(map(str, axes))}_{'x'.join(map(str, shape))}"
  return CorpusEntry(name, ast, lambda rng: {1: rand(rng, _F, shape)},
                     lambda x, vv: [fn(x[1].astype(np.float64), axis=axes, keepdims=True).astype(np.float32)], tags=("reduce",))

def _reduce_int(op: ReduceOps) -> CorpusEntry:
  shape = (6, 17)
  i32 = dtypes.int32
  x = ld(1, i32, ST(shape))
  ast = kernel(store(0, i32, ST((6, 1)), red(op, x, (1,))))
  fn = np.sum if op is ReduceOps.SUM else np.max
  return CorpusEntry(f"{op.name.lower()}_int32_6x17", ast, lambda rng: {1: rand(rng, i32, shape, -1000, -1)},
                     lambda x, vv: [fn(x[1], axis=1, keepdims=True).astype(np.int32)], tags=("reduce", "int"))

def _reduce_half() -> CorpusEntry:
  shape = (4, 33)
  h = dtypes.float16
  x = ld(1, h, ST(shape))
  # accumulate in float32, store half
  ast = kernel(store(0, h, ST((4, 1)), cast(red(ReduceOps.SUM, cast(x, _F), (1,)), h)))
  return CorpusEntry("sum_half_acc_float_4x33", ast, lambda rng: {1: rand(rng, h, shape, -1, 1)},
                     lambda x, vv: [x[1].astype(np.float32).sum(1, keepdims=True).astype(np.float16)], tags=("reduce", "dtype"))

def _matmul(M: int, K: int, N: int) -> CorpusEntry:
  full = (M, N, K)
  a = ld(1, _F, ST((M, K)).reshape((M, 1, K)).expand(full))
  b = ld(2, _F, ST((K, N)).permute((1, 0)).reshape((1, N, K)).expand(full))
  ast = kernel(store(0, _F, ST((M, N, 1)), red(ReduceOps.SUM, alu(BinaryOps.MUL, a, b), (2,))))
  return CorpusEntry(f"matmul_{M}x{K}x{N}", ast, lambda rng: {1: rand(rng, _F, (M, K), -1, 1), 2: rand(rng, _F, (K, N), -1, 1)},
                     lambda x, vv: [(x[1].astype(np.float64) @ x[2].astype(np.float64)).astype(np.float32)], tags=("reduce", "matmul"))

def _multi_output() -> CorpusEntry:
  shape = (9, 12)
  a, b = ld(2, _F, ST(shape)), ld(3, _F, bcast((1, 12), shape))
  ast = kernel(store(0, _F, ST(shape), alu(BinaryOps.ADD, a, b)), store(1, _F, ST(shape), alu(BinaryOps.MUL, a, b)))
  return CorpusEntry("multi_output_9x12", ast, lambda rng: {2: rand(rng, _F, shape), 3: rand(rng, _F, 12)},
                     lambda x, vv: [x[2] + x[3][None], x[2] * x[3][None]], tags=("elementwise", "multi_output"))

def _multi_output_reduce() -> CorpusEntry:
  shape = (7, 19)
  x = ld(2, _F, ST(shape))
  ast = kernel(store(0, _F, ST((7, 1)), red(ReduceOps.SUM, x, (1,))), store(1, _F, ST((7, 1)), red(ReduceOps.MAX, x, (1,))))
  return CorpusEntry("multi_output_sum_max_7x19", ast, lambda rng: {2: rand(rng, _F, shape)},
                     lambda x, vv: [x[2].sum(1, keepdims=True), x[2].max(1, keepdims=True)], tags=("reduce", "multi_output"))

def _two_reduce() -> CorpusEntry:
  shape = (6, 25)
  x = ld(1, _F, ST(shape))
  ast = kernel(store(0, _F, ST((6, 1)), alu(BinaryOps.ADD, red(ReduceOps.SUM, x, (1,)), red(ReduceOps.MAX, x, (1,)))))
  return CorpusEntry("two_reduce_sum_plus_max_6x25", ast, lambda rng: {1: rand(rng, _F, shape)},
                     lambda x, vv: [x[1].sum(1, keepdims=True) + x[1].max(1, keepdims=True)], tags=("reduce", "multi_reduce"))

def _two_reduce_different_inputs() -> CorpusEntry:
  # sum(a*b) and max(exp2(a)) per row, combined
  shape = (5, 14)
  a, b = ld(1, _F, ST(shape)), ld(2, _F, bcast((1, 14), shape))
  r1 = red(ReduceOps.SUM, alu(BinaryOps.MUL, a, b), (1,))
  r2 = red(ReduceOps.MAX, alu(UnaryOps.EXP2, a), (1,))
  ast = kernel(store(0, _F, ST((5, 1)), alu(BinaryOps.MUL, r1, r2)))
  return CorpusEntry("two_reduce_dot_times_maxexp_5x14", ast, lambda rng: {1: rand(rng, _F, shape), 2: rand(rng, _F, 14)},
                     lambda x, vv: [(x[1] * x[2][None]).sum(1, keepdims=True) * np.exp2(x[1]).max(1, keepdims=True)],
                     tags=("reduce", "multi_reduce"))

_LOG2E = 1.4426950408889634

def _softmax_stats(rows: int, cols: int, special: bool = False) -> CorpusEntry:
  """A dependent reduce: max(x) and sum(exp(x - max(x))) per row in one kernel (softmax's statistics),
  the sum reading the max broadcast over the row. `special` puts -inf, +-1e30, equal and NaN rows in."""
  shape, out = (rows, cols), (rows, 1)
  x = ld(2, _F, ST(shape))
  m = red(ReduceOps.MAX, x, (1,))
  e = alu(UnaryOps.EXP2, alu(BinaryOps.MUL, alu(BinaryOps.ADD, x, alu(UnaryOps.NEG, m)), const(_LOG2E, _F, ST(shape))))
  ast = kernel(store(0, _F, ST(out), red(ReduceOps.SUM, e, (1,))), store(1, _F, ST(out), m))
  def make(rng: np.random.Generator) -> Inputs:
    a = rand(rng, _F, shape, -4, 4)
    if special:
      a[0] = -np.inf; a[1, ::3] = -np.inf; a[2] = 1e30; a[2, 1::2] = -1e30; a[3] = 0.5; a[4, cols // 2] = np.nan
    return {2: a}
  def ref(x: Inputs, vv: VarVals) -> list[np.ndarray]:
    a = x[2].astype(np.float64)
    with np.errstate(invalid="ignore"):
      mx = a.max(1, keepdims=True)
      return [np.exp(a - mx).sum(1, keepdims=True).astype(np.float32), mx.astype(np.float32)]
  return CorpusEntry(f"softmax_stats_{rows}x{cols}" + ("_special" if special else ""), ast, make, ref, rtol=1e-5, atol=1e-6,
                     tags=("reduce", "multi_reduce", "dependent_reduce", "multi_output"))

def _variance_rows() -> CorpusEntry:
  """A dependent reduce with a scaled inner reduce: sum((x - mean)^2) / n per row over axis 0 of a
  permuted (column-major) input, the mean a post-reduce value broadcast into the second sum."""
  x = ld(1, _F, ST((13, 9)).permute((1, 0)))
  mean = alu(BinaryOps.MUL, red(ReduceOps.SUM, x, (1,)), const(1 / 13, _F, ST((9, 1))))
  d = alu(BinaryOps.ADD, x, alu(UnaryOps.NEG, mean))
  ast = kernel(store(0, _F, ST((9, 1)), alu(BinaryOps.MUL, red(ReduceOps.SUM, alu(BinaryOps.MUL, d, d), (1,)), const(1 / 13, _F, ST((9, 1))))))
  return CorpusEntry("variance_rows_9x13", ast, lambda rng: {1: rand(rng, _F, (13, 9), -3, 3)},
                     lambda x, vv: [x[1].astype(np.float64).T.var(1, keepdims=True).astype(np.float32)], rtol=1e-5, atol=1e-5,
                     tags=("reduce", "multi_reduce", "dependent_reduce"))

def _reduce_invariant_terms() -> CorpusEntry:
  """Reduces of terms that don't vary along the reduce axis (a constant, a row broadcast along it),
  fused with a reduce of loaded data: once the reduce axis is the vector axis (UNROLL), such a term
  must still count once per lane (it counted once per vector: a 2x2 sum of 1.0 gave 1)."""
  f = dtypes.float32
  full = (5, 8)
  sums = alu(BinaryOps.ADD, red(ReduceOps.SUM, ld(2, f, ST(full)), (1,)), red(ReduceOps.SUM, const(1.5, f, ST((1, 1)).expand(full)), (1,)))
  ast = kernel(store(0, f, ST((5, 1)), alu(BinaryOps.ADD, sums, red(ReduceOps.SUM, ld(3, f, bcast((5, 1), full)), (1,)))),
               store(1, f, ST((5, 1)), alu(BinaryOps.ADD, red(ReduceOps.MAX, ld(2, f, ST(full)), (1,)), red(ReduceOps.MAX, ld(3, f, bcast((5, 1), full)), (1,)))))
  return CorpusEntry("reduce_invariant_terms_5x8", ast, lambda rng: {2: rand(rng, f, full), 3: rand(rng, f, (5, 1))},
                     lambda x, vv: [x[2].sum(1, keepdims=True) + 1.5 * 8 + x[3] * 8, x[2].max(1, keepdims=True) + x[3]],
                     tags=("reduce", "multi_reduce", "multi_output"))

def _pad_2d() -> CorpusEntry:
  a = ld(1, _F, ST((5, 7)).pad(((1, 1), (2, 2))))
  b = ld(2, _F, ST((7, 11)))
  ast = kernel(store(0, _F, ST((7, 11)), alu(BinaryOps.ADD, a, b)))
  return CorpusEntry("pad_2d_5x7", ast, lambda rng: {1: rand(rng, _F, (5, 7)), 2: rand(rng, _F, (7, 11))},
                     lambda x, vv: [np.pad(x[1], ((1, 1), (2, 2))) + x[2]], tags=("elementwise", "masked"))

def _pad_dtypes() -> CorpusEntry:
  """Rows padded on both sides in every vector dtype (masked vector loads): the first lanes of the
  first row read before the buffer's start and the last lanes of the last row past its end."""
  shape, pads = (3, 25), ((1, 1), (3, 4))  # -> (5, 32)
  dts = [dtypes.float32, dtypes.int32, dtypes.int64, dtypes.float64]
  ast = kernel(*[store(i, dt, ST((5, 32)), alu(BinaryOps.ADD, ld(4 + i, dt, ST(shape).pad(pads)), ld(8 + i, dt, ST((5, 32)))))
                 for i, dt in enumerate(dts)])
  def make(rng: np.random.Generator) -> Inputs:
    return {**{4 + i: rand(rng, dt, shape, -50, 50) for i, dt in enumerate(dts)}, **{8 + i: rand(rng, dt, (5, 32), -50, 50) for i, dt in enumerate(dts)}}
  return CorpusEntry("pad_dtypes_3x25", ast, make, lambda x, vv: [np.pad(x[4 + i], pads) + x[8 + i] for i in range(len(dts))],
                     tags=("elementwise", "masked", "dtype"))

def _pad_lane_pattern() -> CorpusEntry:
  """A padded (4, 6) -> (4, 8) read as one axis of 32: the mask repeats every 8 elements (through a
  mod), so within a vector of 8 only the middle lanes are valid; also read shifted by a pad of 3."""
  st = ShapeTracker(ST((4, 6)).pad(((0, 0), (1, 1))).views + (View.create((32,)),))
  st2 = st.pad(((3, 0),)).shrink(((0, 32),))
  ast = kernel(store(0, _F, ST((32,)), alu(BinaryOps.ADD, ld(2, _F, st), ld(3, _F, ST((32,))))),
               store(1, _F, ST((32,)), ld(2, _F, st2)))
  def ref(x: Inputs, vv: VarVals) -> list[np.ndarray]:
    p = np.pad(x[2].reshape(4, 6), ((0, 0), (1, 1))).reshape(-1)
    return [p + x[3], np.pad(p, (3, 0))[:32]]
  return CorpusEntry("pad_lane_pattern_4x6", ast, lambda rng: {2: rand(rng, _F, (4, 6)), 3: rand(rng, _F, 32)}, ref, tags=("elementwise", "masked"))

def _shrink_flip_stride() -> CorpusEntry:
  st = ST((8, 12)).shrink(((1, 7), (2, 10))).flip((0,)).stride((1, 2)).pad(((0, 1), (1, 0)))  # (7, 5)
  a = ld(1, _F, st)
  one = const(1.0, _F, ST((1, 1)).expand((7, 5)))
  ast = kernel(store(0, _F, ST((7, 5)), alu(BinaryOps.ADD, alu(BinaryOps.MUL, a, const(3.0, _F, ST((1, 1)).expand((7, 5)))), one)))
  def ref(x: Inputs, vv: VarVals) -> list[np.ndarray]:
    v = np.pad(x[1][1:7, 2:10][::-1, ::2], ((0, 1), (1, 0)))
    return [v * np.float32(3) + np.float32(1)]
  return CorpusEntry("shrink_flip_stride_pad_8x12", ast, lambda rng: {1: rand(rng, _F, (8, 12))}, ref, tags=("elementwise", "masked"))

def _pad_reduce_exp2() -> CorpusEntry:
  # padding is 0 at the load, so exp2 of it is 1: the sum sees every padded element
  x = ld(1, _F, ST((5, 7)).pad(((0, 0), (3, 2))))
  ast = kernel(store(0, _F, ST((5, 1)), red(ReduceOps.SUM, alu(UnaryOps.EXP2, x), (1,))))
  return CorpusEntry("pad_reduce_exp2_5x7", ast, lambda rng: {1: rand(rng, _F, (5, 7))},
                     lambda x, vv: [np.exp2(np.pad(x[1], ((0, 0), (3, 2)))).sum(1, keepdims=True)], tags=("reduce", "masked"))

def _masked_flip_reduce() -> CorpusEntry:
  # max over a flipped, shrunk and padded view (padding reads 0; inputs are negative, so 0 wins where padded)
  st = ST((6, 10)).flip((1,)).shrink(((0, 6), (1, 9))).pad(((1, 0), (0, 3)))  # (7, 11)
  x = ld(1, _F, st)
  ast = kernel(store(0, _F, ST((7, 1)), red(ReduceOps.MAX, x, (1,))))
  def ref(x: Inputs, vv: VarVals) -> list[np.ndarray]:
    return [np.pad(x[1][:, ::-1][:, 1:9], ((1, 0), (0, 3))).max(1, keepdims=True)]
  return CorpusEntry("masked_flip_max_6x10", ast, lambda rng: {1: rand(rng, _F, (6, 10), -5, -1)}, ref, tags=("reduce", "masked"))

def _pointwise_panels(cin: int, panels: int, pixels: int) -> CorpusEntry:
  """A 1x1 conv against a weight in panels of 64 output channels (frontend/pointwise_layout.py), a residual added:
  out[p, c, q] = sum_ci x[ci, q] * w[p, ci, c] + r[p, c, q]. Its output channels are strided in the output and
  contiguous in the weight (on AVX-512 the heuristics' vectors along them, stored and the residual read lane by lane)."""
  full = (panels, 64, pixels, cin)
  x = ld(1, _F, ST((cin, pixels)).permute((1, 0)).reshape((1, 1, pixels, cin)).expand(full))
  w = ld(2, _F, ST((panels, cin, 64)).permute((0, 2, 1)).reshape((panels, 64, 1, cin)).expand(full))
  res = ld(3, _F, ST((panels, 64, pixels, 1)))
  ast = kernel(store(0, _F, ST((panels, 64, pixels, 1)), alu(BinaryOps.ADD, red(ReduceOps.SUM, alu(BinaryOps.MUL, x, w), (3,)), res)))
  def ref(x: Inputs, vv: VarVals) -> list[np.ndarray]:
    conv = np.einsum("iq,pic->pcq", x[1].reshape(cin, pixels).astype(np.float64), x[2].reshape(panels, cin, 64).astype(np.float64))
    return [(conv + x[3].reshape(panels, 64, pixels)).astype(np.float32)]
  return CorpusEntry(f"pointwise_panels_{cin}x{64 * panels}x{pixels}", ast,
                     lambda rng: {1: rand(rng, _F, (cin, pixels), -1, 1), 2: rand(rng, _F, (panels, cin, 64), -1, 1), 3: rand(rng, _F, (panels, 64, pixels))},
                     ref, tags=("reduce", "conv"))

def _conv(n: int, cin: int, cout: int, hw: int, k: int, stride: int, pad: int, reduce_batch: bool) -> CorpusEntry:
  """out[n, co, oy, ox] = sum_{ci, ky, kx} x_pad[n, ci, oy*s+ky, ox*s+kx] * w[co, ci, ky, kx]; with
  reduce_batch the batch is summed too (4 reduce axes)."""
  H = hw + 2 * pad
  o = (H - k) // stride + 1
  xp = ST((n, cin, hw, hw)).pad(((0, 0), (0, 0), (pad, pad), (pad, pad)))  # (n, cin, H, H)
  # (n, co, oy, ox, ci, ky, kx) -> index into the padded tensor
  dims = {"n": (n, cin * H * H), "co": (cout, 0), "oy": (o, stride * H), "ox": (o, stride), "ci": (cin, H * H), "ky": (k, H), "kx": (k, 1)}
  wdims = {"n": 0, "co": cin * k * k, "oy": 0, "ox": 0, "ci": k * k, "ky": k, "kx": 1}
  order = ["co", "oy", "ox", "n", "ci", "ky", "kx"] if reduce_batch else ["n", "co", "oy", "ox", "ci", "ky", "kx"]
  full = tuple(dims[d][0] for d in order)
  xst = ShapeTracker(xp.views + (View.create(full, tuple(dims[d][1] for d in order)),))
  wst = ShapeTracker((View.create(full, tuple(wdims[d] for d in order)),))
  raxes = tuple(range(3 if reduce_batch else 4, 7))
  out_shape = tuple(1 if i in raxes else s for i, s in enumerate(full))
  ast = kernel(store(0, _F, ST(out_shape), red(ReduceOps.SUM, alu(BinaryOps.MUL, ld(1, _F, xst), ld(2, _F, wst)), raxes)))
  def ref(x: Inputs, vv: VarVals) -> list[np.ndarray]:
    xx = np.pad(x[1].reshape(n, cin, hw, hw).astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    w = x[2].reshape(cout, cin, k, k).astype(np.float64)
    out = np.zeros((n, cout, o, o))
    for ky in range(k):
      for kx in range(k):
        win = xx[:, :, ky:ky + stride * (o - 1) + 1:stride, kx:kx + stride * (o - 1) + 1:stride]  # (n, ci, o, o)
        out += np.einsum("nihw,ci->nchw", win, w[:, :, ky, kx])
    if reduce_batch: out = out.sum(0)
    return [out.astype(np.float32)]
  name = f"conv_{n}x{cin}x{hw}x{hw}_w{cout}x{k}x{k}_s{stride}_p{pad}" + ("_sumbatch" if reduce_batch else "")
  return CorpusEntry(name, ast, lambda rng: {1: rand(rng, _F, (n, cin, hw, hw), -1, 1), 2: rand(rng, _F, (cout, cin, k, k), -1, 1)},
                     ref, tags=("reduce", "conv", "masked"))

def _arange(n: int, dt: DType, val: Any) -> CorpusEntry:
  """arange as a reduce: out[i] = sum_j [i + j >= n-1] * val = (i+1) * val, over a padded const."""
  base = ST((n,)).pad(((n - 1, 0),))  # (2n-1,), valid from n-1
  st = ShapeTracker(base.views + (View.create((n, n), (1, 1)),))
  ast = kernel(store(0, dt, ST((n, 1)), red(ReduceOps.SUM, const(val, dt, st), (1,))))
  return CorpusEntry(f"arange_{dt.name}_{n}", ast, lambda rng: {},
                     lambda x, vv: [(np.arange(1, n + 1) * val).astype(dt.np).reshape(n, 1)], tags=("reduce", "masked", "const"))

_N = Variable("n", 1, 64)
_SYM_VALS = [{_N: 1}, {_N: 7}, {_N: 33}, {_N: 64}]

def _sym_ew() -> CorpusEntry:
  full = (_N, 7)
  a = ld(1, _F, ST(full))
  b = ld(2, _F, ST((1, 7)).expand(full))
  ast = kernel(store(0, _F, ST(full), alu(BinaryOps.ADD, alu(BinaryOps.MUL, a, const(2.0, _F, ST((1, 1)).expand(full))), b)))
  return CorpusEntry("sym_ew_nx7", ast, lambda rng: {1: rand(rng, _F, 64 * 7), 2: rand(rng, _F, 7)},
                     lambda x, vv: [x[1][:vv[_N] * 7].reshape(-1, 7) * np.float32(2) + x[2][None]], var_vals=_SYM_VALS,
                     tags=("elementwise", "symbolic"))

def _sym_reduce_inner() -> CorpusEntry:
  x = ld(2, _F, ST((4, _N)))
  ast = kernel(store(0, _F, ST((4, 1)), red(ReduceOps.SUM, x, (1,))), store(1, _F, ST((4, 1)), red(ReduceOps.MAX, x, (1,))))
  def ref(x: Inputs, vv: VarVals) -> list[np.ndarray]:
    v = x[2][:4 * vv[_N]].reshape(4, -1)
    return [v.sum(1, keepdims=True), v.max(1, keepdims=True)]
  return CorpusEntry("sym_reduce_4xn", ast, lambda rng: {2: rand(rng, _F, 4 * 64)}, ref, var_vals=_SYM_VALS, tags=("reduce", "symbolic"))

def _sym_reduce_outer() -> CorpusEntry:
  x = ld(1, _F, ST((_N, 9)))
  ast = kernel(store(0, _F, ST((1, 9)), red(ReduceOps.SUM, x, (0,))))
  return CorpusEntry("sym_reduce_nx9_axis0", ast, lambda rng: {1: rand(rng, _F, 64 * 9)},
                     lambda x, vv: [x[1][:vv[_N] * 9].reshape(-1, 9).sum(0, keepdims=True)], var_vals=_SYM_VALS, tags=("reduce", "symbolic"))

def _sym_const() -> CorpusEntry:
  i32 = dtypes.int32
  full = (_N, 3)
  a = ld(1, i32, ST(full))
  ast = kernel(store(0, i32, ST(full), alu(BinaryOps.ADD, a, const(_N, i32, ST((1, 1)).expand(full)))))
  return CorpusEntry("sym_const_nx3", ast, lambda rng: {1: rand(rng, i32, 64 * 3, -100, 100)},
                     lambda x, vv: [x[1][:vv[_N] * 3].reshape(-1, 3) + np.int32(vv[_N])], var_vals=_SYM_VALS, tags=("elementwise", "symbolic"))

def _sum_1d(n: int) -> CorpusEntry:
  x = ld(1, _F, ST((n,)))
  ast = kernel(store(0, _F, ST((1,)), red(ReduceOps.SUM, x, (0,))))
  return CorpusEntry(f"sum_1d_{n}", ast, lambda rng: {1: rand(rng, _F, n, 0, 1)},
                     lambda x, vv: [np.array([x[1].astype(np.float64).sum()], dtype=np.float32)], rtol=1e-4, atol=1e-4, tags=("reduce",))

def _reduce_then_scale() -> CorpusEntry:
  # a reduce followed by elementwise ops that load another buffer at the reduced shape
  x, y = ld(1, _F, ST((6, 11))), ld(2, _F, ST((6, 1)))
  ast = kernel(store(0, _F, ST((6, 1)), alu(BinaryOps.MUL, red(ReduceOps.SUM, x, (1,)), alu(UnaryOps.EXP2, y))))
  return CorpusEntry("reduce_then_scale_6x11", ast, lambda rng: {1: rand(rng, _F, (6, 11)), 2: rand(rng, _F, (6, 1))},
                     lambda x, vv: [x[1].sum(1, keepdims=True) * np.exp2(x[2])], tags=("reduce",))

def _unsafe_pad_reduces() -> list[CorpusEntry]:
  # f(0) != 0 inside a SUM: padding the reduce axis (PADTO) would change the result, so it must be refused
  x = ld(1, _F, ST((5, 13)))
  recip = kernel(store(0, _F, ST((5, 1)), red(ReduceOps.SUM, alu(UnaryOps.RECIP, x), (1,))))
  i32 = dtypes.int32
  a, b = ld(1, i32, ST((6, 11))), ld(2, i32, ST((6, 11)))
  idiv = kernel(store(0, i32, ST((6, 1)), red(ReduceOps.SUM, alu(BinaryOps.IDIV, a, b), (1,))))
  def make_idiv(rng: np.random.Generator) -> Inputs:
    b_ = rand(rng, i32, (6, 11), 1, 5) * np.where(rng.integers(0, 2, (6, 11)) == 1, 1, -1).astype(np.int32)
    return {1: rand(rng, i32, (6, 11), -30, 30), 2: b_}
  return [CorpusEntry("sum_recip_5x13", recip, lambda rng: {1: rand(rng, _F, (5, 13), 0.5, 2)},
                      lambda x, vv: [(1 / x[1].astype(np.float64)).sum(1, keepdims=True).astype(np.float32)], tags=("reduce", "unsafe_pad")),
          CorpusEntry("sum_idiv_int32_6x11", idiv, make_idiv, lambda x, vv: [np_floordiv(x[1], x[2]).sum(1, keepdims=True).astype(np.int32)],
                      tags=("reduce", "int", "unsafe_pad"))]

def _two_view_input() -> CorpusEntry:
  # a reshape of a transposed tensor: two views, the index goes through div/mod
  st = ST((6, 4)).permute((1, 0)).reshape((3, 8))
  x, y = ld(2, _F, st), ld(3, _F, ST((3, 8)))
  ast = kernel(store(0, _F, ST((3, 1)), red(ReduceOps.SUM, alu(BinaryOps.MUL, x, y), (1,))),
               store(1, _F, ST((3, 1)), red(ReduceOps.MAX, x, (1,))))
  def ref(x: Inputs, vv: VarVals) -> list[np.ndarray]:
    v = x[2].reshape(6, 4).T.reshape(3, 8)
    return [(v * x[3].reshape(3, 8)).sum(1, keepdims=True), v.max(1, keepdims=True)]
  return CorpusEntry("two_view_reshape_of_transpose_3x8", ast, lambda rng: {2: rand(rng, _F, (6, 4)), 3: rand(rng, _F, (3, 8))}, ref,
                     tags=("reduce", "multi_output", "masked"))

def _narrow_reduces() -> list[CorpusEntry]:
  u8, b = dtypes.uint8, dtypes.bool
  x = ld(1, u8, ST((4, 40)))
  su8 = kernel(store(0, u8, ST((4, 1)), red(ReduceOps.SUM, x, (1,))))
  y = ld(1, b, ST((5, 12)))
  anyb = kernel(store(0, b, ST((5, 1)), red(ReduceOps.MAX, y, (1,))))
  def make_bool(rng: np.random.Generator) -> Inputs:
    v = rng.random((5, 12)) < 0.1
    v[0] = False  # a row with no True
    return {1: v}
  return [CorpusEntry("sum_uint8_wraps_4x40", su8, lambda rng: {1: rand(rng, u8, (4, 40), 0, 255)},
                      lambda x, vv: [np.sum(x[1], axis=1, keepdims=True, dtype=np.uint8)], tags=("reduce", "dtype")),
          CorpusEntry("max_bool_any_5x12", anyb, make_bool, lambda x, vv: [x[1].max(1, keepdims=True)], tags=("reduce", "bool"))]

_M = Variable("m", 1, 16)

def _sym_two_vars() -> CorpusEntry:
  full = (_N, _M)
  a = ld(1, _F, ST(full))
  b = ld(2, _F, ST((1, _M)).expand(full))
  ast = kernel(store(0, _F, ST((_N, 1)), red(ReduceOps.SUM, alu(BinaryOps.ADD, a, b), (1,))))
  def ref(x: Inputs, vv: VarVals) -> list[np.ndarray]:
    n, m = vv[_N], vv[_M]
    return [(x[1][:n * m].reshape(n, m) + x[2][None, :m]).sum(1, keepdims=True)]
  return CorpusEntry("sym_two_vars_nxm", ast, lambda rng: {1: rand(rng, _F, 64 * 16), 2: rand(rng, _F, 16)}, ref,
                     var_vals=[{_N: 1, _M: 1}, {_N: 5, _M: 16}, {_N: 64, _M: 3}, {_N: 33, _M: 8}], tags=("elementwise", "reduce", "symbolic"))

_ALL_DTYPES = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
               dtypes.uint64, dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]

def corpus(small: bool = True) -> dict[str, CorpusEntry]:
  """Every corpus kernel by name. `small=False` adds bigger variants (slower to fuzz)."""
  entries: list[CorpusEntry] = [
    _ew_broadcast(7, 25), *[_ew_1d(n) for n in (1, 7, 25, 49, 50257)], _ew_permute(), _ew_permuted_store(),
    *[_unary_ops(dt) for dt in (dtypes.float32, dtypes.float64, dtypes.float16, dtypes.bfloat16)],
    *[_arith(dt) for dt in _ALL_DTYPES], _int8_wrap(),
    _cast_f16(), _cast_bf16(), _cast_ints(), _cast_float_int(), _cast_bool(), _bool_logic(),
    *[_idiv_mod(dt) for dt in (dtypes.int32, dtypes.int8, dtypes.int64, dtypes.uint32)], _idiv_mod_const(),
    _reduce_all(ReduceOps.SUM, (7, 25)), _reduce_all(ReduceOps.MAX, (7, 25)), _reduce_all(ReduceOps.SUM, (1, 1)),
    *[_reduce_axis(op, (ax,)) for op in (ReduceOps.SUM, ReduceOps.MAX) for ax in range(3)], _reduce_axis(ReduceOps.SUM, (0, 2)),
    _reduce_int(ReduceOps.SUM), _reduce_int(ReduceOps.MAX), _reduce_half(),
    _matmul(16, 16, 16), _matmul(7, 25, 49), _matmul(1, 49, 25), _matmul(25, 1, 7),
    _multi_output(), _multi_output_reduce(), _two_reduce(), _two_reduce_different_inputs(),
    _softmax_stats(6, 40), _softmax_stats(5, 16, special=True), _variance_rows(),
    _reduce_invariant_terms(), _pad_2d(), _pad_dtypes(), _pad_lane_pattern(), _shrink_flip_stride(), _pad_reduce_exp2(), _masked_flip_reduce(),
    _conv(1, 4, 3, 8, 3, 1, 1, False), _conv(2, 2, 2, 8, 3, 2, 1, True), _conv(1, 3, 4, 12, 3, 1, 1, False), _pointwise_panels(256, 2, 49),
    _arange(25, dtypes.int32, 1), _arange(50, dtypes.float32, 2.0),
    _sym_ew(), _sym_reduce_inner(), _sym_reduce_outer(), _sym_const(),
    *[_sum_1d(n) for n in (1, 7, 25, 49, 50257)],
    _reduce_then_scale(), *_unsafe_pad_reduces(), _two_view_input(), *_narrow_reduces(), _sym_two_vars(),
  ]
  if not small:
    entries += [_matmul(64, 64, 64), _matmul(33, 65, 17), _conv(2, 8, 8, 16, 3, 1, 1, False), _ew_broadcast(129, 257),
                _reduce_axis(ReduceOps.SUM, (1,), (33, 257, 5))]
  out: dict[str, CorpusEntry] = {}
  for e in entries:
    if e.name in out: raise ValueError(f"duplicate corpus entry {e.name}")
    out[e.name] = e
  return out

# ---- open compiler bugs the corpus finds ---------------------------------------------------------
# Tests mark these (entry, device, check) combinations xfail(strict=True): when a bug is fixed its
# tests XPASS and fail, which is the signal to delete its row here. `check` is "noopt" (the
# unoptimized kernel vs numpy), "enumerate" (exhaustive UPCAST/UNROLL) or "fuzz" (random opts).

@dataclass(frozen=True)
class KnownBug:
  reason: str
  devices: tuple[str, ...]
  checks: tuple[str, ...]
  entries: tuple[str, ...]

KNOWN_BUGS: list[KnownBug] = []

def known_bug(name: str, device: str, check: str) -> Optional[str]:
  """The reason entry `name` is expected to fail `check` on `device`, or None."""
  reasons = [b.reason for b in KNOWN_BUGS if name in b.entries and device in b.devices and check in b.checks]
  return "; ".join(reasons) if reasons else None
