"""tilecraft.onnx.backend (API): tilecraft as an `onnx.backend.base.Backend`. Contract:
`prepare(model, device="CPU")` loads the model (NotImplementedError for anything unsupported) and
returns a BackendRep whose `run(inputs)` takes a list (graph input order, initializers excluded) or a
dict and returns the outputs as a tuple in graph output order (onnx's namedtuple-like `Outputs`);
`run_model` is prepare + run, `run_node` runs one NodeProto on its inputs (a graph is built around
it with shape inference), `supports_device` names the tilecraft devices (CPU, LLVM, OPENCL, CUDA, ...)."""
from __future__ import annotations
from typing import Any, Optional, Sequence
import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep
from tilecraft.onnx.graph import OnnxModel, load

def _device(device: Optional[str]) -> Optional[str]:
  if device is None: return None
  d = str(device).upper().split(":")[0]
  return None if d == "" else d

class TilecraftRep(BackendRep):
  """A prepared model: `run(inputs)` -> outputs in graph order."""
  def __init__(self, model: OnnxModel):
    self.model = model
  def run(self, inputs: Any, **kwargs: Any) -> tuple:  # type: ignore[override]
    names = [n for n, _ in self.model.inputs]
    if isinstance(inputs, dict): feed = dict(inputs)
    else:
      if isinstance(inputs, np.ndarray): inputs = [inputs]
      inputs = list(inputs)
      if len(inputs) > len(names): raise ValueError(f"{len(inputs)} inputs for a graph of {len(names)} ({names})")
      feed = dict(zip(names, inputs))
    out = self.model.run(feed)
    from onnx.backend.base import namedtupledict
    keys = [n for n, _ in self.model.outputs]
    return namedtupledict("Outputs", [k if k.isidentifier() else f"o{j}" for j, k in enumerate(keys)])(*[out[k] for k in keys])

class TilecraftBackend(Backend):
  @classmethod
  def is_compatible(cls, model: Any, device: str = "CPU", **kwargs: Any) -> bool:
    try:
      load(model, _device(device))
      return True
    except NotImplementedError: return False
  @classmethod
  def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> TilecraftRep:  # type: ignore[override]
    return TilecraftRep(load(model, _device(device)))
  @classmethod
  def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple:  # type: ignore[override]
    return cls.prepare(model, device, **kwargs).run(inputs)
  @classmethod
  def run_node(cls, node: Any, inputs: Any, device: str = "CPU", outputs_info: Optional[Sequence[tuple]] = None, **kwargs: Any) -> tuple:  # type: ignore[override]
    from onnx import helper
    arrs = list(inputs.values()) if isinstance(inputs, dict) else list(inputs)
    in_names = [n for n in node.input if n != ""]
    vis = [helper.make_tensor_value_info(nm, helper.np_dtype_to_tensor_dtype(np.asarray(a).dtype), np.asarray(a).shape) for nm, a in zip(in_names, arrs)]
    outs = [helper.make_tensor_value_info(nm, 0, None) for nm in node.output if nm != ""]
    opset = kwargs.get("opset_version", 21)
    g = helper.make_graph([node], "run_node", vis, outs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m = onnx.shape_inference.infer_shapes(m)
    return cls.run_model(m, dict(zip(in_names, arrs)), device)
  @classmethod
  def supports_device(cls, device: str) -> bool:
    from tilecraft.device import DEVICES
    return _device(device) in DEVICES

backend = TilecraftBackend
prepare = TilecraftBackend.prepare
run_model = TilecraftBackend.run_model
run_node = TilecraftBackend.run_node
supports_device = TilecraftBackend.supports_device
