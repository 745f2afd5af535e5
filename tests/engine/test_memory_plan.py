"""engine/memory_plan.py: a rerun schedule's intermediates share an arena. Offsets never put two buffers
that are live at once in the same bytes (random lifetimes); only buffers written before read, outside
`keep`, by unmasked stores, on a device that slices memory are planned; reruns of planned schedules
(chains, a residual, a concatenation written in place, several outputs) give numpy's values on new
data, on CPU and LLVM; MEMORY_PLAN=0 plans nothing."""
from __future__ import annotations
from types import SimpleNamespace
import numpy as np
import pytest
from tilecraft import Context, Tensor
from tilecraft.engine.memory_plan import ALIGN, lifetimes, place
from tilecraft.engine.realize import BoundSchedule, run_schedule
from tilecraft.ops import BufferOps, MetaOps

def test_place_never_overlaps_live_buffers() -> None:
  rng = np.random.default_rng(0)
  for _ in range(200):
    n = int(rng.integers(1, 30))
    sizes = {i: int(rng.integers(1, 5000)) for i in range(n)}
    spans = {}
    for i in range(n):
      a, b = sorted(int(x) for x in rng.integers(0, 20, 2))
      spans[i] = (a, b)
    offsets, total = place(sizes, spans)
    assert all(o % ALIGN == 0 and o + sizes[i] <= total for i, o in offsets.items())
    for i in range(n):
      for j in range(i + 1, n):
        if spans[i][0] <= spans[j][1] and spans[j][0] <= spans[i][1]:  # live together: disjoint bytes
          assert offsets[i] + sizes[i] <= offsets[j] or offsets[j] + sizes[j] <= offsets[i], (sizes, spans, offsets)
    # never more than the sum, never less than the most bytes live at one item
    peak = max(sum(sizes[i] for i in range(n) if spans[i][0] <= t <= spans[i][1]) for t in range(20) if any(s[0] <= t <= s[1] for s in spans.values()))
    assert peak <= total <= sum(-(-s // ALIGN) * ALIGN for s in sizes.values())

def test_a_chain_reuses_memory() -> None:
  # four same-size buffers in a chain: each lives from its write to its read, two at a time
  assert place({k: 1024 for k in "abcd"}, {"a": (0, 1), "b": (1, 2), "c": (2, 3), "d": (3, 4)})[1] == 2048

def _item(bufs: list, masked: bool = False, copy: bool = False) -> SimpleNamespace:
  """A schedule item with one output (bufs[0]) whose store is masked or not."""
  st = SimpleNamespace(views=(SimpleNamespace(mask=((0, 1),) if masked else None),))
  store = SimpleNamespace(op=BufferOps.STORE, arg=SimpleNamespace(st=st))
  return SimpleNamespace(ast=SimpleNamespace(op=MetaOps.COPY if copy else MetaOps.KERNEL, src=(store,)), bufs=tuple(bufs))

def test_lifetimes_pick_internal_buffers() -> None:
  class Buf:
    def __init__(self, name: str): self.name = name
  w, x, a, b, c, out, state, part = (Buf(n) for n in ["w", "x", "a", "b", "c", "out", "state", "part"])
  sched = [_item([a, x, w]), _item([state, state, a]), _item([b, a]), _item([part, b], masked=True), _item([c, part, b]),
           _item([out, c, a])]
  spans = {k.name: v for k, v in lifetimes(sched, keep=[x, out]).items()}
  # w, x: read first (outside data); state: read by the item that writes it (last run's value);
  # out: kept; part: written by a masked store (a run leaves some of it unwritten)
  assert spans == {"a": (0, 5), "b": (2, 4), "c": (4, 5)}

def _rerun_planned(inp: Tensor, outs: list[Tensor], expect: list, data: list[np.ndarray]) -> BoundSchedule:
  sched = Tensor.schedule(*outs)
  run_schedule(sched)
  out_bufs = [o.lazydata.base.buffer for o in outs]
  bound = BoundSchedule(sched, keep=[inp.lazydata.buffer] + out_bufs)
  for x in data:
    inp.lazydata.buffer.copyin(x)
    bound.run()
    for o, b, f in zip(outs, out_bufs, expect):
      np.testing.assert_allclose(b.numpy()[:o.numel()].reshape(o.shape), f(x), rtol=1e-5, atol=1e-5)
  _assert_live_buffers_disjoint(lifetimes(sched, keep=[inp.lazydata.buffer] + out_bufs))
  return bound

def _assert_live_buffers_disjoint(spans: dict) -> None:
  """Buffers live at the same schedule item never share bytes."""
  for b1, (f1, l1) in spans.items():
    for b2, (f2, l2) in spans.items():
      if b1 is not b2 and f1 <= l2 and f2 <= l1:
        assert b1._buf.ptr + b1.nbytes <= b2._buf.ptr or b2._buf.ptr + b2.nbytes <= b1._buf.ptr

@pytest.mark.parametrize("device", ["CPU", "LLVM"])
def test_rerun_planned_graph_matches_numpy(device: str) -> None:
  rng = np.random.default_rng(1)
  w1, w2 = (rng.standard_normal((16, 16)).astype(np.float32) / 4 for _ in range(2))
  x0 = rng.standard_normal((8, 16)).astype(np.float32)
  inp = Tensor(x0, device=device).realize()
  t1 = (inp @ Tensor(w1, device=device)).relu().contiguous()  # a chain with a residual and a concatenation
  t2 = ((t1 @ Tensor(w2, device=device)).relu() + t1).contiguous()
  cat = Tensor.cat((t2 @ Tensor(w1, device=device)).exp(), t2 @ Tensor(w2, device=device), axis=0)  # (in place: two kernels store into slices)
  y = ((cat @ Tensor(w2, device=device)).sum(0) + t1.max(0)).contiguous()
  z = (t2 - 1).contiguous()
  def ref(x: np.ndarray) -> tuple[np.ndarray, ...]:
    r1 = np.maximum(x @ w1, 0)
    r2 = np.maximum(r1 @ w2, 0) + r1
    return (np.concatenate([np.exp(r2 @ w1), r2 @ w2], 0) @ w2).sum(0) + r1.max(0), r2 - 1
  bound = _rerun_planned(inp, [y, z], [lambda x: ref(x)[0], lambda x: ref(x)[1]],
                         [rng.standard_normal((8, 16)).astype(np.float32) for _ in range(3)])
  assert bound.memory.planned >= 3 and bound.memory.arena_bytes < bound.memory.planned_bytes
  # the concatenation's pieces were stored into their slices of one buffer
  assert any(sum(s.op is BufferOps.STORE for s in si.ast.src) == 1 and si.ast.src[0].arg.st.views[-1].offset > 0
             for si in bound.schedule if si.ast.op is MetaOps.KERNEL)

def test_memory_plan_off() -> None:
  x = Tensor(np.ones((4, 4), np.float32)).realize()
  out = ((x + 1).contiguous() * 2).contiguous()
  sched = out.schedule()
  run_schedule(sched)
  with Context(MEMORY_PLAN=0):
    assert BoundSchedule(sched, keep=[x.lazydata.buffer, out.lazydata.base.buffer]).memory.planned == 0
  assert BoundSchedule(sched).memory.planned == 0  # no keep: the caller didn't say what it reads

def _random_graph(rng: np.random.Generator, device: str) -> tuple:
  """A random graph over one input x (8 x 16): elementwise ops, row reductions broadcast back, matmuls with constant
  weights, concatenations (written in place where they qualify) and forced realizations, so intermediates of several
  sizes and lifetimes; 1-3 of its values are outputs. Every op keeps values of moderate size (no float32 overflow or
  cancellation against the float64 reference). Returns (input Tensor, outputs, their numpy functions of x)."""
  x = Tensor(rng.standard_normal((8, 16)).astype(np.float32), device=device).realize()
  nodes: list[tuple[Tensor, object]] = [(x, lambda v: v)]
  for _ in range(int(rng.integers(4, 12))):
    (a, fa), (b, fb) = (nodes[int(i)] for i in rng.integers(0, len(nodes), 2))
    kind = int(rng.integers(0, 6))
    if kind == 0: t, f = a.relu() * 0.5 + 1, (lambda fa: lambda v: np.maximum(fa(v), 0) * 0.5 + 1)(fa)
    elif kind == 1 and a.shape == b.shape: t, f = (a * b).tanh() + a * 0.5, (lambda fa, fb: lambda v: np.tanh(fa(v) * fb(v)) + fa(v) * 0.5)(fa, fb)
    elif kind == 2: t, f = a - a.max(1, keepdim=True), (lambda fa: lambda v: fa(v) - fa(v).max(1, keepdims=True))(fa)
    elif kind == 3:
      w = rng.standard_normal((a.shape[1], 16)).astype(np.float32) / 4
      t, f = (a @ Tensor(w, device=device)).tanh(), (lambda fa, w: lambda v: np.tanh(fa(v) @ w))(fa, w)
    elif kind == 4 and a.shape[1] == b.shape[1]:
      w = rng.standard_normal((a.shape[1], a.shape[1])).astype(np.float32) / 4
      t = Tensor.cat(a @ Tensor(w, device=device), (b * 2).contiguous(), axis=0)[:8]
      f = (lambda fa, fb, w: lambda v: np.concatenate([fa(v) @ w, fb(v) * 2], 0)[:8])(fa, fb, w)
    else: t, f = a.tanh().exp().sum(1, keepdim=True) / 16 + a, (lambda fa: lambda v: np.exp(np.tanh(fa(v))).sum(1, keepdims=True) / 16 + fa(v))(fa)
    if rng.random() < 0.6: t = t.contiguous()
    nodes.append((t, f))
  picks = sorted({len(nodes) - 1} | {int(i) for i in rng.integers(1, len(nodes), int(rng.integers(0, 3)))})
  return x, [nodes[i][0] for i in picks], [nodes[i][1] for i in picks]

@pytest.mark.parametrize("seed", range(12))
def test_random_graphs_rerun_planned(seed: int) -> None:
  """Random graphs (see _random_graph) rerun on a planned schedule give, for three new inputs, exactly what the same
  graph built again and rerun unplanned gives, and numpy's values (up to float32 rounding), with no two buffers live at
  the same item sharing bytes."""
  device = "LLVM" if seed % 4 == 3 else "CPU"
  (x, outs, fns), (x2, outs2, _) = (_random_graph(np.random.default_rng(seed), device) for _ in range(2))
  outs, outs2 = [o.contiguous() for o in outs], [o.contiguous() for o in outs2]
  sched, sched2 = Tensor.schedule(*outs), Tensor.schedule(*outs2)
  run_schedule(sched); run_schedule(sched2)  # noqa: E702
  bufs, bufs2 = [o.lazydata.base.buffer for o in outs], [o.lazydata.base.buffer for o in outs2]
  planned, unplanned = BoundSchedule(sched, keep=[x.lazydata.buffer] + bufs), BoundSchedule(sched2)
  rng = np.random.default_rng(1000 + seed)
  for _ in range(3):
    v = rng.standard_normal((8, 16)).astype(np.float32)
    x.lazydata.buffer.copyin(v); x2.lazydata.buffer.copyin(v)  # noqa: E702
    planned.run(); unplanned.run()  # noqa: E702
    for o, b, b2, f in zip(outs, bufs, bufs2, fns):
      got = b.numpy()[:o.numel()].reshape(o.shape)
      np.testing.assert_array_equal(got, b2.numpy()[:o.numel()].reshape(o.shape))
      want = f(v.astype(np.float64))
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
  spans = lifetimes(sched, keep=[x.lazydata.buffer] + bufs)
  _assert_live_buffers_disjoint(spans)
  assert planned.memory.planned == len(spans)

@pytest.mark.fuzz
@pytest.mark.parametrize("seed", range(12, 212))
def test_random_graphs_rerun_planned_fuzz(seed: int) -> None:
  test_random_graphs_rerun_planned(seed)
