"""Every refusal in the OptOps table (DESIGN §5): `apply_opt` raises KernelOptError naming the rule,
and a refused opt leaves the kernel exactly as it was.

Refusals only look at the kernel's shapes and the renderer's capabilities, so the GPU-side tests use
an `OpenCLRenderer()` directly: no OpenCL device is needed to build or refuse an opt."""
import copy
import pytest
from tilecraft.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tilecraft.dtype import dtypes
from tilecraft.ops import BinaryOps, BufferOps, LazyOp, MemBuffer, MetaOps, ReduceOps, UnaryOps
from tilecraft.renderer.cstyle import CRenderer, OpenCLRenderer
from tilecraft.shape.shapetracker import ShapeTracker
from tilecraft.shape.symbolic import Variable

# ---- AST builders ---------------------------------------------------------------------------------

def load(i, st, dt=dtypes.float32): return LazyOp(BufferOps.LOAD, (), MemBuffer(i, dt, st))

def kernel(value, out_shape, dt=dtypes.float32):
  return LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (value,), MemBuffer(0, dt, ShapeTracker.from_shape(out_shape))),))

def matmul(M, N, K):
  """out[m, n] = sum_k a[m, k] * b[k, n]; kernel shape (M, N, K)."""
  a = ShapeTracker.from_shape((M, K)).reshape((M, 1, K)).expand((M, N, K))
  b = ShapeTracker.from_shape((K, N)).permute((1, 0)).reshape((1, N, K)).expand((M, N, K))
  return kernel(LazyOp(ReduceOps.SUM, (LazyOp(BinaryOps.MUL, (load(1, a), load(2, b))),), (2,)), (M, N, 1))

def rowreduce(rows, cols, op=ReduceOps.SUM, pre=None, dt=dtypes.float32):
  """out[r] = op over c of pre(x[r, c]); pre is a unary op or None."""
  x = load(1, ShapeTracker.from_shape((rows, cols)), dt)
  if pre is not None: x = LazyOp(pre, (x,))
  return kernel(LazyOp(op, (x,), (1,)), (rows, 1), dt)

def elementwise(shape):
  st = ShapeTracker.from_shape(shape)
  return kernel(LazyOp(BinaryOps.ADD, (load(1, st), load(2, st))), shape)

def idiv_sum(rows, cols):
  st = ShapeTracker.from_shape((rows, cols))
  q = LazyOp(BinaryOps.IDIV, (load(1, st, dtypes.int32), load(2, st, dtypes.int32)))
  return kernel(LazyOp(ReduceOps.SUM, (q,), (1,)), (rows, 1), dtypes.int32)

def two_reduces(n):
  """out = sum(x) + max(x): two reduces in one kernel."""
  st = ShapeTracker.from_shape((n,))
  return kernel(LazyOp(BinaryOps.ADD, (LazyOp(ReduceOps.SUM, (load(1, st),), (0,)), LazyOp(ReduceOps.MAX, (load(1, st),), (0,)))), (1,))

def softmax_stats(rows, cols):
  """out = sum(exp2(x - max(x))) per row: a reduce reading another reduce's result (a dependent reduce)."""
  x = load(1, ShapeTracker.from_shape((rows, cols)))
  m = LazyOp(ReduceOps.MAX, (x,), (1,))
  return kernel(LazyOp(ReduceOps.SUM, (LazyOp(UnaryOps.EXP2, (LazyOp(BinaryOps.ADD, (x, LazyOp(UnaryOps.NEG, (m,)))),)),), (1,)), (rows, 1))

def variance(rows, cols):
  """out = sum((x - sum(x))^2) per row: a dependent reduce with only pad-safe ops, still not padded."""
  x = load(1, ShapeTracker.from_shape((rows, cols)))
  d = LazyOp(BinaryOps.ADD, (x, LazyOp(UnaryOps.NEG, (LazyOp(ReduceOps.SUM, (x,), (1,)),))))
  return kernel(LazyOp(ReduceOps.SUM, (LazyOp(BinaryOps.MUL, (d, d)),), (1,)), (rows, 1))

