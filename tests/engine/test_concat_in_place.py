"""Concatenations written in place (engine/concat_in_place.py): each piece's kernel stores into its
slice of the result and the copy kernel is gone, only where that is safe; values against numpy."""
from __future__ import annotations
import numpy as np
import pytest
from tilecraft import Tensor, dtypes
from tilecraft.engine import plan_cache

def conv(x: np.ndarray, w: np.ndarray, p: int = 0) -> np.ndarray:
  xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p, p), (p, p)))
  co, _, kh, kw = w.shape
  oh, ow = xp.shape[2] - kh + 1, xp.shape[3] - kw + 1
  out = np.zeros((x.shape[0], co, oh, ow))
  for i in range(kh):
    for j in range(kw): out += np.einsum("nchw,oc->nohw", xp[:, :, i:i + oh, j:j + ow], w[:, :, i, j])
  return out

def fire(rng: np.random.Generator, n: int = 1) -> tuple:
  """A fire module's expand (two convs, relu, concatenated along channels) feeding a 1x1 conv."""
  x = rng.standard_normal((n, 8, 5, 5)).astype(np.float32)
  w1, w2, w3 = (rng.standard_normal(s).astype(np.float32) for s in [(4, 8, 1, 1), (6, 8, 3, 3), (3, 10, 1, 1)])
  a = Tensor(x).conv2d(Tensor(w1)).relu()
  b = Tensor(x).conv2d(Tensor(w2), padding=1).relu()
  cat_ref = np.concatenate([np.maximum(conv(x, w1), 0), np.maximum(conv(x, w2, 1), 0)], 1)
  return a, b, Tensor(w3), cat_ref, conv(cat_ref, w3)

def offsets(sched: list) -> list[int]:
  return [st.arg.st.views[0].offset for si in sched if si.ast.op.name == "KERNEL" for st in si.ast.src]

def test_pieces_store_into_their_slices(rng: np.random.Generator) -> None:
  a, b, w3, _, want = fire(rng)
  out = a.cat(b, axis=1).conv2d(w3)
  sched = out.schedule()
  assert len(sched) == 3, "two convs and the 1x1 conv: no copy kernel"
  assert sorted(offsets(sched)) == [0, 0, 4 * 25]  # the second piece's slice starts 4 channels in
  for si in sched:
    for buf in si.bufs:
      if not buf.is_allocated(): buf.allocate()
  from tilecraft.engine.realize import run_schedule
  run_schedule(sched)
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-5)

def test_a_repeated_graph_stays_right(rng: np.random.Generator) -> None:
  """The schedule cache's template of such a graph: the next call of the same graph (new buffers)."""
  plan_cache.clear()
  for _ in range(3):
    a, b, w3, _, want = fire(rng)
    np.testing.assert_allclose(a.cat(b, axis=1).conv2d(w3).numpy(), want, rtol=1e-4, atol=1e-5)

def test_a_half_piece_widened_in_its_own_kernel(rng: np.random.Generator) -> None:
  """A half piece of a float concatenation: its kernel stores the widened values into the slice."""
  a, b, w3, cat_ref, _ = fire(rng)
  out = a.cat(b.cast(dtypes.half), axis=1).conv2d(w3)
  assert len(out.schedule()) == 3
  ref = np.concatenate([cat_ref[:, :4], cat_ref[:, 4:].astype(np.float16).astype(np.float64)], 1)
  np.testing.assert_allclose(out.numpy(), conv(ref, w3.numpy()), rtol=1e-3, atol=1e-3)

@pytest.mark.parametrize("case", ["piece read elsewhere", "piece asked for", "batch of 2", "forced piece"])
def test_left_as_a_copy_where_it_is_not_safe(case: str, rng: np.random.Generator) -> None:
  a, b, w3, cat_ref, want = fire(rng, n=2 if case == "batch of 2" else 1)
  if case == "forced piece": b = b.contiguous()
  c = a.cat(b, axis=1)
  out = c.conv2d(w3)
  extra = [a.sum()] if case == "piece read elsewhere" else [a] if case == "piece asked for" else []
  sched = out.schedule(*extra)
  assert len(sched) == 4 + (case == "piece read elsewhere"), [si.ast.op for si in sched]
  assert all(o == 0 for o in offsets(sched))
  out.realize(*extra)
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-5)
  if extra: np.testing.assert_allclose(extra[0].numpy(), cat_ref[:, :4].sum() if case == "piece read elsewhere" else cat_ref[:, :4], rtol=1e-4, atol=1e-4)

def test_one_value_in_two_slices_stays_a_copy(rng: np.random.Generator) -> None:
  """a.cat(a): one kernel can't store into two slices; the copy kernel stays (it wrote only one slice)."""
  x, y = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32)
  a = Tensor(x) @ Tensor(y)
  c = a.cat(a, (Tensor(x) @ Tensor(y)) * 2, axis=0)
  assert len(c.schedule()) == 3
  np.testing.assert_allclose(c.numpy(), np.concatenate([x @ y, x @ y, 2 * (x @ y)]), rtol=1e-5, atol=1e-5)

