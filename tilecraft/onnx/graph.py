"""Loading an ONNX model and walking its graph. Contract: `load(model, device)` takes a path, bytes or
an `onnx.ModelProto` (default domain opsets 7 to 21) and returns an `OnnxModel`; at load every node's op
is looked up for the model's opset, and an op with no implementation, a node of another domain, a
subgraph attribute or a tensor type tilecraft has no dtype for is a NotImplementedError naming the node,
the op and the opset. `OnnxModel.run(inputs)` builds the graph lazily with the Tensor frontend, node by
node in the file's (topological) order, realizes all graph outputs together and returns them as numpy
arrays keyed by output name, in the dtypes the graph declares. Values an op needs at graph-build time
(shapes, axes, pads) are read as numpy: initializers, Constant nodes, graph inputs and Shape outputs are
kept as numpy alongside their Tensors, anything else is realized to read it."""
from __future__ import annotations
import os
from typing import Any, Optional, Union
import numpy as np
from tilecraft.dtype import DType, dtypes
from tilecraft.onnx.registry import Node, lookup, since_of, unsupported
from tilecraft.onnx.types import onnx_dtype
from tilecraft.tensor import Tensor

MIN_OPSET, MAX_OPSET = 7, 21
# Newer opsets are accepted op by op: a node runs when its op's schema at the model's opset has the
# same attributes (and defaults), inputs, outputs and text as its newest version <= MAX_OPSET, i.e. the
# newer version only widened the types (ONNX 1.17+ added bfloat16, float4, int2 ... to many ops). The
# pools' newer text only spells out the ceil_mode rule implemented here (a window starting in the right
# pad is dropped).
NEWEST_OPSET = 28
_CLARIFIED_ONLY = {"AveragePool", "MaxPool"}
# newer versions whose changes don't reach what is implemented here: Cast/CastLike gained round_mode, which
# only applies to float8e8m0 (refused); BitShift and Mod now define signed types, out-of-range shifts and
# float special cases, which the implementations here follow (they are the older versions' behavior where
# that was defined)
_COMPATIBLE = {"Cast", "CastLike", "BitShift", "Mod"}

def _same_as_supported(op_type: str, opset: int) -> bool:
  """Whether op_type at `opset` (> MAX_OPSET) means what it meant at MAX_OPSET."""
  import onnx.defs
  try: new, old = onnx.defs.get_schema(op_type, opset), onnx.defs.get_schema(op_type, MAX_OPSET)
  except Exception: return False  # noqa: BLE001  (an op newer than MAX_OPSET)
  if new.since_version <= MAX_OPSET or op_type in _COMPATIBLE: return True
  def sig(sc: Any) -> tuple:
    return (sorted((k, str(a.default_value)) for k, a in sc.attributes.items()), [(i.name, i.option) for i in sc.inputs],
            [(o.name, o.option) for o in sc.outputs])
  return sig(new) == sig(old) and (new.doc == old.doc or op_type in _CLARIFIED_ONLY)

def _attr_value(a: Any, where: str) -> Any:
  import onnx
  from onnx import numpy_helper
  t = a.type
  A = onnx.AttributeProto
  if t == A.FLOAT: return float(a.f)
  if t == A.INT: return int(a.i)
  if t == A.STRING: return a.s.decode("utf-8", "replace")
  if t == A.FLOATS: return [float(x) for x in a.floats]
  if t == A.INTS: return [int(x) for x in a.ints]
  if t == A.STRINGS: return [s.decode("utf-8", "replace") for s in a.strings]
  if t == A.TENSOR:
    onnx_dtype(a.t.data_type, where)
    return numpy_helper.to_array(a.t)
  raise NotImplementedError(f"tilecraft.onnx: {where}: attribute {a.name!r} of type {A.AttributeType.Name(t)} (subgraphs, sparse tensors, type protos) is not supported")

def _same_below(op_type: str, opset: int) -> bool:
  """Whether op_type at `opset` (< MIN_OPSET) is the same version as at MIN_OPSET (a model of an old opset
  using only ops that haven't changed since)."""
  import onnx.defs
  try: return onnx.defs.get_schema(op_type, opset).since_version == onnx.defs.get_schema(op_type, MIN_OPSET).since_version
  except Exception: return False  # noqa: BLE001