def image_reduce():
  """A SUM whose output buffer is an imagef((8, 8, 4)): kernel shape (256, 64)."""
  st = ShapeTracker.from_shape((8, 32, 64))
  out = MemBuffer(0, dtypes.imagef((8, 8, 4)), ShapeTracker.from_shape((8, 32, 1)))
  return LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (LazyOp(ReduceOps.SUM, (load(1, st),), (2,)),), out),))

CPU = CRenderer()
GPU = OpenCLRenderer()

def tiny_shared(nbytes):
  """A GPU renderer with only `nbytes` of local memory."""
  r = copy.copy(GPU)
  r.shared_max = nbytes
  return r

# ---- helpers --------------------------------------------------------------------------------------

def snapshot(k):
  return dict(full_shape=k.full_shape, output_shape=k.output_shape, colors=list(k.colors()), applied_opts=list(k.applied_opts),
              reasons=list(k.applied_opts_reasons), local_dims=k.local_dims, upcasted=k.upcasted, group=k.group_for_reduces,
              nolocals=k.dont_use_locals, first_reduce=k.first_reduce, first_upcast=k.first_upcast, sts=list(k.sts))

def make(ast, renderer, pre=()):
  k = Kernel(ast, renderer)
  for o in pre: k.apply_opt(o)
  return k

def assert_refused(k, opt, match):
  before = snapshot(k)
  with pytest.raises(KernelOptError, match=match):
    k.apply_opt(opt)
  assert snapshot(k) == before, f"refused {opt} changed the kernel"

U, R, L = OptOps.UPCAST, OptOps.UNROLL, OptOps.LOCAL
G, GT, NL, PAD, SW = OptOps.GROUP, OptOps.GROUPTOP, OptOps.NOLOCALS, OptOps.PADTO, OptOps.SWAP