def test_a_piece_used_again_later_is_recomputed(rng: np.random.Generator) -> None:
  a, b, w3, cat_ref, want = fire(rng)
  np.testing.assert_allclose(a.cat(b, axis=1).conv2d(w3).numpy(), want, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(a.numpy(), cat_ref[:, :4], rtol=1e-4, atol=1e-5)  # a never had a buffer of its own
  np.testing.assert_allclose((b * 2).numpy(), 2 * cat_ref[:, 4:], rtol=1e-4, atol=1e-5)

@pytest.mark.parametrize("seed", range(8))
def test_random_concatenations_of_reduces(seed: int) -> None:
  """Random pieces (matmuls and row sums, some relu'd), concatenated along the first axis or along an
  axis after size-1 ones, read by a reduce or returned: against numpy."""
  rng = np.random.default_rng(seed)
  k, cols = int(rng.integers(2, 5)), int(rng.integers(1, 9))
  pieces, refs = [], []
  for _ in range(k):
    rows, inner = int(rng.integers(1, 7)), int(rng.integers(1, 9))
    x, y = rng.standard_normal((rows, inner)).astype(np.float32), rng.standard_normal((inner, cols)).astype(np.float32)
    if rng.random() < 0.5: t, r = Tensor(x) @ Tensor(y), x.astype(np.float64) @ y
    else: t, r = Tensor(x).sum(1, keepdim=True).expand(rows, cols) * 1.0, np.broadcast_to(x.astype(np.float64).sum(1, keepdims=True), (rows, cols))
    if rng.random() < 0.5: t, r = t.relu(), np.maximum(r, 0)
    pieces.append(t)
    refs.append(r)
  if rng.random() < 0.4: pieces, refs = pieces + [pieces[0]], refs + [refs[0]]  # one value in two slices
  lead = bool(rng.integers(2))
  if lead: pieces, refs = [p.reshape(1, *p.shape) for p in pieces], [r[None] for r in refs]
  c, ref = pieces[0].cat(*pieces[1:], axis=int(lead)), np.concatenate(refs, int(lead))
  if rng.random() < 0.5: c, ref = (c * 2 - 1).relu(), np.maximum(ref * 2 - 1, 0)  # an epilogue each piece's kernel takes
  if rng.random() < 0.5: np.testing.assert_allclose(c.numpy(), ref, rtol=1e-4, atol=1e-5)
  else: np.testing.assert_allclose((c * 3).sum(-1).numpy(), (ref * 3).sum(-1), rtol=1e-4, atol=1e-4)

def test_tensor_cat_is_exact_and_written_in_place(rng: np.random.Generator) -> None:
  """Tensor.cat selects each piece in its own range (a chain of WHEREs over constants masked like the
  piece), so -0.0 stays -0.0; the pass takes that form too."""
  x = -np.abs(rng.standard_normal((1, 3, 4)).astype(np.float32))
  a = (Tensor(x) @ Tensor(np.ones((4, 2), np.float32))) * 0.0  # (negative) * 0 = -0.0 everywhere, made by a kernel
  b = Tensor(x) @ Tensor(np.ones((4, 2), np.float32))
  c = a.cat(b, axis=1)
  assert len(c.schedule()) == 2 and sorted(offsets(c.schedule())) == [0, 6]
  got = c.numpy()
  assert np.signbit(got[:, :3]).all() and (got[:, :3] == 0).all()
  np.testing.assert_allclose(got[:, 3:], np.broadcast_to(x.sum(-1, keepdims=True), (1, 3, 2)), rtol=1e-6)
  # a copy kernel (realized inputs, nothing to write in place) keeps -0.0 too
  assert np.signbit(Tensor(-np.zeros(3, np.float32)).cat(Tensor(np.ones(2, np.float32))).numpy()[:3]).all()

@pytest.mark.parametrize("epilogue", ["relu", "scale, shift and relu", "sigmoid", "clip"])
def test_an_elementwise_epilogue_moves_into_the_pieces(epilogue: str, rng: np.random.Generator) -> None:
  """relu(cat(a, b)) (ShuffleNet's units: a pooled shortcut and a conv, concatenated, then relu): each piece's
  kernel applies the epilogue to its own values and stores them into its slice; no copy kernel."""
  a, b, w3, cat_ref, _ = fire(rng)
  f_t, f_np = {"relu": (lambda t: t.relu(), lambda r: np.maximum(r, 0)),
               "scale, shift and relu": (lambda t: (t * 3 - 2).relu(), lambda r: np.maximum(r * 3 - 2, 0)),
               "sigmoid": (lambda t: t.sigmoid(), lambda r: 1 / (1 + np.exp(-r))),
               "clip": (lambda t: t.clip(0.5, 2.0), lambda r: np.clip(r, 0.5, 2.0))}[epilogue]
  out = f_t(a.cat(b, axis=1)).conv2d(w3)
  sched = out.schedule()
  assert len(sched) == 3 and sorted(offsets(sched)) == [0, 0, 4 * 25], [si.ast.op for si in sched]
  np.testing.assert_allclose(out.numpy(), conv(f_np(cat_ref), w3.numpy()), rtol=1e-4, atol=1e-4)

def test_an_epilogue_reading_another_buffer_stays_a_copy(rng: np.random.Generator) -> None:
  """cat(a, b) + y reads y where the pieces' kernels don't: the copy kernel stays."""
  a, b, w3, cat_ref, _ = fire(rng)
  y = rng.standard_normal((1, 10, 5, 5)).astype(np.float32)
  out = (a.cat(b, axis=1) + Tensor(y)).conv2d(w3)
  assert len(out.schedule()) == 4
  np.testing.assert_allclose(out.numpy(), conv(cat_ref + y, w3.numpy()), rtol=1e-4, atol=1e-4)
