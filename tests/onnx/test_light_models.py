"""The onnx package's nine light models (seeded random weights, tilecraft.onnx.light) against
onnxruntime on the default CPU device: the logits (the final Softmax's input) and the probabilities
match within rtol 1e-3. Slow tier: each model compiles tens of kernels."""
from __future__ import annotations
import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from tilecraft.onnx import load  # noqa: E402
from tilecraft.onnx.light import light_input, light_model, light_model_names  # noqa: E402

@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet",
                                  "vgg19", "zfnet512"])
def test_light_model_matches_onnxruntime(name: str) -> None:
  assert name in light_model_names()
  m = light_model(name, seed=0)
  inp = light_input(m, seed=0)
  ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inp)
  out = load(m).run(inp)
  for o, r in zip(m.graph.output, ref):
    assert np.isfinite(r).all() and np.abs(r).max() > 0
    np.testing.assert_allclose(out[o.name], r, rtol=1e-3, atol=1e-5 * float(np.abs(r).max()), err_msg=f"{name}: {o.name}")
