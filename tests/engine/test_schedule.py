"""The scheduler's fusion, seen from the frontend (engine/schedule.py; docs/architecture.md, step 2): how many kernels common expressions
take (`len(t.schedule())`), that identical subgraphs and values read many times are computed once,
that realized values are read rather than recomputed, and the ScheduleItem API (`.ast`, `.bufs`,
outputs first). Every count is also checked against numpy, so a fused kernel must be a right one."""
from __future__ import annotations
from typing import Any
import numpy as np
import pytest
from tilecraft import Context, Tensor, dtypes
from tilecraft.ops import BufferOps, MetaOps, ReduceOps, UnaryOps
from tilecraft.engine import plan_cache

def T(rng: np.random.Generator, *shape: int) -> tuple[Tensor, np.ndarray]:
  a = rng.uniform(-2, 2, shape).astype(np.float32)
  return Tensor(a), a

def n_kernels(t: Tensor) -> int:
  return sum(1 for si in t.schedule() if si.ast.op is MetaOps.KERNEL)

def count_ops(t: Tensor, op: Any) -> int:
  """How many distinct `op` nodes all of t's kernels hold."""
  return sum(1 for si in t.schedule() for x in si.ast.lazyops if x.op is op)

def close(t: Tensor, want: np.ndarray, tol: float = 1e-5) -> None:
  np.testing.assert_allclose(t.numpy(), want, rtol=tol, atol=tol)

# ---- the fusion counts (issue 5) ------------------------------------------------------------------------

def test_elementwise_chain_is_one_kernel(rng: np.random.Generator) -> None:
  (a, an), (b, bn), (c, cn) = T(rng, 4, 5), T(rng, 4, 5), T(rng, 5)
  out = (a * b + c).relu()
  assert n_kernels(out) == 1
  close(out, np.maximum(an * bn + cn, 0))

def test_reduce_with_elementwise_after_is_one_kernel(rng: np.random.Generator) -> None:
  (x, xn) = T(rng, 6, 7)
  out = (x.sum(1) * 2 + 1).exp()
  assert n_kernels(out) == 1
  close(out, np.exp(xn.sum(1) * 2 + 1), 1e-4)
  out2 = (x * 3).abs().max(0, keepdim=True).sqrt()  # elementwise before and after
  assert n_kernels(out2) == 1
  close(out2, np.sqrt(np.abs(xn * 3).max(0, keepdims=True)))

def test_matmul_bias_relu_is_one_kernel(rng: np.random.Generator) -> None:
  (a, an), (w, wn), (b, bn) = T(rng, 5, 6), T(rng, 6, 3), T(rng, 3)
  out = (a @ w + b).relu()
  assert n_kernels(out) == 1
  close(out, np.maximum(an @ wn + bn, 0))

def test_softmax_kernels(rng: np.random.Generator) -> None:
  (x, xn) = T(rng, 4, 9)
  out = x.softmax(1)
  assert n_kernels(out) <= 3
  e = np.exp(xn - xn.max(1, keepdims=True))
  close(out, e / e.sum(1, keepdims=True))

def test_conv_bias_relu_is_one_kernel(rng: np.random.Generator) -> None:
  (x, xn), (w, wn), (b, bn) = T(rng, 1, 2, 6, 6), T(rng, 3, 2, 3, 3), T(rng, 3)
  for kw in ({}, {"stride": 2, "padding": 1}):
    out = x.conv2d(w, b, **kw).relu()
    assert n_kernels(out) == 1, kw
  out = x.conv2d(w, b).relu().numpy()
  want = np.zeros((1, 3, 4, 4), np.float32)
  for o in range(3):
    for i in range(4):
      for j in range(4): want[0, o, i, j] = (xn[0, :, i:i + 3, j:j + 3] * wn[o]).sum() + bn[o]
  np.testing.assert_allclose(out, np.maximum(want, 0), rtol=1e-4, atol=1e-4)

def test_layernorm_kernels(rng: np.random.Generator) -> None:
  (x, xn) = T(rng, 3, 8)
  out = x.layernorm()
  assert n_kernels(out) <= 3
  close(out, (xn - xn.mean(-1, keepdims=True)) / np.sqrt(xn.var(-1, keepdims=True) + 1e-5), 1e-4)

