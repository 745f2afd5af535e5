"""tilecraft.onnx's graph walk (graph.py): a model is built once per input signature and its kernels rerun
on later calls (correct for new data, a new signature builds again, a graph whose shape reads input data
is built on every call); gather indices out of range are an IndexError naming the node, the axis and the
index, whether they come from a graph input (checked on the host on every call), an initializer or a
computation (checked from their min and max after the run), never a 0."""
from __future__ import annotations
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
import tilecraft.onnx as tox  # noqa: E402
from tilecraft.engine import plan_cache, realize  # noqa: E402
from tilecraft.helpers import Context  # noqa: E402

def _model(nodes: list, inputs: list, outputs: list, inits: tuple = (), opset: int = 17) -> onnx.ModelProto:
  g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])

def _vi(name: str, t: int, shape: list | None) -> onnx.ValueInfoProto: return helper.make_tensor_value_info(name, t, shape)

def _mlp() -> onnx.ModelProto:
  w = helper.make_tensor("w", TensorProto.FLOAT, [3, 4], np.arange(12, dtype=np.float32) / 7 - 0.5)
  nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
  return _model(nodes, [_vi("x", TensorProto.FLOAT, ["n", 3])], [_vi("y", TensorProto.FLOAT, None)], [w])

def test_built_once_per_signature(monkeypatch: pytest.MonkeyPatch) -> None:
  m = tox.load(_mlp())
  w = np.arange(12, dtype=np.float32).reshape(3, 4) / 7 - 0.5
  builds = []
  real_build = type(m)._build
  monkeypatch.setattr(type(m), "_build", lambda self, *a: builds.append(1) or real_build(self, *a))
  rng = np.random.default_rng(0)
  for shape, expect_builds in [((2, 3), 1), ((2, 3), 1), ((2, 3), 1), ((5, 3), 2), ((2, 3), 2)]:
    x = rng.standard_normal(shape).astype(np.float32)
    k0 = realize.kernel_count
    y = m.run({"x": x})["y"]
    np.testing.assert_allclose(y, np.maximum(x @ w, 0), rtol=1e-5, atol=1e-6)
    assert len(builds) == expect_builds, shape
    assert realize.kernel_count > k0  # the kernels ran again (not a stale answer)

def test_data_dependent_graph_is_built_each_call() -> None:
  # Reshape's target shape is a graph input: the built graph holds for that shape value only
  m = tox.load(_model([helper.make_node("Reshape", ["x", "s"], ["y"])], [_vi("x", TensorProto.FLOAT, [6]), _vi("s", TensorProto.INT64, [2])],
                      [_vi("y", TensorProto.FLOAT, None)]))
  x = np.arange(6, dtype=np.float32)
  for s in ([2, 3], [3, 2], [1, 6]):
    y = m.run({"x": x, "s": np.array(s, np.int64)})["y"]
    np.testing.assert_array_equal(y, x.reshape(s))
  assert not m._captures

def _two_outputs() -> onnx.ModelProto:
  # y = relu(x @ w) and z = sum(x, axis 1): two kernels, two outputs
  w = helper.make_tensor("w", TensorProto.FLOAT, [3, 4], np.arange(12, dtype=np.float32) / 7 - 0.5)
  ax = helper.make_tensor("ax", TensorProto.INT64, [1], [1])
  nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"]), helper.make_node("ReduceSum", ["x", "ax"], ["z"])]
  return _model(nodes, [_vi("x", TensorProto.FLOAT, ["n", 3])], [_vi("y", TensorProto.FLOAT, None), _vi("z", TensorProto.FLOAT, None)], [w, ax])

def _check_two(out: dict, x: np.ndarray) -> None:
  w = np.arange(12, dtype=np.float32).reshape(3, 4) / 7 - 0.5
  np.testing.assert_allclose(out["y"], np.maximum(x @ w, 0), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out["z"], x.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)

def test_rerun_is_the_bound_launches_only(monkeypatch: pytest.MonkeyPatch) -> None:
  # from the second call on, a call copies the inputs in, launches the bound kernels and copies the outputs
  # out: no graph building, scheduling, runner lookup, argument check or Tensor.numpy
  from tilecraft.device import CompiledRunner
  from tilecraft.tensor import Tensor
  m = tox.load(_two_outputs())
  rng = np.random.default_rng(1)
  for _ in range(2):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    _check_two(m.run({"x": x}), x)
  def must_not_run(*a: object, **k: object) -> None: raise AssertionError("ran on a rerun")
  for mod, name in ((realize, "run_schedule"), (realize, "get_runner"), (realize, "compile_ahead"), (tox.graph, "run_schedule")):
    monkeypatch.setattr(mod, name, must_not_run)
  for cls, name in ((CompiledRunner, "launch_args"), (CompiledRunner, "__call__"), (Tensor, "numpy"), (Tensor, "schedule"), (type(m), "_build")):
    monkeypatch.setattr(cls, name, must_not_run)
  (cap,) = m._captures.values()
  for _ in range(2):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    k0 = realize.kernel_count
    _check_two(m.run({"x": x}), x)
    assert realize.kernel_count - k0 == cap.bound.kernels >= 2

