"""The ONNX op table. Contract: `op(name, ...)` registers `fn(node, inputs) -> Tensor | list[Tensor]` for
an op type from a first opset on (a later registration of the same name from a later opset wins for
opsets at or above it). `lookup(op_type, opset)` returns the implementation for the model's opset or
raises NotImplementedError. `Node` is what an implementation sees: the op, its attributes (plain python
values), the opset, and `static(i)` to read an input whose value must be known to build the graph
(shapes, axes, pads: a numpy array). Implementations raise `unsupported(node, why)` for any case they
don't cover (a NotImplementedError naming the node, the op and the opset): never a guess."""
from __future__ import annotations
from typing import Any, Callable, Optional, Sequence
import numpy as np

class Node:
  """One ONNX node as the op implementations see it."""
  __slots__ = ("name", "op", "opset", "attrs", "inputs", "outputs", "_static", "device")
  def __init__(self, name: str, op: str, opset: int, attrs: dict[str, Any], inputs: Sequence[str], outputs: Sequence[str],
               static: Callable[[int], Optional[np.ndarray]], device: str):
    self.name, self.op, self.opset, self.attrs = name, op, opset, attrs
    self.inputs, self.outputs, self._static, self.device = list(inputs), list(outputs), static, device
  def attr(self, key: str, default: Any = None) -> Any:
    return self.attrs.get(key, default)
  def static(self, i: int) -> Optional[np.ndarray]:
    """Input i's value as numpy (None when the input is absent)."""
    if i >= len(self.inputs) or self.inputs[i] == "": return None
    return self._static(i)
  def has(self, i: int) -> bool:
    return i < len(self.inputs) and self.inputs[i] != ""
  def describe(self) -> str:
    return f"node {self.name!r} (op {self.op}, opset {self.opset})"

def unsupported(node: Node, why: str = "") -> NotImplementedError:
  """The error for a case this frontend doesn't implement."""
  return NotImplementedError(f"tilecraft.onnx: {node.describe()} is not supported" + (f": {why}" if why else ""))

OpFn = Callable[[Node, list[Any]], Any]
_TABLE: dict[str, list[tuple[int, OpFn]]] = {}

def op(*names: str, since: int = 1) -> Callable[[OpFn], OpFn]:
  """Register fn for the op types `names` from opset `since` on."""
  def deco(fn: OpFn) -> OpFn:
    for n in names:
      _TABLE.setdefault(n, []).append((since, fn))
      _TABLE[n].sort(key=lambda e: e[0])
    return fn
  return deco

def lookup(op_type: str, opset: int, domain: str = "") -> Optional[OpFn]:
  """The implementation of op_type at opset, or None."""
  if domain not in ("", "ai.onnx"): return None
  best = None
  for since, fn in _TABLE.get(op_type, []):
    if since <= opset: best = fn
  return best

def since_of(op_type: str, opset: int) -> int:
  """The opset the implementation lookup(op_type, opset) was registered from (0: none)."""
  return max((s for s, _ in _TABLE.get(op_type, []) if s <= opset), default=0)

def registered() -> list[str]:
  return sorted(_TABLE)
