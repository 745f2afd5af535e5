"""tilecraft.onnx.zoo's models (built with onnx.helper: a BERT-style encoder, MobileNet-v2, EfficientNet-B0) against
onnxruntime within rtol 1e-3, two inputs each (the second call reruns the built graph): on the default CPU device in
the default tier (each compiles 40-120 kernels, a few seconds cold), on LLVM in the slow tier."""
from __future__ import annotations
import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from tilecraft.onnx import load  # noqa: E402
from tilecraft.onnx.zoo import zoo_input, zoo_model, zoo_model_names  # noqa: E402

NAMES = ["bert_like", "mobilenet_v2", "efficientnet_b0"]

def test_zoo_lists_its_models_and_names_an_unknown_one() -> None:
  assert zoo_model_names() == NAMES
  with pytest.raises(ValueError, match="unknown zoo model 'resnet9'.*mobilenet_v2"): zoo_model("resnet9")

def check_matches_onnxruntime(name: str, device: str | None) -> None:
  m = zoo_model(name, seed=0)
  sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
  tm = load(m, device)
  for seed in (0, 1):
    inp = zoo_input(m, seed=seed)
    ref = sess.run(None, inp)
    out = tm.run(inp)
    for o, r in zip(m.graph.output, ref):
      assert np.isfinite(r).all() and r.std() > 1e-3 * np.abs(r).max() > 0  # (finite and varied: the weights' scaling holds)
      np.testing.assert_allclose(out[o.name], r, rtol=1e-3, atol=1e-5 * float(np.abs(r).max()), err_msg=f"{name} on {device or 'CPU'}, input seed {seed}")

@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", NAMES)
def test_zoo_model_matches_onnxruntime(name: str) -> None:
  check_matches_onnxruntime(name, None)

@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name", NAMES)
def test_zoo_model_on_llvm_matches_onnxruntime(name: str) -> None:
  check_matches_onnxruntime(name, "LLVM")