# (id, ast builder, renderer, opts applied first, the refused opt, regex naming the rule)
REFUSALS = [
  # UPCAST
  ("upcast-red-axis", lambda: matmul(16, 16, 16), GPU, [], Opt(U, 2, 4), r"UPCAST.*reduce axis"),
  ("upcast-green-axis", lambda: matmul(16, 16, 16), GPU, [Opt(G, 0, 4)], Opt(U, 2, 4), r"UPCAST.*reduce axis"),
  ("upcast-magenta-axis", lambda: matmul(16, 16, 16), GPU, [Opt(R, 0, 4)], Opt(U, 3, 2), r"UPCAST.*reduce axis"),
  ("upcast-over-16", lambda: elementwise((64,)), GPU, [], Opt(U, 0, 32), r"UPCAST.*over 16"),
  ("upcast-whole-axis-over-16", lambda: elementwise((64,)), CPU, [], Opt(U, 0, 0), r"UPCAST.*over 16"),
  ("upcast-non-divisor", lambda: matmul(16, 16, 16), GPU, [], Opt(U, 0, 3), r"does not divide"),
  ("upcast-non-divisor-bigger", lambda: matmul(24, 16, 16), CPU, [], Opt(U, 0, 16), r"does not divide"),
  # UNROLL
  ("unroll-already-upcast", lambda: matmul(16, 16, 16), GPU, [Opt(R, 0, 4)], Opt(R, 1, 2), r"UNROLL.*already upcast"),
  ("unroll-yellow-axis", lambda: elementwise((64,)), CPU, [Opt(U, 0, 4)], Opt(R, 0, 2), r"UNROLL.*already upcast"),
  ("unroll-over-32", lambda: matmul(16, 16, 64), GPU, [], Opt(R, 0, 64), r"UNROLL.*over 32"),
  ("unroll-whole-axis-over-32", lambda: matmul(16, 16, 64), CPU, [], Opt(R, 0, 0), r"UNROLL.*over 32"),
  ("unroll-white-axis", image_reduce, GPU, [Opt(G, 0, 4), Opt(OptOps.UPCASTMID, 0, 4)], Opt(R, 1, 2), r"UNROLL.*UPCASTMID"),
  ("unroll-non-divisor", lambda: matmul(16, 16, 16), CPU, [], Opt(R, 0, 3), r"does not divide"),
  # LOCAL
  ("local-on-cpu", lambda: matmul(16, 16, 16), CPU, [], Opt(L, 0, 4), r"LOCAL.*no local"),
  ("local-red-axis", lambda: matmul(16, 16, 16), GPU, [], Opt(L, 2, 4), r"LOCAL.*not a global axis"),
  ("local-cyan-axis", lambda: matmul(16, 16, 16), GPU, [Opt(L, 0, 4)], Opt(L, 2, 2), r"LOCAL.*not a global axis"),
  ("local-green-axis", lambda: matmul(16, 16, 16), GPU, [Opt(G, 0, 4)], Opt(L, 2, 2), r"LOCAL.*not a global axis"),
  ("local-yellow-axis", lambda: matmul(16, 16, 16), GPU, [Opt(U, 0, 4)], Opt(L, 3, 2), r"LOCAL.*not a global axis"),
  ("local-non-divisor", lambda: matmul(16, 16, 16), GPU, [], Opt(L, 0, 5), r"does not divide"),
  ("local-after-nolocals", lambda: matmul(16, 16, 16), GPU, [Opt(NL, 0, 0)], Opt(L, 0, 4), r"LOCAL.*NOLOCALS"),
  # GROUP / GROUPTOP
  ("group-on-cpu", lambda: rowreduce(4, 256), CPU, [], Opt(G, 0, 16), r"GROUP.*no local memory"),
  ("grouptop-on-cpu", lambda: rowreduce(4, 256), CPU, [], Opt(GT, 0, 16), r"GROUPTOP.*no local memory"),
  ("group-no-shared", lambda: rowreduce(4, 256), "noshared", [], Opt(G, 0, 16), r"GROUP.*no local memory"),
  ("group-yellow-axis", lambda: elementwise((64,)), GPU, [Opt(U, 0, 4)], Opt(G, 0, 2), r"GROUP.*not a reduce axis"),
  ("group-magenta-axis", lambda: matmul(16, 16, 16), GPU, [Opt(R, 0, 4)], Opt(G, 1, 2), r"GROUP.*not a reduce axis"),
  ("grouptop-magenta-axis", lambda: matmul(16, 16, 16), GPU, [Opt(R, 0, 4)], Opt(GT, 1, 2), r"GROUPTOP.*not a reduce axis"),
  ("group-two-reduces", lambda: two_reduces(64), GPU, [], Opt(G, 0, 4), r"GROUP.*one reduce"),
  ("grouptop-two-reduces", lambda: two_reduces(64), GPU, [], Opt(GT, 0, 4), r"GROUPTOP.*one reduce"),
  ("group-over-shared-max", lambda: rowreduce(4, 256), tiny_shared(32), [], Opt(G, 0, 16), r"shared_max"),
  ("grouptop-over-shared-max", lambda: rowreduce(4, 256), tiny_shared(32), [], Opt(GT, 0, 16), r"shared_max"),
  ("group-shared-counts-locals", lambda: rowreduce(64, 256), tiny_shared(64), [Opt(L, 0, 4)], Opt(G, 0, 8), r"shared_max"),
  ("group-shared-counts-upcasts", lambda: rowreduce(64, 256), tiny_shared(64), [Opt(U, 0, 4)], Opt(G, 0, 8), r"shared_max"),
  ("group-non-divisor", lambda: rowreduce(4, 256), GPU, [], Opt(G, 0, 3), r"does not divide"),
  ("group-after-nolocals", lambda: rowreduce(4, 256), GPU, [Opt(NL, 0, 0)], Opt(G, 0, 4), r"GROUP.*NOLOCALS"),
  # NOLOCALS
  ("nolocals-after-local", lambda: matmul(16, 16, 16), GPU, [Opt(L, 0, 4)], Opt(NL, 0, 0), r"NOLOCALS.*after locals"),
  ("nolocals-after-group", lambda: matmul(16, 16, 16), GPU, [Opt(G, 0, 4)], Opt(NL, 0, 0), r"NOLOCALS.*after locals"),
  ("nolocals-twice", lambda: matmul(16, 16, 16), GPU, [Opt(NL, 0, 0)], Opt(NL, 0, 0), r"NOLOCALS already applied"),
  ("nolocals-on-cpu", lambda: matmul(16, 16, 16), CPU, [], Opt(NL, 0, 0), r"NOLOCALS.*no local"),
  # PADTO
  ("padto-upcast-axis", lambda: elementwise((64,)), CPU, [Opt(U, 0, 4)], Opt(PAD, 1, 8), r"PADTO.*upcast"),
  ("padto-magenta-axis", lambda: matmul(16, 16, 16), GPU, [Opt(R, 0, 4)], Opt(PAD, 3, 8), r"PADTO.*upcast"),
  ("padto-max-reduce-axis", lambda: rowreduce(4, 25, ReduceOps.MAX), GPU, [], Opt(PAD, 1, 32), r"PADTO.*SUM"),
  ("padto-two-reduces-one-max", lambda: two_reduces(100), GPU, [], Opt(PAD, 0, 128), r"PADTO.*SUM"),
  ("padto-exp2", lambda: rowreduce(4, 25, pre=UnaryOps.EXP2), GPU, [], Opt(PAD, 1, 32), r"PADTO.*unsafe"),
  ("padto-log2", lambda: rowreduce(4, 25, pre=UnaryOps.LOG2), GPU, [], Opt(PAD, 1, 32), r"PADTO.*unsafe"),
  ("padto-recip", lambda: rowreduce(4, 25, pre=UnaryOps.RECIP), CPU, [], Opt(PAD, 1, 32), r"PADTO.*unsafe"),
  ("padto-idiv", lambda: idiv_sum(4, 25), GPU, [], Opt(PAD, 1, 32), r"PADTO.*unsafe"),
  ("padto-over-4x", lambda: matmul(3, 16, 16), GPU, [], Opt(PAD, 0, 16), r"PADTO.*4x"),
  ("padto-over-4x-reduce", lambda: matmul(16, 16, 3), CPU, [], Opt(PAD, 2, 13), r"PADTO.*4x"),
  ("padto-over-4x-huge", lambda: elementwise((64,)), CPU, [], Opt(PAD, 0, 1000), r"PADTO.*4x"),
  ("padto-amount-1", lambda: matmul(25, 16, 16), GPU, [], Opt(PAD, 0, 1), r"PADTO.*amount"),
  # SWAP
  ("swap-with-reduce-axis", lambda: matmul(16, 16, 16), GPU, [], Opt(SW, 0, 2), r"SWAP.*global_dims"),
  ("swap-with-local-axis", lambda: matmul(16, 16, 16), GPU, [Opt(L, 1, 4)], Opt(SW, 0, 2), r"SWAP.*global_dims"),
  ("swap-axis-ge-amt", lambda: matmul(16, 16, 16), GPU, [], Opt(SW, 1, 0), r"SWAP.*axis < amt"),
  ("swap-axis-eq-amt", lambda: matmul(16, 16, 16), GPU, [], Opt(SW, 1, 1), r"SWAP.*axis < amt"),
  ("swap-amt-out-of-range", lambda: matmul(16, 16, 16), GPU, [], Opt(SW, 0, 7), r"SWAP"),
  ("swap-amt-none", lambda: matmul(16, 16, 16), GPU, [], Opt(SW, 0, None), r"SWAP"),
  # BLOCK (CPU reduce blocking; more in tests/codegen/test_heuristics_cpu.py)
  ("block-on-gpu", lambda: matmul(16, 16, 64), GPU, [], Opt(OptOps.BLOCK, 0, 16), r"BLOCK.*CPU"),
  ("block-whole-axis", lambda: matmul(16, 16, 64), CPU, [], Opt(OptOps.BLOCK, 0, 64), r"BLOCK.*whole axis"),
  ("block-twice", lambda: matmul(16, 16, 64), CPU, [Opt(OptOps.BLOCK, 0, 16)], Opt(OptOps.BLOCK, 1, 4), r"BLOCK.*already blocked"),
  ("block-not-reduce", lambda: matmul(16, 16, 64), CPU, [Opt(R, 0, 4)], Opt(OptOps.BLOCK, 1, 2), r"BLOCK.*not a \(serial\) reduce axis"),
  # dependent reduces (a reduce reading another's result): no padding of the reduce, no grouping, no blocks, no tensor cores
  ("padto-dependent-reduce", lambda: variance(4, 25), CPU, [], Opt(PAD, 1, 32), r"PADTO: a reduce reads another reduce's result"),
  ("padto-dependent-reduce-unsafe", lambda: softmax_stats(4, 25), GPU, [], Opt(PAD, 1, 32), r"PADTO.*(MAX|f\(0\))"),
  ("group-dependent-reduce", lambda: softmax_stats(4, 64), GPU, [], Opt(G, 0, 4), r"GROUP.*exactly one reduce"),
  ("block-dependent-reduce", lambda: variance(4, 64), CPU, [], Opt(OptOps.BLOCK, 0, 16), r"BLOCK.*exactly one SUM"),
  # PACK (more in tests/codegen/test_pack.py)
  ("pack-on-gpu", lambda: matmul(16, 16, 64), GPU, [Opt(SW, 0, 1)], Opt(OptOps.PACK, 2, 0), r"PACK.*CPU"),
  ("pack-varies-inside", lambda: matmul(16, 16, 64), CPU, [], Opt(OptOps.PACK, 2, 0), r"PACK.*varies along output axis 1"),
  ("pack-output", lambda: matmul(16, 16, 64), CPU, [Opt(SW, 0, 1)], Opt(OptOps.PACK, 0, 0), r"PACK.*no input buffer 0"),
  # TC
  ("tc-no-tensor-cores-gpu", lambda: matmul(16, 16, 16), GPU, [], Opt(OptOps.TC, 0, 0), r"TC.*tensor cores"),
  ("tc-no-tensor-cores-cpu", lambda: matmul(16, 16, 16), CPU, [], Opt(OptOps.TC, 0, 0), r"TC.*tensor cores"),
  ("tc-not-first", lambda: matmul(16, 16, 16), GPU, [Opt(U, 0, 4)], Opt(OptOps.TC, 0, 0), r"TC must be the first opt"),
  # UPCASTMID outside its image case
  ("upcastmid-not-image", lambda: matmul(16, 16, 16), GPU, [Opt(G, 0, 4)], Opt(OptOps.UPCASTMID, 0, 4), r"UPCASTMID.*image"),
  ("upcastmid-not-image-cpu", lambda: elementwise((64,)), CPU, [], Opt(OptOps.UPCASTMID, 0, 4), r"UPCASTMID.*image"),
  ("upcastmid-image-ungrouped", image_reduce, GPU, [], Opt(OptOps.UPCASTMID, 0, 4), r"UPCASTMID"),
  ("upcastmid-image-amt-2", image_reduce, GPU, [Opt(G, 0, 4)], Opt(OptOps.UPCASTMID, 0, 2), r"UPCASTMID"),
  # axis numbers
  ("upcast-negative-axis", lambda: matmul(16, 16, 16), GPU, [], Opt(U, -1, 4), r"axis must be a non-negative int"),
  ("unroll-negative-axis", lambda: matmul(16, 16, 16), GPU, [], Opt(R, -1, 4), r"axis must be a non-negative int"),
  ("local-negative-axis", lambda: matmul(16, 16, 16), GPU, [], Opt(L, -2, 4), r"axis must be a non-negative int"),
  ("group-negative-axis", lambda: matmul(16, 16, 16), GPU, [], Opt(G, -1, 4), r"axis must be a non-negative int"),
  ("padto-negative-axis", lambda: matmul(25, 16, 16), GPU, [], Opt(PAD, -1, 32), r"axis must be a non-negative int"),
  ("swap-negative-axis", lambda: matmul(16, 16, 16), GPU, [], Opt(SW, -1, 1), r"axis must be a non-negative int"),
  ("upcast-axis-out-of-range", lambda: matmul(16, 16, 16), GPU, [], Opt(U, 5, 4), r"out of range"),
  ("local-axis-out-of-range", lambda: matmul(16, 16, 16), GPU, [], Opt(L, 3, 4), r"out of range"),
  ("padto-axis-out-of-range", lambda: matmul(16, 16, 16), GPU, [], Opt(PAD, 3, 32), r"out of range"),
  ("unroll-axis-out-of-range", lambda: matmul(16, 16, 16), GPU, [], Opt(R, 1, 4), r"out of range"),
  ("group-axis-out-of-range", lambda: matmul(16, 16, 16), GPU, [], Opt(G, 1, 4), r"out of range"),
  ("group-elementwise", lambda: elementwise((64,)), GPU, [], Opt(G, 0, 4), r"out of range"),
  ("unroll-elementwise", lambda: elementwise((64,)), CPU, [], Opt(R, 0, 4), r"out of range"),
  ("upcast-axis-none", lambda: matmul(16, 16, 16), GPU, [], Opt(U, None, 4), r"axis must be a non-negative int"),
  ("local-axis-float", lambda: matmul(16, 16, 16), GPU, [], Opt(L, 0.0, 4), r"axis must be a non-negative int"),
  ("upcast-axis-str", lambda: matmul(16, 16, 16), GPU, [], Opt(U, "0", 4), r"axis must be a non-negative int"),
  # amount types
  ("upcast-amt-float", lambda: matmul(16, 16, 16), GPU, [], Opt(U, 0, 4.0), r"amount must be a non-negative int"),
  ("upcast-amt-str", lambda: matmul(16, 16, 16), GPU, [], Opt(U, 0, "4"), r"amount must be a non-negative int"),
  ("upcast-amt-none", lambda: matmul(16, 16, 16), GPU, [], Opt(U, 0, None), r"amount must be a non-negative int"),
  ("upcast-amt-negative", lambda: matmul(16, 16, 16), GPU, [], Opt(U, 0, -4), r"amount must be a non-negative int"),
  ("unroll-amt-float", lambda: matmul(16, 16, 16), CPU, [], Opt(R, 0, 2.5), r"amount must be a non-negative int"),
  ("local-amt-negative", lambda: matmul(16, 16, 16), GPU, [], Opt(L, 0, -2), r"amount must be a non-negative int"),
  ("group-amt-none", lambda: matmul(16, 16, 16), GPU, [], Opt(G, 0, None), r"amount must be a non-negative int"),
  ("padto-amt-float", lambda: matmul(25, 16, 16), GPU, [], Opt(PAD, 0, 32.0), r"amount must be a non-negative int"),
  ("upcast-amt-1", lambda: matmul(16, 16, 16), GPU, [], Opt(U, 0, 1), r"UPCAST.*amount 1"),
  ("unroll-amt-1", lambda: matmul(16, 16, 16), GPU, [], Opt(R, 0, 1), r"UNROLL.*amount 1"),
  ("group-amt-1", lambda: matmul(16, 16, 16), GPU, [], Opt(G, 0, 1), r"GROUP.*amount 1"),
  # not an Opt at all
  ("op-not-optops", lambda: matmul(16, 16, 16), GPU, [], Opt("UPCAST", 0, 4), r"not an Opt"),
  ("not-an-opt", lambda: matmul(16, 16, 16), GPU, [], (OptOps.UPCAST, 0, 4), r"not an Opt"),
]

