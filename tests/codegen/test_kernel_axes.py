"""Kernel.upcasted_axis(i) and Kernel.float4_axis(i) (DESIGN §5): per buffer, what the upcast region
looks like (sizes, strides, which axes are reduce axes) and along which upcast axes a buffer is
contiguous in groups of 4 (where a float4 load or store can serve four lanes)."""
from tilecraft.codegen.kernel import Kernel, Opt, OptOps
from tilecraft.dtype import dtypes
from tilecraft.ops import BinaryOps, BufferOps, LazyOp, MemBuffer, MetaOps, ReduceOps
from tilecraft.renderer.cstyle import CRenderer
from tilecraft.shape.shapetracker import ShapeTracker

def _matmul(M: int, N: int, K: int) -> LazyOp:
  a = ShapeTracker.from_shape((M, K)).reshape((M, 1, K)).expand((M, N, K))
  b = ShapeTracker.from_shape((K, N)).permute((1, 0)).reshape((1, N, K)).expand((M, N, K))
  ld = lambda i, st: LazyOp(BufferOps.LOAD, (), MemBuffer(i, dtypes.float32, st))  # noqa: E731
  red = LazyOp(ReduceOps.SUM, (LazyOp(BinaryOps.MUL, (ld(1, a), ld(2, b))),), (2,))
  return LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (red,), MemBuffer(0, dtypes.float32, ShapeTracker.from_shape((M, N, 1)))),))

def _kernel(opts: list[Opt], M: int = 8, N: int = 16, K: int = 32) -> Kernel:
  k = Kernel(_matmul(M, N, K), CRenderer())
  for o in opts: k.apply_opt(o)
  return k

def test_upcasted_axis_sizes_strides_and_reduce_flags():
  # out[m, n] = sum_k a[m, k] b[k, n] with m, n upcast by 4 and k unrolled by 4
  k = _kernel([Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UNROLL, 0, 4)])
  n_up = k.shape_len - k.first_upcast
  assert n_up == 3
  for i in range(len(k.bufs)):
    ua = k.upcasted_axis(i)
    # sizes as buffer i's view sees them: the output's view has size 1 on reduce axes
    assert [s for s, _, _ in ua] == list((k.output_shape if i == 0 else k.full_shape)[k.first_upcast:])
    assert sorted(r for _, _, r in ua) == [False, False, True]  # two output axes, one unrolled reduce axis
  # which upcast axis is which: the reduce flag marks k; buffer 2 (b[k, n]) moves along n by 1
  up = k.full_shape[k.first_upcast:]
  kax = next(j for j, (_, _, r) in enumerate(k.upcasted_axis(0)) if r)
  strides = {i: [st for _, st, _ in k.upcasted_axis(i)] for i in range(3)}
  nax = strides[2].index(1)
  max_ = ({0, 1, 2} - {kax, nax}).pop()
  assert up[kax] == up[nax] == up[max_] == 4
  assert strides[0][kax] == 0 and strides[0][nax] == 1 and strides[0][max_] == 16  # out[m, n]: row stride N
  assert strides[1][kax] == 1 and strides[1][nax] == 0 and strides[1][max_] == 32  # a[m, k]: row stride K
  assert strides[2][kax] == 16 and strides[2][max_] == 0                           # b[k, n]: row stride N

def test_float4_axis():
  k = _kernel([Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UNROLL, 0, 4)])
  strides = {i: [st for _, st, _ in k.upcasted_axis(i)] for i in range(3)}
  for i in range(3): assert k.float4_axis(i) == [j for j, st in enumerate(strides[i]) if st == 1], i
  assert all(len(k.float4_axis(i)) == 1 for i in range(3))
  # an upcast of 2 along a contiguous axis is not a group of 4; without upcasts there is nothing to group
  assert _kernel([Opt(OptOps.UPCAST, 1, 2)]).float4_axis(0) == []
  assert _kernel([]).float4_axis(0) == [] and _kernel([]).upcasted_axis(0) == []
