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
  sched = [_item([a, x, w]), _item([state, state, a]), _item([b, a]), _item([part, b], masked=True), _item([c, part, b], copy=False),
           _item([out, c, a])]
  spans = {k.name: v for k, v in lifetimes(sched, keep=[x, out]).items()}
  # w, x: read first (outside data); state: read by the item that writes it (last run's value);
  # out: kept; part: written by a masked store (a run leaves some of it unwritten)
  assert spans == {"a": (0, 5), "b": (2, 4), "c": (4, 5)}

def _rerun_planned(inp: Tensor, outs: list[Tensor], expect: list, device: str, data: list[np.ndarray]) -> BoundSchedule:
  sched = Tensor.schedule(*outs)
  run_schedule(sched)
  out_bufs = [o.lazydata.base.buffer for o in outs]
  bound = BoundSchedule(sched, keep=[inp.lazydata.buffer] + out_bufs)
  for x in data:
    inp.lazydata.buffer.copyin(x)
    bound.run()
    for o, b, f in zip(outs, out_bufs, expect):
      np.testing.assert_allclose(b.numpy()[:o.numel()].reshape(o.shape), f(x), rtol=1e-5, atol=1e-5)
  # buffers live at the same item never share bytes
  spans = lifetimes(sched, keep=[inp.lazydata.buffer] + out_bufs)
  ptr = {b: b._buf.ptr for b in spans}
  for b1, (f1, l1) in spans.items():
    for b2, (f2, l2) in spans.items():
      if b1 is not b2 and f1 <= l2 and f2 <= l1: assert ptr[b1] + b1.nbytes <= ptr[b2] or ptr[b2] + b2.nbytes <= ptr[b1]
  return bound

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
  bound = _rerun_planned(inp, [y, z], [lambda x: ref(x)[0], lambda x: ref(x)[1]], device,
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