def _renderer(r):
  if r == "noshared":  # locals but no shared memory
    r = copy.copy(GPU)
    r.has_shared = False
  return r

@pytest.mark.parametrize("build,renderer,pre,opt,match", [pytest.param(*x[1:], id=x[0]) for x in REFUSALS])
def test_refused(build, renderer, pre, opt, match):
  k = make(build(), _renderer(renderer), pre)
  assert_refused(k, opt, match)

def test_refusal_table_covers_every_optop():
  """Each OptOp has at least one pinned refusal."""
  ops = {x[4].op for x in REFUSALS if isinstance(x[4], Opt) and isinstance(x[4].op, OptOps)}
  assert ops == set(OptOps)

# ---- the refusal is specific: the neighbouring legal opt is accepted ------------------------------

ACCEPTED = [
  ("upcast-16", lambda: elementwise((64,)), GPU, [], Opt(U, 0, 16)),
  ("upcast-whole-axis-16", lambda: elementwise((16,)), CPU, [], Opt(U, 0, 0)),
  ("unroll-32", lambda: matmul(16, 16, 64), GPU, [], Opt(R, 0, 32)),
  ("unroll-whole-axis-32", lambda: matmul(16, 16, 32), CPU, [], Opt(R, 0, 0)),
  ("unroll-after-upcast", lambda: matmul(16, 16, 16), CPU, [Opt(U, 0, 4)], Opt(R, 0, 4)),
  ("local-on-gpu", lambda: matmul(16, 16, 16), GPU, [], Opt(L, 0, 4)),
  ("group-at-shared-max", lambda: rowreduce(4, 256), tiny_shared(64), [], Opt(G, 0, 16)),
  ("grouptop-at-shared-max", lambda: rowreduce(4, 256), tiny_shared(64), [], Opt(GT, 0, 16)),
  ("nolocals-fresh", lambda: matmul(16, 16, 16), GPU, [], Opt(NL, 0, 0)),
  ("upcast-after-nolocals", lambda: matmul(16, 16, 16), GPU, [Opt(NL, 0, 0)], Opt(U, 0, 4)),
  ("padto-global-of-max-kernel", lambda: rowreduce(5, 25, ReduceOps.MAX), GPU, [], Opt(PAD, 0, 8)),
  ("padto-global-of-exp2-kernel", lambda: rowreduce(5, 25, pre=UnaryOps.EXP2), GPU, [], Opt(PAD, 0, 8)),
  ("padto-sum-reduce-axis", lambda: matmul(16, 16, 25), GPU, [], Opt(PAD, 2, 32)),
  ("padto-exactly-4x", lambda: matmul(8, 16, 16), GPU, [], Opt(PAD, 0, 32)),
  ("padto-cpu", lambda: matmul(25, 16, 16), CPU, [], Opt(PAD, 0, 32)),
  ("swap-globals", lambda: matmul(16, 8, 16), GPU, [], Opt(SW, 0, 1)),
  ("group-single-reduce", lambda: rowreduce(4, 256), GPU, [], Opt(G, 0, 16)),
  ("unroll-green-axis", lambda: matmul(16, 16, 16), GPU, [Opt(G, 0, 4)], Opt(R, 0, 2)),  # UNROLL counts from first_reduce
  ("second-group", lambda: rowreduce(4, 256), GPU, [Opt(G, 0, 16)], Opt(GT, 0, 4)),
  ("second-group-at-shared-max", lambda: rowreduce(4, 256), tiny_shared(64), [Opt(G, 0, 4)], Opt(GT, 0, 4)),
]