@pytest.mark.parametrize("view", ["pad", "shrink", "flip", "pad+shrink+flip", "getitem"])
def test_sum_of_a_view_is_one_kernel(rng: np.random.Generator, view: str) -> None:
  (x, xn) = T(rng, 5, 6)
  t, n = {"pad": (x.pad(((1, 2), (0, 3))), np.pad(xn, ((1, 2), (0, 3)))), "shrink": (x.shrink(((1, 4), (2, 5))), xn[1:4, 2:5]),
          "flip": (x.flip((0, 1)), xn[::-1, ::-1]), "pad+shrink+flip": (x.pad(((2, 0), (0, 1))).shrink(((1, 6), (1, 7))).flip(1), np.pad(xn, ((2, 0), (0, 1)))[1:6, 1:7][:, ::-1]),
          "getitem": (x[::2, ::-3], xn[::2, ::-3])}[view]
  assert n_kernels(t.sum()) == 1
  close(t.sum(), n.sum(), 1e-4)
  assert n_kernels((t * 2).sum(1)) == 1

# ---- computing things once ---------------------------------------------------------------------------------

def test_identical_subgraphs_are_computed_once(rng: np.random.Generator) -> None:
  (a, an), (b, bn) = T(rng, 4, 5), T(rng, 4, 5)
  e1, e2 = (a * b).exp(), (a * b).exp()  # built twice, independently
  assert e1.lazydata is e2.lazydata  # the frontend shares one node
  out = e1 + e2.sqrt()
  assert n_kernels(out) == 1 and count_ops(out, UnaryOps.EXP2) == 1
  close(out, np.exp(an * bn) + np.sqrt(np.exp(an * bn)), 1e-4)
  m1, m2 = a.max(1, keepdim=True), a.max(1, keepdim=True)
  out2 = ((a - m1) * (b + m2)).sum(1)
  assert count_ops(out2, ReduceOps.MAX) == 1  # the max runs once
  assert n_kernels(out2) <= 2
  close(out2, ((an - an.max(1, keepdims=True)) * (bn + an.max(1, keepdims=True))).sum(1), 1e-4)
  assert (a + 1).lazydata is not (a + 2).lazydata and (a + 1).lazydata is not (b + 1).lazydata

def test_a_reduce_read_twice_is_realized_once(rng: np.random.Generator) -> None:
  (x, xn) = T(rng, 5, 6)
  s = x.sum(1, keepdim=True)
  out = (x - s) * s.exp() + s  # s is read three times, through an expanding view
  sched = out.schedule()
  assert sum(1 for si in sched for op in si.ast.lazyops if op.op is ReduceOps.SUM) == 1
  assert len(sched) <= 3  # the sum; exp of it (an expanded computed value is stored); the output
  sn = xn.sum(1, keepdims=True)
  close(out, (xn - sn) * np.exp(sn) + sn, 1e-4)
  out2 = s.reshape(5) * 2 + s.reshape(5).exp()  # read twice at its own shape
  assert count_ops(out2, ReduceOps.SUM) <= 1 and n_kernels(out2) <= 2
  close(out2, sn.reshape(5) * 2 + np.exp(sn.reshape(5)), 1e-4)

def test_a_matmul_under_an_erf_gelu_is_computed_once(rng: np.random.Generator) -> None:
  """0.5 h (1 + erf(h / d)), h = x @ w + b and d a loaded scalar (an ONNX FFN as PyTorch exports it): the erf's pieces
  are values read many times, realized by the recompute rule after the reduce rule ran; the matmul they all read was
  then fused into two kernels (computed twice, BERT-like's FFN 2x slower). The reduce is realized once instead."""
  (x, xn), (w, wn), (b, bn) = T(rng, 16, 32), T(rng, 32, 48), T(rng, 48)
  d = Tensor(np.array([np.sqrt(2)], np.float32))
  h = x @ w + b
  out = h * 0.5 * (1 + (h / d).erf())
  assert count_ops(out, ReduceOps.SUM) == 1
  assert n_kernels(out) == 1  # (the erf's pieces, read many times but by this one kernel at their own elements, inline)
  import math
  hn = xn @ wn + bn
  close(out, hn * 0.5 * (1 + np.vectorize(math.erf)(hn / np.float32(np.sqrt(2)))), 1e-4)

def test_a_costly_value_read_through_two_views_in_one_kernel_is_stored(rng: np.random.Generator) -> None:
  """y[:-1] + y[1:] of a costly y (an erf): one kernel reads y, but at two elements per output, so inline each
  element of y would be computed twice; y is stored and read instead."""
  (x, xn) = T(rng, 65)
  y = x.erf()
  out = y[:-1] + y[1:]
  assert count_ops(out, UnaryOps.EXP2) == 1
  import math
  yn = np.vectorize(math.erf)(xn)
  close(out, yn[:-1] + yn[1:], 1e-5)