def test_bad_inputs_after_a_build_raise_as_before() -> None:
  m = tox.load(_two_outputs())
  x = np.ones((2, 3), np.float32)
  for _ in range(2): m.run({"x": x})
  # a shape the graph doesn't declare is refused naming the input (before: an op's error deep in the graph)
  with pytest.raises(ValueError, match=r"input 'x' has shape \(2, 4\), the graph declares \(\?, 3\)"): m.run({"x": np.ones((2, 4), np.float32)})
  with pytest.raises(ValueError, match=r"input 'x' has shape \(3,\), the graph declares \(\?, 3\)"): m.run({"x": np.ones(3, np.float32)})
  _check_two(m.run({"x": np.ones((5, 3), np.float32)}), np.ones((5, 3), np.float32))  # (a dynamic dim takes any size)
  with pytest.raises(TypeError, match="input 'x' is int32, the graph declares float"): m.run({"x": np.ones((2, 3), np.int32)})
  with pytest.raises(ValueError, match="missing graph input 'x'"): m.run({})
  with pytest.raises(ValueError, match="'q' is not an input of the graph"): m.run({"x": x, "q": x})
  x = np.arange(6, dtype=np.float32).reshape(2, 3)
  _check_two(m.run({"x": x}), x)  # the built graph is untouched
  assert len(m._captures) == 2  # (2, 3) and (5, 3)

def test_rerun_follows_settings_and_cache_clear(capsys: pytest.CaptureFixture) -> None:
  # a rerun under other opts settings binds the kernels built for them; after plan_cache.clear() it binds
  # again; under DEBUG=2 it runs through run_schedule (per-kernel timings)
  from tilecraft import Context
  from tilecraft.engine import plan_cache
  m = tox.load(_two_outputs())
  rng = np.random.default_rng(2)
  def call() -> None:
    x = rng.standard_normal((2, 3)).astype(np.float32)
    _check_two(m.run({"x": x}), x)
  call(); call()  # noqa: E702
  (cap,) = m._captures.values()
  key = cap.bound.key
  with Context(NOOPT=1):
    call()
    assert cap.bound.key != key
    noopt_launches = [fn for fn, _ in cap.bound.steps]
  call()
  assert cap.bound.key == key and [fn for fn, _ in cap.bound.steps] != noopt_launches
  plan_cache.clear()
  call()
  assert cap.bound.key != key
  with Context(DEBUG=2):
    call()
  assert "***" in capsys.readouterr().out