@pytest.mark.parametrize("build,renderer,pre,opt", [pytest.param(*x[1:], id=x[0]) for x in ACCEPTED])
def test_accepted(build, renderer, pre, opt):
  k = make(build(), renderer, pre)
  n = len(k.applied_opts)
  k.apply_opt(opt)
  assert k.applied_opts[-1] == opt and len(k.applied_opts) == n + 1 and len(k.applied_opts_reasons) == n + 1

# ---- PADTO with symbolic shapes -------------------------------------------------------------------

def symbolic_rowsum():
  n = Variable("n", 1, 64)
  return kernel(LazyOp(ReduceOps.SUM, (load(1, ShapeTracker.from_shape((n, 16))),), (1,)), (n, 1))

@pytest.mark.parametrize("axis", [0, 1], ids=["symbolic-axis", "int-axis"])
@pytest.mark.parametrize("renderer", [CPU, GPU], ids=["cpu", "gpu"])
def test_padto_symbolic_refused(renderer, axis):
  """Any axis, even an int-sized one, is refused while the kernel has a symbolic shape."""
  k = make(symbolic_rowsum(), renderer)
  assert not isinstance(k.full_shape[0], int)
  assert_refused(k, Opt(PAD, axis, 32), r"PADTO.*symbolic")

def test_symbolic_axis_non_padto_refusals():
  k = make(symbolic_rowsum(), GPU)
  assert_refused(k, Opt(U, 0, 4), r"UPCAST.*symbolic")
  assert_refused(k, Opt(L, 0, 4), r"LOCAL.*symbolic")