def _kernel_computing(sched: list, op: Any) -> list[int]:
  """The indices of the kernels whose AST holds `op`."""
  return [i for i, si in enumerate(sched) if any(x.op is op for x in si.ast.lazyops)]

def test_a_reduces_epilogue_read_by_two_kernels_is_stored_once(rng: np.random.Generator) -> None:
  """Squeeze-and-excitation over a depthwise conv: s = silu(conv(x) + b) is read by the pool (a reduce) and by the
  gating multiply (a kernel of its own: the next conv reads it expanded). The conv's kernel stores s, not the bare conv,
  so s's exp is computed once (in the conv's kernel), not again by the pool and by the multiply."""
  (x, xn), (w, wn), (b, bn) = T(rng, 1, 8, 10, 10), T(rng, 8, 1, 3, 3), T(rng, 8)
  h = x.conv2d(w, b, padding=1, groups=8)
  s = h * h.sigmoid()
  gate = s.mean((2, 3), keepdim=True).sigmoid()
  out = s * gate
  sched = out.schedule()
  assert len(sched) == 3
  conv_k, pool_k = _kernel_computing(sched, ReduceOps.SUM)[0], _kernel_computing(sched, ReduceOps.SUM)[1]
  exps = _kernel_computing(sched, UnaryOps.EXP2)
  assert conv_k in exps and exps == sorted({conv_k, pool_k})  # silu in the conv's kernel; the pool's sigmoid(mean) only
  assert sum(1 for x in sched[pool_k].ast.lazyops if x.op is UnaryOps.EXP2) == 1
  hn = np.zeros((1, 8, 10, 10), np.float32)
  xp = np.pad(xn, ((0, 0), (0, 0), (1, 1), (1, 1)))
  for i in range(3):
    for j in range(3): hn += xp[:, :, i:i + 10, j:j + 10] * wn[:, 0, i, j].reshape(1, 8, 1, 1)
  hn += bn.reshape(1, 8, 1, 1)
  sn = hn / (1 + np.exp(-hn))
  close(out, sn / (1 + np.exp(-sn.mean((2, 3), keepdims=True))), 1e-4)

def test_an_epilogue_is_not_stored_where_its_reduce_is_read_elsewhere(rng: np.random.Generator) -> None:
  """Where another kernel reads the reduce itself, or the epilogue's elements are wider than the reduce's, storing the
  epilogue would store more, not the same: the reduce is stored and each reader computes the epilogue, as before."""
  def exps(*ts: Tensor) -> int:
    return sum(1 for si in ts[0].schedule(*ts[1:]) for op in si.ast.lazyops if op.op is UnaryOps.EXP2)
  (x, xn) = T(rng, 6, 7)
  r, rn = x.sum(1), xn.sum(1)
  e = r.exp()
  assert exps(e.sum(), e * 3) == 1  # the rule: e stored (with r in its kernel), read by both
  total, mixed = e.sum(), e + r  # r read outside e
  assert exps(total, mixed) == 2
  total.realize(mixed)
  close(total, np.exp(rn).sum(), 1e-4)
  close(mixed, np.exp(rn) + rn, 1e-4)
  wide = r.cast(dtypes.float64).exp()  # 8-byte elements over a 4-byte reduce
  total64, scaled64 = wide.sum(), wide * 3
  assert exps(total64, scaled64) == 2
  total64.realize(scaled64)
  np.testing.assert_allclose(total64.numpy(), np.exp(rn.astype(np.float64)).sum(), rtol=1e-5)
  np.testing.assert_allclose(scaled64.numpy(), np.exp(rn.astype(np.float64)) * 3, rtol=1e-5)

def test_realized_values_are_not_recomputed(rng: np.random.Generator) -> None:
  (x, xn) = T(rng, 4, 4)
  s = x.exp().sum(0)
  s.realize()
  assert s.schedule() == []
  later = s * 2 + 1
  assert n_kernels(later) == 1 and count_ops(later, ReduceOps.SUM) == 0 and count_ops(later, UnaryOps.EXP2) == 0
  close(later, np.exp(xn).sum(0) * 2 + 1, 1e-4)
  # an intermediate realized inside another schedule is reused too
  m = x.max(1, keepdim=True)
  y = (x - m).exp()
  y.realize()
  assert count_ops(m + 1, ReduceOps.MAX) == 0