def _as_model(model: Any) -> Any:
  import onnx
  if isinstance(model, onnx.ModelProto): return model
  if isinstance(model, (bytes, bytearray)): return onnx.load_model_from_string(bytes(model))
  if isinstance(model, (str, os.PathLike)): return onnx.load(os.fspath(model))
  raise TypeError(f"tilecraft.onnx.load takes a path, bytes or an onnx.ModelProto, got {type(model).__name__}")

def _to_numpy_input(x: Any, dt: DType, name: str) -> np.ndarray:
  arr = np.asarray(x)
  if dt == dtypes.bfloat16:
    if arr.dtype.name != "bfloat16" and arr.dtype.kind != "f": raise TypeError(f"tilecraft.onnx: input {name!r} is {arr.dtype}, the graph declares bfloat16")
    return arr.astype(np.float32)  # (ml_dtypes' bfloat16 values, exactly)
  want = dt.np
  if arr.dtype != want:
    if arr.dtype.kind != np.dtype(want).kind and not (arr.size == 0):
      raise TypeError(f"tilecraft.onnx: input {name!r} is {arr.dtype}, the graph declares {dt.name}")
    arr = arr.astype(want)
  return arr

class OnnxModel:
  """A loaded ONNX model on a device. `run(inputs)` -> outputs keyed by graph output name."""
  def __init__(self, model: Any, device: Optional[str] = None):
    from onnx import numpy_helper
    self.proto = model
    self.device = device
    self.opset = 0
    for imp in model.opset_import:
      if imp.domain in ("", "ai.onnx"): self.opset = int(imp.version)
    if not 1 <= self.opset <= NEWEST_OPSET:
      raise NotImplementedError(f"tilecraft.onnx: the model's default-domain opset {self.opset} is outside the supported {MIN_OPSET}..{MAX_OPSET}")
    g = model.graph
    if len(g.sparse_initializer): raise NotImplementedError("tilecraft.onnx: sparse initializers are not supported")
    self.consts: dict[str, np.ndarray] = {}
    for init in g.initializer:
      onnx_dtype(init.data_type, f"initializer {init.name!r}")
      self.consts[init.name] = numpy_helper.to_array(init)
    self.inputs: list[tuple[str, DType]] = []
    for vi in g.input:
      if vi.name in self.consts: continue
      tt = vi.type
      if tt.WhichOneof("value") != "tensor_type": raise NotImplementedError(f"tilecraft.onnx: graph input {vi.name!r} is a {tt.WhichOneof('value')}, not a tensor")
      self.inputs.append((vi.name, onnx_dtype(tt.tensor_type.elem_type, f"graph input {vi.name!r}")))
    self.outputs: list[tuple[str, Optional[DType]]] = []
    for vi in g.output:
      tt = vi.type
      if tt.WhichOneof("value") != "tensor_type": raise NotImplementedError(f"tilecraft.onnx: graph output {vi.name!r} is a {tt.WhichOneof('value')}, not a tensor")
      et = tt.tensor_type.elem_type
      self.outputs.append((vi.name, onnx_dtype(et, f"graph output {vi.name!r}") if et else None))
    self.nodes: list[tuple[Any, dict[str, Any], Any]] = []
    for i, n in enumerate(g.node):
      name = n.name or f"#{i}:{n.op_type}"
      where = f"node {name!r} (op {n.op_type}, opset {self.opset})"
      if n.domain not in ("", "ai.onnx"): raise NotImplementedError(f"tilecraft.onnx: {where}: domain {n.domain!r} is not supported")
      fn = lookup(n.op_type, self.opset)
      if fn is not None and self.opset > MAX_OPSET and since_of(n.op_type, self.opset) <= MAX_OPSET and not _same_as_supported(n.op_type, self.opset):
        raise NotImplementedError(f"tilecraft.onnx: {where}: this op changed after opset {MAX_OPSET} (supported: {MIN_OPSET}..{MAX_OPSET})")
      if fn is None: raise NotImplementedError(f"tilecraft.onnx: {where} is not supported")
      if self.opset < MIN_OPSET and not _same_below(n.op_type, self.opset):
        raise NotImplementedError(f"tilecraft.onnx: {where}: opset {self.opset} is below the supported {MIN_OPSET}..{MAX_OPSET} and this op changed since")
      attrs = {a.name: _attr_value(a, where) for a in n.attribute}
      self.nodes.append((n, attrs, fn))
    self._init_tensors: dict[str, Tensor] = {}

  def _const_tensor(self, name: str) -> Tensor:
    t = self._init_tensors.get(name)
    if t is None: t = self._init_tensors[name] = Tensor(self.consts[name], device=self.device)
    return t

  def run(self, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
    """Run the graph on numpy inputs (by graph input name); outputs as numpy, keyed by graph output name."""
    env: dict[str, Any] = {}
    known: dict[str, np.ndarray] = dict(self.consts)
    for name, dt in self.inputs:
      if name not in inputs: raise ValueError(f"tilecraft.onnx: missing graph input {name!r} (inputs: {[n for n, _ in self.inputs]})")
      arr = _to_numpy_input(inputs[name], dt, name)
      known[name] = arr
      env[name] = Tensor(arr, device=self.device, dtype=dt)
    extra = set(inputs) - {n for n, _ in self.inputs}
    for name in extra:
      if name not in self.consts: raise ValueError(f"tilecraft.onnx: {name!r} is not an input of the graph")
      arr = np.asarray(inputs[name]); known[name] = arr; env[name] = Tensor(arr, device=self.device)  # overriding an initializer
    def value(name: str) -> Any:
      if name == "": return None
      if name in env: return env[name]
      if name in self.consts: return self._const_tensor(name)
      raise ValueError(f"tilecraft.onnx: value {name!r} is used before it is computed")
    for n, attrs, fn in self.nodes:
      ins = [value(x) for x in n.input]
      def static(i: int, _ins: list[Any] = ins, _n: Any = n) -> Optional[np.ndarray]:
        nm = _n.input[i]
        if nm in known: return known[nm]
        t = _ins[i]
        return None if t is None else t.numpy()
      node = Node(n.name or n.op_type, n.op_type, self.opset, attrs, list(n.input), list(n.output), static, self.device or "")
      outs = fn(node, ins)
      if not isinstance(outs, (list, tuple)): outs = [outs]
      for i, oname in enumerate(n.output):
        if oname == "": continue
        if i >= len(outs) or outs[i] is None: raise unsupported(node, f"output {i} ({oname!r}) is not produced")
        o = outs[i]
        if isinstance(o, np.ndarray):  # a value known at build time (Shape, Constant, ...)
          known[oname] = o
          if o.dtype.name == "bfloat16": o = Tensor(o.astype(np.float32), device=self.device, dtype=dtypes.bfloat16)
          else: o = Tensor(o, device=self.device)
        env[oname] = o
    res = [env[name] if name in env else value(name) for name, _ in self.outputs]
    for (name, dt), i in zip(self.outputs, range(len(res))):
      if dt is not None and res[i].dtype != dt: res[i] = res[i].cast(dt)
    if res: Tensor.realize(*res) if len(res) > 1 else res[0].realize()
    return {name: _out_numpy(r) for (name, _), r in zip(self.outputs, res)}

def _out_numpy(t: Tensor) -> np.ndarray:
  a = t.numpy()
  if t.dtype == dtypes.bfloat16:
    try:
      import ml_dtypes
      return a.astype(ml_dtypes.bfloat16)
    except ImportError: return a
  return a

def load(model: Union[str, bytes, os.PathLike, Any], device: Optional[str] = None) -> OnnxModel:
  """Load an ONNX model (path, bytes or onnx.ModelProto) for running on `device` (default: the default device)."""
  import tilecraft.onnx.ops  # noqa: F401  (registers the op implementations)
  return OnnxModel(_as_model(model), device)