# ---- shared_max is honoured whatever the order of opts -------------------------------------------

def _local_buffer_bytes(k):
  ast = k.get_optimized_ast()
  return max([x.arg.st.size * x.arg.dtype.itemsize for x in ast.lazyops if x.op is BufferOps.STORE and x.arg.idx < 0] or [0])

@pytest.mark.parametrize("opt", [Opt(L, 0, 4), Opt(U, 0, 4), Opt(PAD, 1, 32)], ids=["local", "upcast", "padto-green"])
def test_shared_max_after_group(opt):
  k = make(rowreduce(64, 256), tiny_shared(32), [Opt(G, 0, 8)])
  assert _local_buffer_bytes(k) == 32
  try: k.apply_opt(opt)
  except KernelOptError: return
  assert _local_buffer_bytes(k) <= 32, f"{opt} after GROUP needs {_local_buffer_bytes(k)} bytes of local memory, shared_max is 32"

# ---- bools are not ints here ----------------------------------------------------------------------

def test_bool_amount_refused():
  k = make(elementwise((8,)), CPU)
  assert_refused(k, Opt(U, 0, False), r"amount")

def test_bool_axis_refused():
  k = make(matmul(16, 16, 16), GPU)
  assert_refused(k, Opt(U, True, 4), r"axis")