def test_expanding_a_computed_value_realizes_it(rng: np.random.Generator) -> None:
  (x, xn) = T(rng, 3, 4)
  e = x.exp()
  out = e.reshape(1, 3, 4).expand(5, 3, 4) * 2
  assert n_kernels(out) == 2  # exp once, then the broadcast read of its buffer
  close(out, np.broadcast_to(np.exp(xn) * 2, (5, 3, 4)), 1e-5)

def test_cheap_values_are_recomputed_not_stored(rng: np.random.Generator) -> None:
  (x, xn) = T(rng, 3, 4)
  y = x * 2 + 5
  out = y * y + y.sqrt()  # read three times by one kernel: cheaper to recompute than to store
  assert n_kernels(out) == 1
  close(out, (xn * 2 + 5) ** 2 + np.sqrt(xn * 2 + 5), 1e-5)

def test_noopt_does_not_change_the_schedule(rng: np.random.Generator) -> None:
  (a, an), (w, wn) = T(rng, 4, 6), T(rng, 6, 5)
  out = (a @ w).relu().softmax()
  n = n_kernels(out)
  with Context(NOOPT=1):
    assert n_kernels(out) == n
    z = np.maximum(an @ wn, 0)
    e = np.exp(z - z.max(1, keepdims=True))
    close(out, e / e.sum(1, keepdims=True), 1e-5)

# ---- ScheduleItem -----------------------------------------------------------------------------------------

def test_schedule_items_api(rng: np.random.Generator) -> None:
  (a, an), (b, bn) = T(rng, 3, 4), T(rng, 4)
  sched = (a * b).sum(1).schedule()
  assert len(sched) == 1
  si = sched[0]
  assert si.ast.op is MetaOps.KERNEL and all(s.op is BufferOps.STORE for s in si.ast.src)
  out, *ins = si.bufs
  assert out.size == 3 and out.dtype == dtypes.float32  # outputs first
  assert {id(x) for x in ins} == {id(a.lazydata.base.buffer), id(b.lazydata.base.buffer)}
  assert [o.arg.idx for o in si.ast.lazyops if o.op is BufferOps.LOAD] and all(o.arg.idx >= 1 for o in si.ast.lazyops if o.op is BufferOps.LOAD)
  close((a * b).sum(1), (an * bn).sum(1))

def test_schedule_of_several_outputs(rng: np.random.Generator) -> None:
  (a, an) = T(rng, 3, 4)
  p, q = a + 1, a.sum(0)
  sched = p.schedule(q)
  assert len(sched) == 2
  p.realize(q)
  close(p, an + 1)
  close(q, an.sum(0))

def test_schedules_of_empty_and_constant_tensors() -> None:
  assert Tensor(np.zeros((0, 3), np.float32)).schedule() == []
  assert (Tensor(np.zeros((0, 3), np.float32)) + 1).schedule() == []
  assert Tensor(np.ones(3, np.float32)).schedule() == []
  assert n_kernels(Tensor.full((2, 2), 3.0).contiguous()) == 1

# ---- the lazy graph directly ------------------------------------------------------------------------------

def test_lazy_const_of_zero_size_shape() -> None:
  """A constant viewed to zero elements (a regression: this used to recurse without end)."""
  import sys
  from tilecraft.engine.lazy import LazyBuffer
  limit = sys.getrecursionlimit()
  sys.setrecursionlimit(1000)  # fail fast: other modules raise the limit to 20000
  try: lb = LazyBuffer.const(0.0, dtypes.float32, "CPU", (0, 3))
  except RecursionError: raise AssertionError("LazyBuffer.const(0.0, float32, 'CPU', (0, 3)) recursed without end") from None
  finally: sys.setrecursionlimit(limit)
  assert lb.shape == (0, 3)

def test_run_schedule_marks_its_outputs_realized() -> None:
  from tilecraft.engine.realize import run_schedule
  from tilecraft.engine.schedule import create_schedule
  lb = (Tensor(np.ones(4, np.float32)) * 3).exp2().lazydata
  run_schedule(create_schedule([lb]))
  assert lb.realized and create_schedule([lb]) == []

# ---- dependent reduces: one kernel for a reduce and the reduce that reads it (issue 14) ----------------

