"""Shared by the ONNX model tests (tests/onnx/test_light_models.py, test_zoo_models.py): a model against onnxruntime."""
from __future__ import annotations
from typing import Any, Callable, Optional
import numpy as np

def check_matches_onnxruntime(model: Any, make_input: Callable[[Any, int], dict], device: Optional[str], what: str) -> None:
  """`model` on `device` gives onnxruntime's outputs within rtol 1e-3 for the inputs of seeds 0 and 1 (the second call
  reruns the graph the first built); each reference output finite and varied (the weights' scaling holds)."""
  import onnxruntime as ort
  from tilecraft.onnx import load
  sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
  tm = load(model, device)
  for seed in (0, 1):
    inp = make_input(model, seed)
    ref = sess.run(None, inp)
    out = tm.run(inp)
    for o, r in zip(model.graph.output, ref):
      assert np.isfinite(r).all() and r.std() > 1e-3 * np.abs(r).max() > 0
      np.testing.assert_allclose(out[o.name], r, rtol=1e-3, atol=1e-5 * float(np.abs(r).max()), err_msg=f"{what} on {device or 'CPU'}, input seed {seed}: {o.name}")
