"""The ONNX backend conformance cases through tilecraft.onnx on the default CPU device.

Case names come from the checked-in data (conformance_scope.tsv: every case with its op, family and
status; conformance_pass.txt: the passing ones), so collecting costs nothing; a case's model and data
are built by the onnx package only when the case runs. Default tier: one passing case per op, from the
quick set of case modules (the pooling modules, whose import alone takes 20 s, are covered by small
pooling models checked against onnxruntime instead). Slow tier: every case in conformance_pass.txt must
still pass, and every other in-scope case must raise NotImplementedError (never a wrong answer)."""
from __future__ import annotations
import os, sys
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path: sys.path.insert(0, HERE)
import conformance as C  # noqa: E402  (tests/onnx/conformance.py)

def _rows() -> list[list[str]]:
  with open(os.path.join(HERE, "conformance_scope.tsv")) as f:
    return [ln.rstrip("\n").split("\t") for ln in f if ln.strip() and not ln.startswith("#")]

def _passing() -> list[str]:
  with open(os.path.join(HERE, "conformance_pass.txt")) as f:
    return [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]

ROWS = _rows()
PASSING = _passing()
POOL_OPS = {"MaxPool", "AveragePool", "LpPool"}

def _one_per_op() -> list[str]:
  passing, seen, out = set(PASSING), set(), []
  for name, op, fam, status, *_ in ROWS:
    if fam == "out" or name not in passing or "expanded" in name or op in POOL_OPS or op in seen: continue
    seen.add(op)
    out.append(name)
  return out

def test_data_files_agree() -> None:
  in_scope_pass = {r[0] for r in ROWS if r[2] != "out" and r[3] == "pass"}
  assert in_scope_pass == set(PASSING)

@pytest.mark.parametrize("name", _one_per_op())
def test_case_fast(name: str) -> None:
  status, msg = C.run_case(name)
  assert status == "pass", msg

@pytest.mark.slow
@pytest.mark.parametrize("name", PASSING)
def test_case_passes(name: str) -> None:
  status, msg = C.run_case(name)
  assert status == "pass", msg

@pytest.mark.slow
@pytest.mark.parametrize("name", [r[0] for r in ROWS if r[2] != "out" and r[0] not in set(PASSING)])
def test_case_never_wrong(name: str) -> None:
  status, msg = C.run_case(name)
  assert status in ("pass", "unsupported"), msg

POOLS = [
  ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
  ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1, dilations=[1, 1])),
  ("MaxPool", dict(kernel_shape=[3], strides=[2], auto_pad="SAME_UPPER")),
  ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=0)),
  ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1, ceil_mode=1)),
  ("AveragePool", dict(kernel_shape=[2, 2, 2], strides=[1, 2, 2])),
  ("LpPool", dict(kernel_shape=[2, 2], strides=[2, 2], p=2)),
]

@pytest.mark.parametrize("op,attrs", POOLS, ids=[f"{o}-{i}" for i, (o, _) in enumerate(POOLS)])
def test_pool_vs_onnxruntime(op: str, attrs: dict) -> None:
  ort = pytest.importorskip("onnxruntime")
  from onnx import TensorProto, helper
  from tilecraft.onnx import load
  nd = len(attrs["kernel_shape"])
  shape = [2, 3] + [9, 7, 6][:nd]
  x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
  y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
  g = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], "g", [x], [y])
  m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
  m.ir_version = 8
  data = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
  ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": data})[0]
  np.testing.assert_allclose(load(m).run({"x": data})["y"], ref, rtol=1e-5, atol=1e-6)

def test_low_precision_attention_is_closer_than_its_reference() -> None:
  """The bfloat16 Attention cases left out (conformance.ROUNDED_PER_OP): tilecraft's output is within half
  a bfloat16 ulp (plus float32 noise) of the float64 result, and nearer to it than the case's expected values."""
  from onnx.reference import ReferenceEvaluator
  from tilecraft.onnx import load
  for name in ("test_attention_4d_causal_bf16", "test_attention_4d_padded_kv_bf16", "test_attention_3d_causal_bf16"):
    assert name in C.ROUNDED_PER_OP and C.scope(name)[0] == "out"
    c = C.get_case(name)
    inputs, outputs = c.data_sets[0]
    inputs = [C._arr(v) for v in inputs]
    m = load(c.model)
    names = [n for n, _ in m.inputs]
    got = m.run(dict(zip(names, inputs)))[m.outputs[0][0]].astype(np.float64)
    wide = onnx.ModelProto()
    wide.CopyFrom(c.model)
    for vi in list(wide.graph.input) + list(wide.graph.output): vi.type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    truth = ReferenceEvaluator(wide).run(None, {n: x.astype(np.float64) for n, x in zip(names, inputs)})[0]
    ulp = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(truth), 2.0 ** -126))) - 7)  # bfloat16's spacing at each value
    assert np.all(np.abs(got - truth) <= 0.5 * ulp * 1.05 + 1e-6), name
    assert np.abs(got - truth).max() < np.abs(C._arr(outputs[0]).astype(np.float64) - truth).max(), name

def test_noisy_dft_references_are_no_nearer_than_ours() -> None:
  """The inverse DFT cases left out (conformance.REFERENCE_NOISE): their expected values hold a float32 FFT's noise above
  the case's atol; tilecraft's result is at least as near the float64 inverse transform."""
  from tilecraft.onnx import load
  for name in sorted(C.REFERENCE_NOISE):
    assert C.scope(name)[0] == "out"
    c = C.get_case(name)
    inputs, outputs = c.data_sets[0]
    x, want = C._arr(inputs[0]), C._arr(outputs[0]).astype(np.float64)
    m = load(c.model)
    got = m.run(dict(zip([n for n, _ in m.inputs], [C._arr(v) for v in inputs])))[m.outputs[0][0]].astype(np.float64)
    exact = np.fft.ifft(x[..., 0].astype(np.float64) + 1j * x[..., 1], axis=1)
    exact = np.stack([exact.real, exact.imag], -1)
    assert np.abs(got - exact).max() <= np.abs(want - exact).max() < 1e-5