def _readers(t: Tensor, buf: Any) -> int:
  """How many of t's kernels read buffer `buf`."""
  return sum(1 for si in t.schedule() if si.ast.op is MetaOps.KERNEL and any(b is buf for b in si.inputs))

def test_softmax_reads_its_input_twice(rng: np.random.Generator) -> None:
  """On the CPU the max and the sum of exp(x - max) are one kernel (two outputs), the output a second one."""
  (x, xn) = T(rng, 6, 40)
  x.realize()
  buf = x.lazydata.base.buffer
  # (each case builds its own graph: the max is one node in all three, realized by the first that runs)
  for out, want in [(x.softmax(1), np.exp(xn - xn.max(1, keepdims=True)) / np.exp(xn - xn.max(1, keepdims=True)).sum(1, keepdims=True)),
                    ((x * 1).log_softmax(1), (xn - xn.max(1, keepdims=True)) - np.log(np.exp(xn - xn.max(1, keepdims=True)).sum(1, keepdims=True)))]:
    assert n_kernels(out) == 2 and _readers(out, buf) == 2
    stats = out.schedule()[0].ast
    assert len(stats.src) == 2 and {r.op for r in stats.lazyops if r.op in ReduceOps} == {ReduceOps.MAX, ReduceOps.SUM}
    close(out, want)
  lse = (x + 0).logsumexp(1)
  assert n_kernels(lse) == 1 and _readers(lse, buf) == 1
  close(lse, np.log(np.exp(xn - xn.max(1, keepdims=True)).sum(1)) + xn.max(1))

def test_variance_and_layernorm_fuse_their_reduces(rng: np.random.Generator) -> None:
  (x, xn) = T(rng, 5, 33)
  assert n_kernels(x.var(1)) == 1 and n_kernels(x.std(1, correction=1)) == 1
  close(x.var(1), xn.var(1))
  close(x.std(1, correction=1), xn.std(1, ddof=1))
  out = x.layernorm()
  assert n_kernels(out) == 2
  close(out, (xn - xn.mean(-1, keepdims=True)) / np.sqrt(xn.var(-1, keepdims=True) + 1e-5), 1e-4)

def test_dependent_reduces_stay_apart_where_they_cant_fuse(rng: np.random.Generator, monkeypatch: Any) -> None:
  from tilecraft.engine import schedule
  (x, xn) = T(rng, 6, 40)
  want = np.exp(xn - xn.max(1, keepdims=True))
  want = want / want.sum(1, keepdims=True)
  # on a device with workgroups (there the separate reduces can be grouped); rows over FUSE_REDUCE_MAX
  assert n_kernels(Tensor(xn, device="PYTHON").softmax(1)) == 3
  monkeypatch.setattr(schedule, "FUSE_REDUCE_MAX", 32)
  plan_cache.clear()
  out = x.softmax(1)
  assert n_kernels(out) == 3
  close(out, want)
  monkeypatch.undo()
  plan_cache.clear()
  # the max is also read flipped after the reduce: not something the fused kernel can give, so it is loaded
  m = x.max(1, keepdim=True)
  s = (x - m).exp().sum(1) + m[::-1].reshape(6)
  assert n_kernels(s) == 2
  close(s, np.exp(xn - xn.max(1, keepdims=True)).sum(1) + xn.max(1)[::-1])
  # a reduce over other axes than the max's reads it as an input
  y = (x - x.max(1, keepdim=True)).sum(0)
  assert n_kernels(y) == 2
  close(y, (xn - xn.max(1, keepdims=True)).sum(0))

def test_fuse_reduces_setting_takes_effect_at_once(rng: np.random.Generator) -> None:
  """FUSE_REDUCES is read per schedule: a Context turns the fusion off and on again, for graphs built
  op by op and for replayed recipes whose schedule template and walk were cached under the other value."""
  from tilecraft.helpers import Context
  (x, xn) = T(rng, 6, 40)
  x.realize()
  want = np.exp(xn - xn.max(1, keepdims=True))
  want = want / want.sum(1, keepdims=True)
  for fuse, kernels in [(1, 2), (0, 3), (1, 2), (0, 3)]:
    with Context(FUSE_REDUCES=fuse):
      for _ in range(2):  # the second call replays the recipe and its remembered walk
        out = x.softmax(1)
        assert n_kernels(out) == kernels
        close(out, want)
        out = x.softmax(1)
        close(out.realize(), want)
        var = (x + 0).var(1)  # (+ a small kernel of each row's first element: var's shift, Tensor._first_along)
        assert n_kernels(var) == (2 if fuse else 3)
        close(var, xn.var(1))