def test_rerun_shares_intermediates_memory() -> None:
  # a residual block with a concatenation: from the first rerun on, the intermediates share one arena
  # (engine/memory_plan.py); every call's outputs stay right, and an output read by later nodes keeps its own memory
  rng = np.random.default_rng(3)
  w1, w2, w3 = (rng.standard_normal((8, 8)).astype(np.float32) / 3 for _ in range(3))
  inits = [helper.make_tensor(n, TensorProto.FLOAT, [8, 8], w.ravel()) for n, w in zip(["w1", "w2", "w3"], (w1, w2, w3))]
  nodes = [helper.make_node("MatMul", ["x", "w1"], ["a0"]), helper.make_node("Relu", ["a0"], ["a"]),
           helper.make_node("MatMul", ["a", "w2"], ["b0"]), helper.make_node("Relu", ["b0"], ["b"]),
           helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("MatMul", ["c", "w3"], ["d"]),
           helper.make_node("Concat", ["d", "c"], ["e"], axis=0), helper.make_node("Tanh", ["e"], ["y"])]
  m = tox.load(_model(nodes, [_vi("x", TensorProto.FLOAT, [4, 8])], [_vi("y", TensorProto.FLOAT, None), _vi("c", TensorProto.FLOAT, None)], inits))
  for _ in range(4):
    x = rng.standard_normal((4, 8)).astype(np.float32)
    a = np.maximum(x @ w1, 0)
    c = a + np.maximum(a @ w2, 0)
    out = m.run({"x": x})
    np.testing.assert_allclose(out["y"], np.tanh(np.concatenate([c @ w3, c], 0)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["c"], c, rtol=1e-5, atol=1e-6)
  (cap,) = m._captures.values()
  assert cap.bound.memory.planned >= 2 and cap.bound.memory.arena_bytes < cap.bound.memory.planned_bytes

def _gather(idx_from: str) -> onnx.ModelProto:
  data = _vi("d", TensorProto.FLOAT, [5, 2])
  out = [_vi("y", TensorProto.FLOAT, None)]
  if idx_from == "input":
    return _model([helper.make_node("Gather", ["d", "i"], ["y"], name="g1")], [data, _vi("i", TensorProto.INT64, [3])], out)
  if idx_from == "initializer":
    return _model([helper.make_node("Gather", ["d", "i"], ["y"], name="g1")], [data], out,
                  [helper.make_tensor("i", TensorProto.INT64, [3], [0, 7, 1])])
  # computed: i + 1 (a runtime value nothing knows before the run)
  one = helper.make_tensor("one", TensorProto.INT64, [], [1])
  return _model([helper.make_node("Add", ["i", "one"], ["j"]), helper.make_node("Gather", ["d", "j"], ["y"], name="g1")],
                [data, _vi("i", TensorProto.INT64, [3])], out, [one])

D = np.arange(10, dtype=np.float32).reshape(5, 2)

def test_gather_index_from_input() -> None:
  m = tox.load(_gather("input"))
  np.testing.assert_array_equal(m.run({"d": D, "i": np.array([4, -1, 0], np.int64)})["y"], D[[4, -1, 0]])
  for bad, shown in (([0, 5, 1], 5), ([-6, 0, 0], -6)):
    with pytest.raises(IndexError, match=rf"'g1' \(op Gather, opset 17\): index {shown} is out of range for axis 0 of size 5"):
      m.run({"d": D, "i": np.array(bad, np.int64)})
  np.testing.assert_array_equal(m.run({"d": D, "i": np.array([1, 2, 3], np.int64)})["y"], D[[1, 2, 3]])  # the captured graph

def test_gather_index_from_initializer() -> None:
  with pytest.raises(IndexError, match=r"'g1'.*index 7 is out of range for axis 0 of size 5"):
    tox.load(_gather("initializer")).run({"d": D})

def test_gather_computed_index() -> None:
  m = tox.load(_gather("computed"))
  np.testing.assert_array_equal(m.run({"d": D, "i": np.array([3, -2, 0], np.int64)})["y"], D[[4, -1, 1]])
  with pytest.raises(IndexError, match=r"'g1'.*index 5 is out of range for axis 0 of size 5"):
    m.run({"d": D, "i": np.array([0, 4, 1], np.int64)})  # (checked after the run, from the indices' max)

@pytest.mark.parametrize("axis,idt", [(0, TensorProto.INT64), (1, TensorProto.INT32)])
def test_gather_of_a_constant_table_by_input_indices_copies_rows_on_the_host(axis, idt) -> None:
  """An embedding lookup (a constant table, indices from a graph input) is a copy on the host in every call, after
  the index guard: no one-hot kernel over the table; reruns take the new indices, bad ones raise naming the node,
  and an overridden table takes the kernel path, all right against numpy."""
  rng = np.random.default_rng(11)
  table = rng.standard_normal((40, 6) if axis == 0 else (6, 40)).astype(np.float32)
  proto = _model([helper.make_node("Gather", ["t", "i"], ["e"], name="emb", axis=axis), helper.make_node("Relu", ["e"], ["y"])],
                 [_vi("i", idt, [2, 3])], [_vi("y", TensorProto.FLOAT, None)], [helper.make_tensor("t", TensorProto.FLOAT, list(table.shape), table.ravel())])
  npi = np.int64 if idt == TensorProto.INT64 else np.int32
  m = tox.load(proto)
  for ids in ([[0, 39, -1], [5, 5, 2]], [[1, 2, 3], [-40, 38, 0]]):
    ix = np.array(ids, npi)
    out, kernels = _kernels_per_call(m, {"i": ix})
    np.testing.assert_array_equal(out["y"], np.maximum(np.take(table, ix, axis=axis), 0))
    assert kernels == 1, kernels  # (the relu alone)
  with pytest.raises(IndexError, match=r"'emb' \(op Gather, opset 17\): index 40 is out of range"):
    m.run({"i": np.array([[0, 40, 1], [0, 0, 0]], npi)})
  t2 = rng.standard_normal(table.shape).astype(np.float32)
  ix = np.array([[3, 1, 0], [2, 2, -2]], npi)
  np.testing.assert_array_equal(tox.load(proto).run({"i": ix, "t": t2})["y"], np.maximum(np.take(t2, ix, axis=axis), 0))

def test_gather_elements_and_nd_index_errors() -> None:
  ge = tox.load(_model([helper.make_node("GatherElements", ["d", "i"], ["y"], name="ge", axis=1)],
                       [_vi("d", TensorProto.FLOAT, [5, 2]), _vi("i", TensorProto.INT64, [5, 2])], [_vi("y", TensorProto.FLOAT, None)]))
  ok = np.array([[0, 1]] * 5, np.int64)
  np.testing.assert_array_equal(ge.run({"d": D, "i": ok})["y"], np.take_along_axis(D, ok, 1))
  with pytest.raises(IndexError, match=r"'ge' \(op GatherElements.*index 2 is out of range for axis 1 of size 2"):
    ge.run({"d": D, "i": ok + np.eye(5, 2, dtype=np.int64)})
  gn = tox.load(_model([helper.make_node("GatherND", ["d", "i"], ["y"], name="gn")],
                       [_vi("d", TensorProto.FLOAT, [5, 2]), _vi("i", TensorProto.INT64, [3, 2])], [_vi("y", TensorProto.FLOAT, None)]))
  np.testing.assert_array_equal(gn.run({"d": D, "i": np.array([[4, 1], [0, 0], [-1, -2]], np.int64)})["y"], D[[4, 0, -1], [1, 0, -2]])
  with pytest.raises(IndexError, match=r"'gn' \(op GatherND.*index 2 \(column 1 of the indices\) is out of range for axis 1 of size 2"):
    gn.run({"d": D, "i": np.array([[4, 1], [0, 2], [1, 1]], np.int64)})

# ---- graph-level optimizations: BatchNorm folded into Conv, constant folding, fused epilogues ---------
def _ort_run(m: onnx.ModelProto, feed: dict) -> list:
  rt = pytest.importorskip("onnxruntime")
  return rt.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)