# ---- UPCASTMID: its image case ---------------------------------------------------------------------

def test_upcastmid_image_case_is_reachable():
  """On a grouped reduce with an image output, some UPCASTMID by 4 is accepted and makes a white axis."""
  k = make(image_reduce(), GPU, [Opt(G, 0, 4)])
  accepted = []
  for axis in range(k.shape_len):
    kk = k.copy()
    try: kk.apply_opt(Opt(OptOps.UPCASTMID, axis, 4))
    except KernelOptError: continue
    accepted.append(kk)
  assert accepted and all("white" in kk.colors() for kk in accepted)

# ---- copy() independence --------------------------------------------------------------------------

def test_copy_is_independent():
  k = make(matmul(16, 16, 16), GPU, [Opt(U, 0, 4)])
  before = snapshot(k)
  c = k.copy()
  assert snapshot(c) == before
  for o in [Opt(L, 0, 2), Opt(G, 0, 4), Opt(R, 1, 2), Opt(U, 1, 2)]: c.apply_opt(o, reason="on the copy")
  assert snapshot(k) == before
  # and the other way around
  c_before = snapshot(c)
  for o in [Opt(NL, 0, 0), Opt(R, 0, 4), Opt(PAD, 0, 8)]: k.apply_opt(o)
  assert snapshot(c) == c_before
  assert k.applied_opts != c.applied_opts and k.applied_opts_reasons != c.applied_opts_reasons

