"""tilecraft.onnx (API, optional extra `[onnx]`): run ONNX models with tilecraft.

  load(model, device=None, fold=True) -> OnnxModel   model: a path, bytes or onnx.ModelProto (opsets 7 to 21);
                                          fold: BatchNorm folded into Conv, constant folding
  OnnxModel.run({name: ndarray}) -> {output name: ndarray}   (built once per input signature, then rerun)
  tilecraft.onnx.backend                  onnx.backend.base.Backend (prepare / run_model / run_node)
  tilecraft.onnx.light                    the onnx package's light models with seeded random weights

Files: graph.py (loading, the graph walk, reuse per input signature, index guards, constant folding),
fold.py (BatchNorm folded into Conv), types.py (ONNX element types), registry.py (the op table, Node,
unsupported, index_error),
ops/ (op implementations by family), backend.py, light.py. Anything unsupported raises
NotImplementedError naming the node, the op and the opset, at load or at run, never a guess; an index
out of range is an IndexError naming the node, the axis and the index. docs/onnx.md says more.
Importing this package needs the `onnx` package only when a model is loaded."""
from tilecraft.onnx.graph import MAX_OPSET, MIN_OPSET, OnnxModel, load

__all__ = ["load", "OnnxModel", "MIN_OPSET", "MAX_OPSET"]
