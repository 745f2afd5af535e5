"""The ONNX op table. Contract: `op(name, ...)` registers `fn(node, inputs) -> Tensor | list[Tensor]` for
an op type from a first opset on (a later registration of the same name from a later opset wins for
opsets at or above it). `lookup(op_type, opset)` returns the implementation for the model's opset or
raises NotImplementedError. `Node` is what an implementation sees: the op, its attributes (plain python
values), the opset, and `static(i)` to read an input whose value must be known to build the graph
(shapes, axes, pads: a numpy array; a value that depends on the graph inputs' data makes the built graph
valid for those data only), `const(i)` for an input's value only when it is known without reading any
graph input's data (else None, nothing realized), `derived(i, kind, make)` for a Tensor of a constant
input transformed once per model (a weight's layout), `host(idxs, fn)` for a value the host computes from
graph inputs and constants in every call (an embedding lookup), and `check_indices(i, size, axis)` to guard index
inputs (an index outside -size..size-1 is an IndexError naming the node, the axis and the index, raised
by the graph at build time or after the run, never a wrong answer). Implementations raise
`unsupported(node, why)` for any case they don't cover (a NotImplementedError naming the node, the op
and the opset): never a guess."""
from __future__ import annotations
from typing import Any, Callable, Optional, Sequence
import numpy as np

class Node:
  """One ONNX node as the op implementations see it."""
  __slots__ = ("name", "op", "opset", "attrs", "inputs", "outputs", "_static", "device", "_const", "_guard", "_derived", "_host")
  def __init__(self, name: str, op: str, opset: int, attrs: dict[str, Any], inputs: Sequence[str], outputs: Sequence[str],
               static: Callable[[int], Optional[np.ndarray]], device: str, const: Optional[Callable[[int], Optional[np.ndarray]]] = None,
               guard: Optional[Callable[["Node", int, int, int, Optional[int]], None]] = None,
               derived: Optional[Callable[[int, str, Callable[[np.ndarray], np.ndarray]], Any]] = None,
               host: Optional[Callable[[Sequence[int], Callable[..., np.ndarray]], Any]] = None):
    self.name, self.op, self.opset, self.attrs = name, op, opset, attrs
    self.inputs, self.outputs, self._static, self.device = list(inputs), list(outputs), static, device
    self._const, self._guard, self._derived, self._host = const, guard, derived, host
  def attr(self, key: str, default: Any = None) -> Any:
    return self.attrs.get(key, default)
  def static(self, i: int) -> Optional[np.ndarray]:
    """Input i's value as numpy (None when the input is absent)."""
    if i >= len(self.inputs) or self.inputs[i] == "": return None
    return self._static(i)
  def const(self, i: int) -> Optional[np.ndarray]:
    """Input i's value as numpy when it is known without the graph inputs' data (initializers, Constant
    nodes, shapes); None otherwise (nothing is realized)."""
    if i >= len(self.inputs) or self.inputs[i] == "" or self._const is None: return None
    return self._const(i)
  def derived(self, i: int, kind: str, make: Callable[[np.ndarray], np.ndarray]) -> Any:
    """A Tensor of make(input i's value), for a constant input i (see const): made once per model and `kind` (a
    weight's panel layout), whatever input signature the graph is built for; None where input i isn't constant."""
    if self.const(i) is None or self._derived is None: return None
    return self._derived(i, kind, make)
  def host(self, idxs: Sequence[int], fn: Callable[..., np.ndarray]) -> Any:
    """A Tensor of fn(*values of inputs idxs) computed on the host, in every call, where each of those inputs is a
    graph input or a constant (an embedding table's Gather by token ids: a copy of rows, not a one-hot select over
    the vocabulary); None otherwise (computed inputs, overridden initializers, no graph). Runs after the host index
    guards (check_indices), so fn sees valid indices."""
    if self._host is None or any(not self.has(i) for i in idxs): return None
    return self._host(idxs, fn)
  def check_indices(self, i: int, size: int, axis: int, column: Optional[int] = None) -> None:
    """Input i holds indices into an axis of `size` elements (negative ones count from the end): one
    outside -size..size-1 is an IndexError naming this node, the axis and the index. `column`: only
    that position of the indices' last axis (GatherND). Without a graph to guard, nothing is checked."""
    if self._guard is not None and self.has(i): self._guard(self, i, size, axis, column)
  def check_lengths(self, i: int, most: int, axis: int) -> None:
    """Input i holds lengths along an axis of `most` elements (sequence_lens): one outside 0..most (a negative one
    too, which an index would allow) is an IndexError naming this node, checked where check_indices checks."""
    if self._guard is not None and self.has(i): self._guard(self, i, most + 1, axis, None, True)
  def has(self, i: int) -> bool:
    return i < len(self.inputs) and self.inputs[i] != ""
  def describe(self) -> str:
    return f"node {self.name!r} (op {self.op}, opset {self.opset})"

def index_error(node: Node, index: int, size: int, axis: int, column: Optional[int] = None, lengths: bool = False) -> IndexError:
  """The error for an index outside -size..size-1 (onnxruntime refuses these too; a one-hot gather would give 0), or with
  `lengths` for a length outside 0..size-1."""
  if lengths: return IndexError(f"tilecraft.onnx: {node.describe()}: length {index} is out of range for axis {axis} of size {size - 1} (valid: 0..{size - 1})")
  col = f" (column {column} of the indices)" if column is not None else ""
  return IndexError(f"tilecraft.onnx: {node.describe()}: index {index}{col} is out of range for axis {axis} of size {size} (valid: {-size}..{size - 1})")

def in_range(v: int, size: int, lengths: bool) -> bool:
  """An index in -size..size-1, or a length in 0..size-1."""
  return (0 if lengths else -size) <= v < size

def check_host(node: Node, idx: np.ndarray, size: int, axis: int, column: Optional[int], lengths: bool = False) -> None:
  """check_indices / check_lengths on values the host holds: the IndexError for the first bound idx passes."""
  if idx.size == 0: return
  lo, hi = int(idx.min()), int(idx.max())
  if not in_range(lo, size, lengths) or not in_range(hi, size, lengths): raise index_error(node, hi if hi >= size else lo, size, axis, column, lengths)

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