def _kernels_per_call(m: tox.OnnxModel, feed: dict) -> tuple[dict, int]:
  m.run(feed)
  k0 = realize.kernel_count
  out = m.run(feed)
  return out, realize.kernel_count - k0

def _conv_bn_relu_add() -> onnx.ModelProto:
  rng = np.random.default_rng(3)
  f = lambda name, *s, mean=0.0, std=0.5: helper.make_tensor(name, TensorProto.FLOAT, list(s), (mean + std * rng.standard_normal(s)).astype(np.float32).ravel())  # noqa: E731
  inits = [f("w", 4, 3, 3, 3), f("cb", 4), f("g", 4, mean=1.0, std=0.2), f("b", 4), f("mu", 4), helper.make_tensor("var", TensorProto.FLOAT, [4], [0.5, 1.0, 2.0, 0.25])]
  nodes = [helper.make_node("Conv", ["x", "w", "cb"], ["c"], pads=[1, 1, 1, 1], name="conv"),
           helper.make_node("BatchNormalization", ["c", "g", "b", "mu", "var"], ["n"], epsilon=1e-3, name="bn"),
           helper.make_node("Relu", ["n"], ["r"]), helper.make_node("Add", ["r", "skip"], ["y"])]
  return _model(nodes, [_vi("x", TensorProto.FLOAT, [1, 3, 6, 6]), _vi("skip", TensorProto.FLOAT, [1, 4, 6, 6])], [_vi("y", TensorProto.FLOAT, None)], inits, opset=15)