def test_fused_schedule_is_cached_and_reruns_right(rng: np.random.Generator) -> None:
  for _ in range(3):
    (x, xn) = T(rng, 4, 24)
    out = x.softmax(1)
    sched = out.schedule()
    assert len(sched) == 2 and len(sched[0].outputs) == 2
    e = np.exp(xn - xn.max(1, keepdims=True))
    close(out, e / e.sum(1, keepdims=True))
  assert any(len(it[2]) == 2 for t in plan_cache.templates.values() for it in t.items)

# ---- the realize set is settled before any kernel is built (issue 24) -----------------------------------

def _conflicting_reduces(x: Tensor) -> tuple[Tensor, list[Any]]:
  """A graph whose output kernel can't compute any of its reduces: two read through an expand (over
  other axes each) and a reduce of a reduce. Returns it and the reduces' LazyBuffers."""
  rows, cols = x.sum(1, keepdim=True), x.max(0, keepdim=True)
  inner = x.exp().sum(1)
  total = inner.max()
  return rows + cols + total, [rows.lazydata.base, cols.lazydata.base, inner.lazydata.base, total.lazydata.base]

def _count_builds(monkeypatch: Any) -> list[Any]:
  """The value each kernel build starts from, in order (the schedule's template cache emptied first)."""
  from tilecraft.engine import schedule
  built: list[Any] = []
  class Counting(schedule._KernelBuilder):
    def __init__(self, o: Any, *args: Any, **kwargs: Any) -> None:
      built.append(o)
      super().__init__(o, *args, **kwargs)
  monkeypatch.setattr(schedule, "_KernelBuilder", Counting)
  plan_cache.clear()
  return built

def test_conflicting_reduces_are_settled_in_one_pass(rng: np.random.Generator, monkeypatch: Any) -> None:
  """Each kernel is built once: the reduces that need kernels of their own are found by one walk over
  the graph before building (a build that meets one is a scheduler bug, not a restart)."""
  from tilecraft.engine import schedule
  (x, xn) = T(rng, 6, 7)
  x.realize()
  out, reduces = _conflicting_reduces(x)
  built = _count_builds(monkeypatch)
  items = out.schedule()
  assert len(items) == 5 and len(built) == 5 and {id(b) for b in built} == {id(si.outputs[0]) for si in items}
  assert {id(r) for r in reduces} <= {id(si.outputs[0]) for si in items}
  monkeypatch.undo()
  close(out, xn.sum(1, keepdims=True) + xn.max(0, keepdims=True) + np.exp(xn).sum(1).max(), 1e-4)

def test_realize_set_is_a_fixed_point(rng: np.random.Generator) -> None:
  """Walking the kernels again with the settled realize set finds nothing more to realize."""
  from tilecraft.engine.schedule import _decide_realizes, _realize_reduces, _walk
  (x, _) = T(rng, 6, 7)
  x.realize()
  out, reduces = _conflicting_reduces(x)
  outs = [out.lazydata]
  order, _, _ = _walk(outs)
  realizes = _decide_realizes(order, outs)
  assert not {id(r) for r in reduces} <= realizes  # (the first decisions leave the reduces inline)
  _realize_reduces(order, realizes)
  assert {id(r) for r in reduces} <= realizes
  settled = set(realizes)
  _realize_reduces(order, realizes)
  assert realizes == settled

def test_a_fusion_that_fails_rebuilds_only_its_kernel(rng: np.random.Generator, monkeypatch: Any) -> None:
  """The max is taken on by the sum's kernel (dependent reduces) and then read flipped, which that
  kernel can't give: the sum's kernel is built again loading it; the max's own kernel is built once."""
  from tilecraft.engine import schedule
  (x, xn) = T(rng, 6, 40)
  x.realize()
  m = x.max(1, keepdim=True)
  s = (x - m).exp().sum(1) + m[::-1].reshape(6)
  built = _count_builds(monkeypatch)
  items = s.schedule()
  assert len(items) == 2 and [len(si.outputs) for si in items] == [1, 1]
  assert sum(b is m.lazydata.base for b in built) == 1 and sum(b is s.lazydata.base for b in built) == 2
  monkeypatch.undo()
  close(s, np.exp(xn - xn.max(1, keepdims=True)).sum(1) + xn.max(1)[::-1])
