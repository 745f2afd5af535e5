"""tilecraft.onnx (API, optional extra `[onnx]`): run ONNX models with tilecraft.

  load(model, device=None) -> OnnxModel   model: a path, bytes or onnx.ModelProto (opsets 7 to 21)
  OnnxModel.run({name: ndarray}) -> {output name: ndarray}
  tilecraft.onnx.backend                  onnx.backend.base.Backend (prepare / run_model / run_node)
  tilecraft.onnx.light                    the onnx package's light models with seeded random weights

Files: graph.py (loading and the graph walk), types.py (ONNX element types), registry.py (the op table,
Node, unsupported),
ops/ (op implementations by family), backend.py, light.py. Anything unsupported raises
NotImplementedError naming the node, the op and the opset, at load or at run, never a guess.
Importing this package needs the `onnx` package only when a model is loaded."""
from tilecraft.onnx.graph import MAX_OPSET, MIN_OPSET, OnnxModel, load

__all__ = ["load", "OnnxModel", "MIN_OPSET", "MAX_OPSET"]