def test_batchnorm_folded_into_conv() -> None:
  proto = _conv_bn_relu_add()
  rng = np.random.default_rng(4)
  feed = {"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32), "skip": rng.standard_normal((1, 4, 6, 6)).astype(np.float32)}
  ref = _ort_run(proto, feed)[0]
  folded, plain = tox.load(proto), tox.load(proto, fold=False)
  assert folded.bn_folded == 1 and plain.bn_folded == 0
  assert [n.op_type for n, _, _ in folded.nodes] == ["Conv", "Relu", "Add"]
  (yf, kf), (yp, kp) = _kernels_per_call(folded, feed), _kernels_per_call(plain, feed)
  np.testing.assert_allclose(yf["y"], ref, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(yp["y"], ref, rtol=1e-4, atol=1e-5)
  # conv + bias + relu + residual add is one kernel either way (the scheduler fuses the epilogue)
  assert kf == 1 and kp > kf, (kf, kp)  # (unfolded, the BatchNorm's per-channel factors take a kernel of their own)

def test_folded_kernels_take_hand_coded_opts_under_beam(monkeypatch) -> None:
  """Constant folding runs its kernels once, at load: under BEAM they are not searched (the per-call kernels are)."""
  from tilecraft.engine import search
  searched: list[str] = []
  def fake_search(k, *a, **kw):
    searched.append(k.name)
    return k.copy().hand_coded_optimizations()
  monkeypatch.setattr(search, "beam_search", fake_search)
  rng = np.random.default_rng(6)
  a, b = rng.standard_normal((5, 4)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
  inits = [helper.make_tensor("a", TensorProto.FLOAT, [5, 4], a.ravel()), helper.make_tensor("b", TensorProto.FLOAT, [5, 4], b.ravel())]
  nodes = [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Exp", ["s"], ["e"]), helper.make_node("MatMul", ["x", "e"], ["y"])]
  proto = _model(nodes, [_vi("x", TensorProto.FLOAT, [3, 5])], [_vi("y", TensorProto.FLOAT, None)], inits)
  x = rng.standard_normal((3, 5)).astype(np.float32)
  plan_cache.clear()
  with Context(BEAM=1): out = tox.load(proto).run({"x": x})
  np.testing.assert_allclose(out["y"], x @ np.exp(a + b), rtol=1e-5, atol=1e-5)
  assert searched and all(not n.startswith("E_") for n in searched), searched  # the matmul searched, exp(a + b) not

def test_constant_subgraph_folded() -> None:
  # w = (a * 2 + b)^T, read by a MatMul: computed once at build with folding, in every call without
  rng = np.random.default_rng(5)
  a, b = rng.standard_normal((5, 4)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
  two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
  inits = [helper.make_tensor("a", TensorProto.FLOAT, [5, 4], a.ravel()), helper.make_tensor("b", TensorProto.FLOAT, [5, 4], b.ravel()), two]
  nodes = [helper.make_node("Mul", ["a", "two"], ["a2"]), helper.make_node("Add", ["a2", "b"], ["s"]), helper.make_node("Exp", ["s"], ["e"]),
           helper.make_node("Transpose", ["e"], ["w"]), helper.make_node("MatMul", ["x", "w"], ["y"])]
  proto = _model(nodes, [_vi("x", TensorProto.FLOAT, [3, 4])], [_vi("y", TensorProto.FLOAT, None)], inits)
  x = rng.standard_normal((3, 4)).astype(np.float32)
  ref = x @ np.exp(a * 2 + b).T
  (yf, kf), (yp, kp) = _kernels_per_call(tox.load(proto), {"x": x}), _kernels_per_call(tox.load(proto, fold=False), {"x": x})
  np.testing.assert_allclose(yf["y"], ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(yp["y"], ref, rtol=1e-5, atol=1e-5)
  assert kf == 1 and kp > kf, (kf, kp)  # (unfolded, exp(a * 2 + b) is computed in every call by a kernel of its own)

def test_view_outputs_read_right_on_every_rerun() -> None:
  """Outputs that are views of another value: a Reshape and an Identity (contiguous views, read straight out of the
  base's buffer), a Transpose and a Slice (not contiguous, read through Tensor.numpy). Each rerun with new data reads
  the new values, and the readers launch no kernel of their own (the capture's kernels per call stay the same)."""
  nodes = [helper.make_node("Softmax", ["x"], ["s"], axis=1), helper.make_node("Reshape", ["s", "shp"], ["r"]),
           helper.make_node("Identity", ["s"], ["i"]), helper.make_node("Transpose", ["s"], ["t"], perm=[1, 0]),
           helper.make_node("Slice", ["s", "st", "en", "ax"], ["sl"])]
  inits = (helper.make_tensor("shp", TensorProto.INT64, [4], [1, 12, 1, 1]), helper.make_tensor("st", TensorProto.INT64, [1], [1]),
           helper.make_tensor("en", TensorProto.INT64, [1], [3]), helper.make_tensor("ax", TensorProto.INT64, [1], [1]))
  m = tox.load(_model(nodes, [_vi("x", TensorProto.FLOAT, [3, 4])], [_vi(n, TensorProto.FLOAT, None) for n in ("r", "i", "t", "sl", "s")], inits))
  rng = np.random.default_rng(3)
  counts = []
  for _ in range(4):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    k0 = realize.kernel_count
    out = m.run({"x": x})
    counts.append(realize.kernel_count - k0)
    e = np.exp(x - x.max(1, keepdims=True)); s = e / e.sum(1, keepdims=True)
    np.testing.assert_allclose(out["s"], s, rtol=1e-5)
    np.testing.assert_allclose(out["r"], s.reshape(1, 12, 1, 1), rtol=1e-5)
    np.testing.assert_allclose(out["i"], s, rtol=1e-5)
    np.testing.assert_allclose(out["t"], s.T, rtol=1e-5)
    np.testing.assert_allclose(out["sl"], s[:, 1:3], rtol=1e-5)
    assert not np.shares_memory(out["r"], out["i"])  # each output its own copy
  assert counts[2] == counts[3], counts

def test_max_pool_after_relu_reads_the_relu_padded_by_its_loads() -> None:
  """A MaxPool over a Relu pads with 0, not -inf (the maxima agree; frontend/nonnegative.py): no padded copy
  kernel. With its Indices output asked for, the pad stays -inf: a padded 0 tied with a real 0 (a window of
  negatives) must not be the first maximum."""
  rng = np.random.default_rng(7)
  x = rng.standard_normal((1, 3, 9, 9)).astype(np.float32)
  x[0, 0, :4, :4] = -1.0  # (relu: a corner of zeros, ties at the border)
  inp = [_vi("x", TensorProto.FLOAT, [1, 3, 9, 9])]
  pool = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
  plain = _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("MaxPool", ["r"], ["y"], **pool)], inp, [_vi("y", TensorProto.FLOAT, None)])
  out, kernels = _kernels_per_call(tox.load(plain), {"x": x})
  np.testing.assert_array_equal(out["y"], _ort_run(plain, {"x": x})[0])
  assert kernels == 2, kernels  # relu, then the pool over its zero-padded view (a padded copy made it 3)
  with_idx = _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("MaxPool", ["r"], ["y", "i"], **pool)], inp,
                    [_vi("y", TensorProto.FLOAT, None), _vi("i", TensorProto.INT64, None)])
  got, ref = tox.load(with_idx).run({"x": x}), _ort_run(with_idx, {"x": x})
  np.testing.assert_array_equal(got["y"], ref[0])
  np.testing.assert_array_equal(got["i"], ref[1])

def test_batchnorm_constants_over_an_input_are_folded() -> None:
  """A BatchNormalization over a graph input (DenseNet's pre-activations: nothing to fold it into): its per-channel
  gamma / sqrt(var + eps) is computed once at load, so each call runs the one normalize + relu kernel, not a
  kernel of the constants first."""
  rng = np.random.default_rng(8)
  f = lambda name, lo, hi: helper.make_tensor(name, TensorProto.FLOAT, [6], rng.uniform(lo, hi, 6).astype(np.float32))  # noqa: E731
  inits = [f("g", 0.5, 2.0), f("b", -1.0, 1.0), f("mu", -1.0, 1.0), f("var", 0.1, 3.0)]
  nodes = [helper.make_node("BatchNormalization", ["x", "g", "b", "mu", "var"], ["n"], epsilon=1e-3), helper.make_node("Relu", ["n"], ["y"])]
  proto = _model(nodes, [_vi("x", TensorProto.FLOAT, [1, 6, 7, 7])], [_vi("y", TensorProto.FLOAT, None)], inits)
  feed = {"x": rng.standard_normal((1, 6, 7, 7)).astype(np.float32)}
  ref = _ort_run(proto, feed)[0]
  (yf, kf), (yp, kp) = _kernels_per_call(tox.load(proto), feed), _kernels_per_call(tox.load(proto, fold=False), feed)
  np.testing.assert_allclose(yf["y"], ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(yp["y"], ref, rtol=1e-5, atol=1e-5)
  assert kf == 1 and kp == 2, (kf, kp)

def test_only_costly_weight_computations_are_folded() -> None:
  """x / w, w an initializer: the reciprocal of w (a costly op) is computed once at load, while the cheap part
  (the division's subnormal test on w, a bool) stays fused into the per-call kernel: realized it was a bool
  buffer, which keeps a CPU kernel from vector code."""
  rng = np.random.default_rng(9)
  w = rng.uniform(0.5, 2.0, (1, 8, 1, 1)).astype(np.float32)
  proto = _model([helper.make_node("Div", ["x", "w"], ["y"])], [_vi("x", TensorProto.FLOAT, [1, 8, 4, 4])], [_vi("y", TensorProto.FLOAT, None)],
                 [helper.make_tensor("w", TensorProto.FLOAT, [1, 8, 1, 1], w.ravel())])
  x = rng.standard_normal((1, 8, 4, 4)).astype(np.float32)
  m = tox.load(proto)
  out, kernels = _kernels_per_call(m, {"x": x})
  np.testing.assert_allclose(out["y"], x / w, rtol=1e-6)
  (cap,) = m._captures.values()
  assert kernels == 1 and all(b.dtype != np.bool_ and str(b.dtype) != "dtypes.bool" for si in cap.schedule for b in si.bufs), \
    [[str(b.dtype) for b in si.bufs] for si in cap.schedule]

def _linear(op: str, w: np.ndarray, lead: list, rng: np.random.Generator, trans_b: int = 0) -> onnx.ModelProto:
  """x (rows, *lead, K) @ w (a constant; transposed with trans_b), then relu; Gemm adds alpha and a bias."""
  k, n = w.shape[::-1] if trans_b else w.shape
  inits = [helper.make_tensor("w", TensorProto.FLOAT, list(w.shape), w.ravel())]
  if op == "Gemm":
    inits.append(helper.make_tensor("c", TensorProto.FLOAT, [n], rng.standard_normal(n).astype(np.float32)))
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["m"], transB=trans_b, alpha=0.5)]
  else: nodes = [helper.make_node("MatMul", ["x", "w"], ["m"])]
  nodes.append(helper.make_node("Relu", ["m"], ["y"]))
  return _model(nodes, [_vi("x", TensorProto.FLOAT, ["rows"] + lead + [k])], [_vi("y", TensorProto.FLOAT, None)], inits)

@pytest.mark.parametrize("op,lead,trans_b", [("MatMul", [], 0), ("MatMul", [12], 0), ("Gemm", [], 0), ("Gemm", [], 1)])
def test_constant_matmul_weights_are_read_in_panels(op, lead, trans_b) -> None:
  """A MatMul or Gemm of a constant weight on the CPU reads the weight laid out in column panels (frontend/panels.py),
  made once per model: a second input signature reuses it; 4 rows (the matrix-vector rules) and an overridden
  initializer read the weight as it is. Each against onnxruntime."""
  rng = np.random.default_rng(10)
  w = (rng.standard_normal((48, 64) if trans_b else (64, 48)) / 8).astype(np.float32)
  proto = _linear(op, w, lead, rng, trans_b)
  m = tox.load(proto)
  for rows in (24, 40):
    x = rng.standard_normal([rows] + lead + [64]).astype(np.float32)
    np.testing.assert_allclose(m.run({"x": x})["y"], _ort_run(proto, {"x": x})[0], rtol=1e-5, atol=1e-5)
    assert list(m._derived_tensors) == [("w", "panels_t" if trans_b else "panels")]
    wp = next(iter(m._derived_tensors.values()))
    assert wp.shape == (3, 64, 16)
    (cap,) = [c for key, c in m._captures.items() if key[0][1][0] == rows]
    assert any(b is wp.lazydata.buffer for si in cap.schedule for b in si.bufs), "the kernel reads the panels"
  cases = [(24, (rng.standard_normal(w.shape) / 8).astype(np.float32))] + ([(4, None)] if not lead else [])
  for rows, feed_w in cases:
    x = rng.standard_normal([rows] + lead + [64]).astype(np.float32)
    other = tox.load(proto)
    got = other.run({"x": x} if feed_w is None else {"x": x, "w": feed_w})["y"]
    assert not other._derived_tensors
    ref_proto = onnx.ModelProto()
    ref_proto.CopyFrom(proto)
    if feed_w is not None: ref_proto.graph.initializer[0].CopyFrom(helper.make_tensor("w", TensorProto.FLOAT, list(w.shape), feed_w.ravel()))
    np.testing.assert_allclose(got, _ort_run(ref_proto, {"x": x})[0], rtol=1e-5, atol=1e-5)

@pytest.mark.parametrize("cin,hw,stride,residual", [(512, 7, 1, True), (512, 14, 2, False), (256, 7, 1, False), (128, 14, 1, False), (32, 7, 1, False)])
def test_constant_pointwise_conv_weights_are_read_in_panels(cin, hw, stride, residual) -> None:
  """A 1x1 Conv of a constant weight (BatchNorm folded into it) on a CPU with 16-lane vectors reads the weight laid out
  in panels of output channels (frontend/pointwise_layout.py) where the tile for it applies (49 output pixels: at least
  64 input channels; 196: at least 512); on this host's vector width otherwise, or with fewer channels, the weight as
  it is. Against onnxruntime, a residual added after it."""
  from tilecraft.device import Device
  rng = np.random.default_rng(11)
  cout = 128
  w = (rng.standard_normal((cout, cin, 1, 1)) / np.sqrt(cin)).astype(np.float32)
  bn = [rng.random(cout).astype(np.float32) + 0.5, rng.standard_normal(cout).astype(np.float32), rng.standard_normal(cout).astype(np.float32) * 0.1,
        rng.random(cout).astype(np.float32) + 0.5]
  inits = [helper.make_tensor("w", TensorProto.FLOAT, list(w.shape), w.ravel())] + \
    [helper.make_tensor(nm, TensorProto.FLOAT, [cout], v) for nm, v in zip(("s", "b", "mean", "var"), bn)]
  nodes = [helper.make_node("Conv", ["x", "w"], ["c"], strides=[stride, stride]),
           helper.make_node("BatchNormalization", ["c", "s", "b", "mean", "var"], ["n"])]
  nodes += [helper.make_node("Add", ["n", "r"], ["a"]), helper.make_node("Relu", ["a"], ["y"])] if residual else [helper.make_node("Relu", ["n"], ["y"])]
  o = (hw - 1) // stride + 1
  ins = [_vi("x", TensorProto.FLOAT, [1, cin, hw, hw])] + ([_vi("r", TensorProto.FLOAT, [1, cout, o, o])] if residual else [])
  proto = _model(nodes, ins, [_vi("y", TensorProto.FLOAT, None)], inits)
  feed = {"x": rng.standard_normal((1, cin, hw, hw)).astype(np.float32)}
  if residual: feed["r"] = rng.standard_normal((1, cout, o, o)).astype(np.float32)
  m = tox.load(proto)
  np.testing.assert_allclose(m.run(feed)["y"], _ort_run(proto, feed)[0], rtol=1e-4, atol=1e-4)
  laid_out = Device["CPU"].renderer.vector_width >= 16 and cin >= (64 if o == 7 else 512)
  assert [kind for _, kind in m._derived_tensors] == (["pointwise_panels"] if laid_out else [])

def test_single_element_constants_are_kernel_constants() -> None:
  """Initializers of one element (Clip's bounds, a scale) are CONSTs in the kernels, not buffers each loads: a 1x1
  Conv + Clip(0, 6) with bounds of shape () and a Mul by a (1,) scale is one kernel reading only x and the weight."""
  rng = np.random.default_rng(5)
  w = (rng.standard_normal((64, 32, 1, 1)) / 6).astype(np.float32)
  inits = [helper.make_tensor("w", TensorProto.FLOAT, list(w.shape), w.ravel()), helper.make_tensor("lo", TensorProto.FLOAT, [], [0.0]),
           helper.make_tensor("hi", TensorProto.FLOAT, [], [0.75]), helper.make_tensor("k", TensorProto.FLOAT, [1], [1.5])]
  nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Clip", ["c", "lo", "hi"], ["r"]), helper.make_node("Mul", ["r", "k"], ["y"])]
  proto = _model(nodes, [_vi("x", TensorProto.FLOAT, [1, 32, 7, 7])], [_vi("y", TensorProto.FLOAT, None)], inits)
  feed = {"x": rng.standard_normal((1, 32, 7, 7)).astype(np.float32)}
  m = tox.load(proto)
  out, kernels = _kernels_per_call(m, feed)
  np.testing.assert_allclose(out["y"], _ort_run(proto, feed)[0], rtol=1e-5, atol=1e-6)
  assert kernels == 1
  (si,) = [si for si in next(iter(m._captures.values())).schedule if si.ast.op.name == "KERNEL"]
  assert len(si.bufs) == 3, [b.size for b in si.bufs]  # the output, x and the weight

def test_rotary_embedding_position_ids_are_guarded() -> None:
  """RotaryEmbedding's position_ids index the caches: one past the end is an IndexError, not a 0 angle."""
  B, H, S, D = 1, 2, 3, 8
  node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"], name="rope")
  ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, H, S, D]), helper.make_tensor_value_info("cos", TensorProto.FLOAT, [10, D // 2]),
         helper.make_tensor_value_info("sin", TensorProto.FLOAT, [10, D // 2]), helper.make_tensor_value_info("pos", TensorProto.INT64, [B, S])]
  g = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
  m = tox.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)]))
  rng = np.random.default_rng(0)
  x, c, s = rng.standard_normal((B, H, S, D)).astype(np.float32), rng.standard_normal((10, D // 2)).astype(np.float32), rng.standard_normal((10, D // 2)).astype(np.float32)
  y = m.run({"x": x, "cos": c, "sin": s, "pos": np.array([[0, 4, 9]])})["y"]
  x1, x2 = x[..., :D // 2], x[..., D // 2:]
  cc, ss = c[[0, 4, 9]][None, None], s[[0, 4, 9]][None, None]
  np.testing.assert_allclose(y, np.concatenate([x1 * cc - x2 * ss, x1 * ss + x2 * cc], -1), rtol=1e-6, atol=1e-6)
  with pytest.raises(IndexError, match=r"'rope' \(op RotaryEmbedding, opset 23\): index 10 is out of range for axis 0 of size 10"):
    m.run({"x": x, "cos": c, "sin": s, "pos": np.array([[0, 1, 10]])})

@pytest.mark.parametrize("case", ["gqa_causal_past", "mask_softcap_3d"])
def test_attention_matches_onnxruntime(case: str) -> None:
  """Attention against onnxruntime's own kernel (the conformance data comes from the onnx reference):
  grouped KV heads with a causal mask over a past cache; a 3-D layout with an additive mask and softcap."""
  ort = pytest.importorskip("onnxruntime")
  B, Hq, Hk, S, P, D = 2, 8, 2, 5, 3, 16
  f = lambda n, shape: helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)  # noqa: E731
  if case == "gqa_causal_past":
    node = helper.make_node("Attention", ["q", "k", "v", "", "pk", "pv"], ["y", "pk_out", "pv_out"], is_causal=1)
    ins = [f("q", [B, Hq, S, D]), f("k", [B, Hk, S, D]), f("v", [B, Hk, S, D]), f("pk", [B, Hk, P, D]), f("pv", [B, Hk, P, D])]
    outs = ["y", "pk_out", "pv_out"]
  else:
    node = helper.make_node("Attention", ["q", "k", "v", "mask"], ["y"], q_num_heads=Hq, kv_num_heads=Hq, softcap=3.0)
    ins = [f("q", [B, S, Hq * D]), f("k", [B, S + 2, Hq * D]), f("v", [B, S + 2, Hq * D]), f("mask", [S, S + 2])]
    outs = ["y"]
  m = helper.make_model(helper.make_graph([node], "g", ins, [f(n, None) for n in outs]), opset_imports=[helper.make_opsetid("", 23)])
  rng = np.random.default_rng(0)
  feed = {vi.name: rng.standard_normal([d.dim_value for d in vi.type.tensor_type.shape.dim]).astype(np.float32) for vi in ins}
  ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
  got = tox.load(m).run(feed)
  for n, r in zip(outs, ref): np.testing.assert_allclose(got[n], r, rtol=1e-5, atol=1e-5, err_msg=n)