def test_copy_of_fresh_kernel_refusal_does_not_leak():
  k = make(matmul(16, 16, 16), GPU)
  before = snapshot(k)
  c = k.copy()
  assert_refused(c, Opt(U, 2, 4), r"reduce axis")
  c.apply_opt(Opt(L, 0, 4))
  assert snapshot(k) == before

def test_refused_kernel_still_usable():
  """After a refusal the kernel takes further opts and renders."""
  k = make(matmul(16, 16, 16), GPU)
  for bad in [Opt(U, 2, 4), Opt(U, 0, 32), Opt(SW, 1, 0), Opt(OptOps.TC, 0, 0)]:
    with pytest.raises(KernelOptError): k.apply_opt(bad)
  k.apply_opt(Opt(U, 0, 4))
  k.apply_opt(Opt(L, 0, 2))
  assert k.applied_opts == [Opt(U, 0, 4), Opt(L, 0, 2)]
  assert k.to_program().src

def test_refusal_message_names_the_opt():
  """Every refusal message says which rule: for opts with an axis it starts with the op's name (or names shared_max)."""
  k = make(matmul(16, 16, 16), GPU)
  for opt in [Opt(U, 2, 4), Opt(R, 1, 4), Opt(L, 2, 4), Opt(G, 5, 4), Opt(PAD, 9, 4), Opt(SW, 0, 5)]:
    with pytest.raises(KernelOptError) as e: k.apply_opt(opt)
    assert opt.op.name in str(e.value)

def test_a_bug_inside_an_opt_is_not_disguised_as_a_refusal(monkeypatch):
  """Only KernelOptError means "refused"; any other exception is a bug and surfaces as itself (a
  search would otherwise silently skip a broken opt), with the kernel still handed back unchanged."""
  k = make(matmul(16, 16, 16), GPU, [Opt(U, 0, 4)])
  before = snapshot(k)
  real = Kernel._apply_opt
  def broken(self, opt):
    real(self, opt)  # half-applied, then a bug
    raise ZeroDivisionError("bug in the opt")
  monkeypatch.setattr(Kernel, "_apply_opt", broken)
  with pytest.raises(ZeroDivisionError): k.apply_opt(Opt(U, 1, 2))
  assert snapshot(k) == before
