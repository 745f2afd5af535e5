"""Graph rewrites at load time, on the node list before anything is built. Contract:
`fold_batchnorm(nodes, consts, graph_outputs)` folds each inference-mode BatchNormalization whose input
is a Conv's output (read by nothing else, not a graph output), with the Conv's weight and bias and all
four of the BatchNorm's parameters initializers, into that Conv: W' = W * s and b' = (b - mean) * s + beta
per output channel, s = scale / sqrt(var + epsilon), computed in float64 and stored in the weight's dtype
under new initializer names (the originals may be read elsewhere). The folded Conv takes the BatchNorm's
output name; the BatchNorm node is dropped. Returns the new node list and how many were folded. Anything
that doesn't match exactly is left alone: the BatchNorm then runs as itself (fused into the Conv's
kernel as an epilogue by the scheduler, with its per-channel arithmetic done per element)."""
from __future__ import annotations
from typing import Any
import numpy as np

def _bn_params_ok(bn: Any, attrs: dict[str, Any], opset: int) -> bool:
  if attrs.get("training_mode", 0) or (opset < 7 and not attrs.get("is_test", 0)): return False
  if opset < 9 and not attrs.get("spatial", 1): return False
  return len([o for o in bn.output if o]) == 1 and len(bn.input) >= 5

def fold_batchnorm(nodes: list[tuple[Any, dict[str, Any], Any]], consts: dict[str, np.ndarray], graph_outputs: set[str],
                   opset: int) -> tuple[list[tuple[Any, dict[str, Any], Any]], int]:
  """(nodes with each foldable Conv -> BatchNormalization pair made one Conv, count folded); new
  initializers are added to `consts`."""
  readers: dict[str, int] = {}
  for n, _, _ in nodes:
    for x in n.input:
      if x: readers[x] = readers.get(x, 0) + 1
  producer = {o: j for j, (n, _, _) in enumerate(nodes) for o in n.output if o}
  replaced: dict[int, tuple[Any, dict[str, Any], Any]] = {}
  dropped: set[int] = set()
  for j, (bn, attrs, _) in enumerate(nodes):
    if bn.op_type != "BatchNormalization" or not _bn_params_ok(bn, attrs, opset): continue
    src = bn.input[0]
    if (ci := producer.get(src)) is None or ci in replaced or readers.get(src, 0) != 1 or src in graph_outputs: continue
    conv, cattrs, cfn = nodes[ci]
    if conv.op_type != "Conv" or len(conv.input) < 2 or conv.input[1] not in consts: continue
    has_bias = len(conv.input) > 2 and conv.input[2] != ""
    if has_bias and conv.input[2] not in consts: continue
    if any(p not in consts for p in bn.input[1:5]): continue
    w = consts[conv.input[1]]
    if w.dtype.kind != "f" or w.ndim < 3: continue
    scale, beta, mean, var = (consts[p].astype(np.float64).reshape(-1) for p in bn.input[1:5])
    cout = w.shape[0]
    if not all(p.size == cout for p in (scale, beta, mean, var)): continue
    bias = consts[conv.input[2]].astype(np.float64).reshape(-1) if has_bias else np.zeros(cout)
    if bias.size != cout: continue
    s = scale / np.sqrt(var + float(attrs.get("epsilon", 1e-5)))
    out = bn.output[0]
    w_name, b_name = f"{out}::bnfold_w", f"{out}::bnfold_b"
    consts[w_name] = (w.astype(np.float64) * s.reshape(-1, *([1] * (w.ndim - 1)))).astype(w.dtype)
    consts[b_name] = ((bias - mean) * s + beta).astype(w.dtype)
    import onnx
    folded = onnx.NodeProto()
    folded.CopyFrom(conv)
    del folded.input[:]
    folded.input.extend([conv.input[0], w_name, b_name])
    folded.output[0] = out
    replaced[ci] = (folded, cattrs, cfn)
    dropped.add(j)
  new = [replaced.get(j, e) for j, e in enumerate(nodes) if j not in dropped]
  return new, len(dropped)
