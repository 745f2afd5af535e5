"""Loading an ONNX model and walking its graph. Contract: `load(model, device)` takes a path, bytes or
an `onnx.ModelProto` (default domain opsets 7 to 21) and returns an `OnnxModel`; at load every node's op
is looked up for the model's opset, and an op with no implementation, a node of another domain (but the
ai.onnx.preview ops in PREVIEW_OPS), a subgraph attribute of an op that takes none (it has no
implementation: If, Loop, Scan) or a tensor type tilecraft has no dtype for is a NotImplementedError naming the node,
the op and the opset. `OnnxModel.run(inputs)` builds the graph lazily with the Tensor frontend, node by
node in the file's (topological) order, realizes all graph outputs together and returns them as numpy
arrays keyed by output name, in the dtypes the graph declares. Values an op needs at graph-build time
(shapes, axes, pads) are read as numpy: initializers, Constant nodes, graph inputs and Shape outputs are
kept as numpy alongside their Tensors, anything else is realized to read it.

Reuse: the first call with an input signature (names, shapes, dtypes) builds the graph and keeps it as a
_Capture: the schedule with its buffers; later calls with that signature copy the inputs into the same
input buffers, launch the schedule's kernels, bound once to their runners and buffers (engine/realize.py:
BoundSchedule, whose intermediates share one arena where their lifetimes allow: engine/memory_plan.py),
and copy the outputs straight out of their buffers: no graph building, no scheduling, no per-kernel
lookups or checks. Host values (Node.host: an embedding lookup, a numpy take of a constant table by input
indices) are computed from each call's inputs after the index guards and copied in like inputs; derived
constants (Node.derived: a matmul weight in column panels) are made once per model, shared by its captures.
A graph whose building read a value that depends on the inputs' data (a Reshape to a shape given as an input,
say) is valid for those data only and is built again on every call.
Index inputs (Gather and the like) are guarded: out of range is an IndexError naming the node, the axis
and the index, checked on the host for indices from graph inputs and initializers, and from the min and
max of computed indices, which the run computes with the outputs.

Graph-level optimizations (load(..., fold=True), the default): BatchNormalization after a Conv is folded
into the Conv's weight and bias at load (fold.py); values computed from initializers and constants only
are computed once when the graph is built, not in every call (OnnxModel._fold_constants). Elementwise
epilogues (bias, activation, residual add) need nothing here: the scheduler fuses them into the conv
and matmul kernels."""
from __future__ import annotations
import operator, os, threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union
import numpy as np
from tilecraft.dtype import DType, dtypes
from tilecraft.ops import BinaryOps, BufferOps, ReduceOps, UnaryOps
from tilecraft.engine.realize import BoundSchedule, run_schedule
from tilecraft.helpers import Context, prod
from tilecraft.onnx.fold import fold_batchnorm
from tilecraft.onnx.registry import Node, check_host, in_range, index_error, lookup, since_of, unsupported
from tilecraft.onnx.types import attr_value, onnx_dtype
from tilecraft.tensor import Tensor

MIN_OPSET, MAX_OPSET = 7, 21
# Newer opsets are accepted op by op: a node runs when its op's schema at the model's opset has the
# same attributes (and defaults), inputs, outputs and text as its newest version <= MAX_OPSET, i.e. the
# newer version only widened the types (ONNX 1.17+ added bfloat16, float4, int2 ... to many ops). The
# pools' newer text only spells out the ceil_mode rule implemented here (a window starting in the right
# pad is dropped).
NEWEST_OPSET = 28
PREVIEW_OPS = {"FlexAttention"}  # ops of the ai.onnx.preview domain implemented here (ops/attention_v26.py), looked up as default-domain ops
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
  def __init__(self, model: Any, device: Optional[str] = None, fold: bool = True):
    from onnx import numpy_helper
    self.proto = model
    self.device = device
    self.fold = fold
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
    self.input_shapes: dict[str, tuple[Optional[int], ...]] = {}
    for vi in g.input:
      if vi.name in self.consts: continue
      tt = vi.type
      if tt.WhichOneof("value") != "tensor_type": raise NotImplementedError(f"tilecraft.onnx: graph input {vi.name!r} is a {tt.WhichOneof('value')}, not a tensor")
      self.inputs.append((vi.name, onnx_dtype(tt.tensor_type.elem_type, f"graph input {vi.name!r}")))
      if tt.tensor_type.HasField("shape"):  # the declared shape: a fixed size per dim, None for a named (dynamic) one
        self.input_shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.tensor_type.shape.dim)
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
      if n.domain not in ("", "ai.onnx") and not (n.domain == "ai.onnx.preview" and n.op_type in PREVIEW_OPS):
        raise NotImplementedError(f"tilecraft.onnx: {where}: domain {n.domain!r} is not supported")
      fn = lookup(n.op_type, self.opset)
      if fn is not None and self.opset > MAX_OPSET and since_of(n.op_type, self.opset) <= MAX_OPSET and not _same_as_supported(n.op_type, self.opset):
        raise NotImplementedError(f"tilecraft.onnx: {where}: this op changed after opset {MAX_OPSET} (supported: {MIN_OPSET}..{MAX_OPSET})")
      if fn is None: raise NotImplementedError(f"tilecraft.onnx: {where} is not supported")
      if self.opset < MIN_OPSET and not _same_below(n.op_type, self.opset):
        raise NotImplementedError(f"tilecraft.onnx: {where}: opset {self.opset} is below the supported {MIN_OPSET}..{MAX_OPSET} and this op changed since")
      attrs = {a.name: attr_value(a, where) for a in n.attribute}
      self.nodes.append((n, attrs, fn))
    self.bn_folded = 0
    if fold: self.nodes, self.bn_folded = fold_batchnorm(self.nodes, self.consts, {vi.name for vi in g.output}, self.opset)
    self._init_tensors: dict[str, Tensor] = {}
    self._derived_tensors: dict[tuple[str, str], Tensor] = {}  # (value name, kind) -> Node.derived's Tensor
    self._captures: OrderedDict[tuple, _Capture] = OrderedDict()
    self._lock = threading.Lock()  # one run at a time: a capture's buffers are shared by its calls

  def _const_tensor(self, name: str) -> Tensor:
    """The Tensor of a constant (an initializer, a Constant node's value). One of a single element (Clip's bounds, a
    scale, an epsilon) is a CONST in the kernels that use it, not a buffer each loads: its value is in the code, and
    the CPU tile rules see no input (MobileNet-v2's ReLU6 bounds as buffers cost its 1x1 convs their matmul tile)."""
    t = self._init_tensors.get(name)
    if t is None:
      arr = self.consts[name]
      if arr.size == 1 and arr.dtype.kind in "fiub" and arr.dtype.name != "bfloat16":
        t = Tensor(arr.reshape(()).item(), dtype=dtypes.from_np(arr.dtype), device=self.device).reshape(arr.shape)
      else: t = Tensor(arr, device=self.device)
      self._init_tensors[name] = t
    return t

  def run(self, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
    """Run the graph on numpy inputs (by graph input name); outputs as numpy, keyed by graph output name.
    The graph is built once per input signature (names, shapes, dtypes) and its kernels rerun on later
    calls with the same signature (see _Capture)."""
    return self._call(*self._feed(inputs))

  def profile(self, inputs: dict[str, Any], repeat: int = 10) -> list["NodeProfile"]:
    """Where a call's time goes, per graph node, in the order the kernels run: the call is made twice (built, then
    bound), then `repeat` more times with each kernel timed in sequence, as it runs in a call; a kernel's time is
    its median over those. Kernels count under the node whose output they write, with the nodes fused into them
    (attribute_nodes). Only for a graph kept for its signature (not one whose building read input data, or run
    with an overridden initializer: it is built again on every call)."""
    if not isinstance(repeat, int) or repeat < 1: raise ValueError(f"tilecraft.onnx: profile needs repeat >= 1, got {repeat!r}")
    feed, overrides, key = self._feed(inputs)
    for _ in range(2): self._call(feed, overrides, key)
    cap = self._captures.get(key) if key is not None else None
    if cap is None or cap.bound is None:
      raise ValueError("tilecraft.onnx: this graph is built again on every call (its building read input data, or an initializer is "
                       "overridden), so it has no fixed kernels to profile")
    rows = []
    for _ in range(repeat):
      t: list[float] = []
      self._call(feed, overrides, key, t)
      if len(t) != len(cap.schedule): raise RuntimeError("tilecraft.onnx: no per-kernel times (DEBUG >= 2 runs the schedule unbound)")
      rows.append(t)
    med = np.median(np.array(rows), axis=0)
    groups: dict[int, list[int]] = {}
    for i, (j, _) in enumerate(cap.item_nodes): groups.setdefault(j, []).append(i)
    def label(n: Any) -> str: return n.name or f"{n.op_type}->{n.output[0]}"
    out = []
    for j, items in groups.items():
      nd = [self.nodes[f][0] for f in cap.item_nodes[items[0]][1] or (j,)]  # (a node's first item lists the nodes fused into it)
      out.append(NodeProfile(label(nd[-1]), nd[-1].op_type, tuple(label(n) for n in nd), tuple(n.op_type for n in nd),
                             tuple(n.output[0] for n in nd), tuple(cap.bound.names[i] for i in items), float(sum(med[i] for i in items))))
    return out

  def _feed(self, inputs: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], Optional[tuple]]:
    """The checked graph inputs, the overridden initializers and the signature key of a call (None: no capture)."""
    feed: dict[str, np.ndarray] = {}
    for name, dt in self.inputs:
      if name not in inputs: raise ValueError(f"tilecraft.onnx: missing graph input {name!r} (inputs: {[n for n, _ in self.inputs]})")
      feed[name] = _to_numpy_input(inputs[name], dt, name)
      if (want := self.input_shapes.get(name)) is not None and (len(want) != feed[name].ndim or any(w is not None and w != g for w, g in zip(want, feed[name].shape))):
        decl = "(" + ", ".join("?" if w is None else str(w) for w in want) + ("," if len(want) == 1 else "") + ")"
        raise ValueError(f"tilecraft.onnx: input {name!r} has shape {feed[name].shape}, the graph declares {decl} (? : any size)")
    overrides: dict[str, np.ndarray] = {}
    for name in set(inputs) - set(feed):
      if name not in self.consts: raise ValueError(f"tilecraft.onnx: {name!r} is not an input of the graph")
      overrides[name] = np.asarray(inputs[name])
    key = None if overrides else tuple((name, a.shape, a.dtype.str) for name, a in feed.items())
    return feed, overrides, key

  def _call(self, feed: dict[str, np.ndarray], overrides: dict[str, np.ndarray], key: Optional[tuple],
            timings: Optional[list[float]] = None) -> dict[str, np.ndarray]:
    with self._lock:
      if key is not None and (cap := self._captures.get(key)) is not None:
        self._captures.move_to_end(key)
        return cap.run(feed, timings)
      cap, out = self._build(feed, overrides)
      if cap is not None and key is not None:
        self._captures[key] = cap
        while len(self._captures) > MAX_CAPTURES: self._captures.popitem(last=False)
      return out

  def _build(self, feed: dict[str, np.ndarray], overrides: dict[str, np.ndarray]) -> tuple[Optional["_Capture"], dict[str, np.ndarray]]:
    """Build the graph on these inputs node by node, run it, and return its outputs with the capture that
    reruns it for other data of the same signature (None when the graph's structure read input data)."""
    env: dict[str, Any] = {}
    known: dict[str, np.ndarray] = dict(self.consts)
    dyn: set[str] = set()  # values that depend on the graph inputs' data
    folded: set[str] = set()  # Tensor values computed from initializers and constants only (see fold)
    data_dependent = False  # whether building read a dyn value (the graph is then valid for these data only)
    host_guards: list[tuple[Node, str, int, int, Optional[int], bool]] = []  # index (or length) checks on graph inputs, redone per call
    tensor_guards: list[tuple[Node, Tensor, int, int, Optional[int], bool]] = []  # index checks on computed indices: their min and max, computed with the graph
    host_values: list[tuple[Callable[[dict], np.ndarray], Tensor]] = []  # Node.host's values: made from each call's feed
    made_by: dict[int, int] = {}  # id(a node output's base LazyBuffer) -> the index in self.nodes of the first node that output it
    for name, arr in feed.items():
      known[name] = arr
      env[name] = Tensor(arr, device=self.device, dtype=dict(self.inputs)[name])
      dyn.add(name)
    for name, arr in overrides.items():  # overriding an initializer
      known[name] = arr; env[name] = Tensor(arr, device=self.device)  # noqa: E702
      dyn.add(name)
    def value(name: str) -> Any:
      if name == "": return None
      if name in env: return env[name]
      if name in self.consts: return self._const_tensor(name)
      raise ValueError(f"tilecraft.onnx: value {name!r} is used before it is computed")
    def guard(node: Node, i: int, size: int, axis: int, column: Optional[int], lengths: bool = False) -> None:
      nm = node.inputs[i]
      if nm in known:
        a = np.asarray(known[nm])
        check_host(node, a[..., column] if column is not None else a, size, axis, column, lengths)
        if nm in dyn: host_guards.append((node, nm, size, axis, column, lengths))
        return
      t = value(nm)
      if column is not None: t = t[..., column]
      if t.numel() == 0: return
      t = t.cast(dtypes.int64)
      tensor_guards.append((node, t.min(), size, axis, column, lengths))
      tensor_guards.append((node, t.max(), size, axis, column, lengths))
    for node_idx, (n, attrs, fn) in enumerate(self.nodes):
      ins = [value(x) for x in n.input]
      read_dyn = False
      def static(i: int, _ins: list[Any] = ins, _n: Any = n) -> Optional[np.ndarray]:
        nonlocal read_dyn
        nm = _n.input[i]
        if nm in dyn: read_dyn = True
        if nm in known: return known[nm]
        t = _ins[i]
        return None if t is None else t.numpy()
      def const(i: int, _ins: list[Any] = ins, _n: Any = n) -> Optional[np.ndarray]:
        nm = _n.input[i]
        return known.get(nm) if nm not in dyn else None
      def derived(i: int, kind: str, make: Callable[[np.ndarray], np.ndarray], _n: Any = n) -> Tensor:
        name = _n.input[i]
        if name not in self.consts: return Tensor(make(known[name]), device=self.device)  # (a shape's value differs per signature)
        if (t := self._derived_tensors.get((name, kind))) is None: t = self._derived_tensors[(name, kind)] = Tensor(make(known[name]), device=self.device)
        return t
      def host(idxs: Sequence[int], fn: Callable[..., np.ndarray], _n: Any = n) -> Optional[Tensor]:
        names = [_n.input[i] for i in idxs]
        if not all(nm in feed or (nm in known and nm not in dyn) for nm in names): return None
        fixed = {nm: known[nm] for nm in names if nm not in feed}
        def make(f: dict, _names: list = names, _fixed: dict = fixed) -> np.ndarray: return fn(*[f[nm] if nm in f else _fixed[nm] for nm in _names])
        v = make(feed)
        if v.dtype.kind not in "fiub" or v.dtype.name == "bfloat16": return None
        t = Tensor(np.ascontiguousarray(v), device=self.device)
        host_values.append((make, t))
        return t
      node = Node(n.name or n.op_type, n.op_type, self.opset, attrs, list(n.input), list(n.output), static, self.device or "", const, guard,
                  derived, host)
      outs = fn(node, ins)
      if not isinstance(outs, (list, tuple)): outs = [outs]
      data_dependent |= read_dyn
      reads_dyn = any(x in dyn for x in n.input if x)
      for i, oname in enumerate(n.output):
        if oname == "": continue
        if i >= len(outs) or outs[i] is None: raise unsupported(node, f"output {i} ({oname!r}) is not produced")
        o = outs[i]
        if isinstance(o, np.ndarray):  # a value known at build time (Shape, Constant, ...)
          known[oname] = o
          if read_dyn: dyn.add(oname)
          if o.dtype.name == "bfloat16": o = Tensor(o.astype(np.float32), device=self.device, dtype=dtypes.bfloat16)
          else: o = Tensor(o, device=self.device)
        elif reads_dyn: dyn.add(oname)
        elif self.fold and all(x in self.consts or x in known or x in folded for x in n.input if x): folded.add(oname)
        env[oname] = o
        made_by.setdefault(id(o.lazydata.base), node_idx)
    if folded: self._fold_constants(folded, env)
    res = [env[name] if name in env else value(name) for name, _ in self.outputs]
    if self.fold: _fold_weight_computations([t.lazydata for t in res], {id(env[name].lazydata.base) for name in (*feed, *overrides)})
    for (name, dt), i in zip(self.outputs, range(len(res))):
      if dt is not None and res[i].dtype != dt: res[i] = res[i].cast(dt)
    guard_ts = [g[1] for g in tensor_guards]
    # every result a realized base after the run: what the schedule writes (or an input or a constant) is what is read
    ts = [t if (t.lazydata.realized and not t.lazydata.is_view) else t.contiguous() for t in res + guard_ts]
    schedule = Tensor.schedule(*ts) if ts else []
    run_schedule(schedule)
    cap = _Capture([(operator.itemgetter(name), env[name]) for name in feed] + host_values, schedule, ts[:len(res)], host_guards,
                   [(node, t, size, axis, col, ln) for (node, _, size, axis, col, ln), t in zip(tensor_guards, ts[len(res):])],
                   attribute_nodes(schedule, made_by, _consumers([n for n, _, _ in self.nodes])))
    out = cap.read_outputs([name for name, _ in self.outputs])
    return (None if data_dependent or not cap.reusable() else cap), out

  def _fold_constants(self, folded: set[str], env: dict[str, Any]) -> None:
    """Constant folding: the values computed from initializers and constants only that a value depending
    on the inputs reads (or a graph output) are computed now, once, in one schedule of their own, so the
    per-call schedule reads them from memory instead of recomputing them in every call (and, fused into a
    consumer, per element of it). A value that is a view of memory or of a constant (a transpose of a
    weight, a broadcast fill) has nothing to compute and stays as it is."""
    needed = {x for n, _, _ in self.nodes if not all(o in folded for o in n.output if o) for x in n.input if x in folded}
    needed |= {name for name, _ in self.outputs if name in folded}
    todo = []
    for name in sorted(needed):
      b = env[name].lazydata.base
      if b.op is not None and b.op is not BufferOps.CONST: todo.append(env[name])
    if todo:
      with Context(BEAM=0): Tensor.realize(*todo)  # (kernels that run once: see _fold_weight_computations)

_COSTLY = {*ReduceOps, UnaryOps.SQRT, UnaryOps.RECIP, UnaryOps.EXP2, UnaryOps.LOG2, UnaryOps.SIN, BinaryOps.IDIV, BinaryOps.MOD}

def _fold_weight_computations(outs: list[Any], inputs: set[Any]) -> None:
  """Constant folding inside an op: a costly computation (a reduce, a sqrt, a division, exp or log: _COSTLY) from
  weights (initializers, folded values) and constants alone under a value that depends on the graph inputs is
  realized now, once, instead of in every call: the Winograd weight transform a Conv makes of its weights
  (frontend/winograd.py), and a BatchNormalization's per-channel scale gamma / sqrt(var + eps) over an input it
  can't be folded into (DenseNet-121's pre-activations: 62 kernels of a few microseconds each per call, which the
  scheduler realized since a sqrt under a broadcast is not recomputed per element). Cheap ones stay fused into
  the kernels that read them: a realized comparison of weights (a subnormal test) was a bool buffer, which made
  ResNet-50's pooling kernel scalar code. A computation of constants alone (an arange's index math) stays too."""
  dyn: dict[int, bool] = {}   # base id -> depends on an input
  weight: dict[int, bool] = {}  # base id -> reads a weight (a realized buffer that is not an input)
  costly: dict[int, bool] = {}  # base id -> holds a _COSTLY op
  todo: dict[int, Any] = {}
  stack: list[tuple[Any, bool]] = [(lb.base, False) for lb in outs]
  while stack:
    b, done = stack.pop()
    if id(b) in dyn: continue
    if b.op is None or b.op is BufferOps.CONST:
      dyn[id(b)], weight[id(b)], costly[id(b)] = id(b) in inputs, b.op is None and id(b) not in inputs, False
      continue
    srcs = [s.base for s in b.srcs]
    if not done:
      stack.append((b, True))
      stack.extend((s, False) for s in srcs if id(s) not in dyn)
      continue
    dyn[id(b)] = any(dyn[id(s)] for s in srcs)
    weight[id(b)] = any(weight[id(s)] for s in srcs)
    costly[id(b)] = b.op in _COSTLY or any(costly[id(s)] for s in srcs)
    # (a source to fold: a costly computation from weights and constants alone, a weight among them)
    if dyn[id(b)]: todo.update((id(s), s) for s in srcs if not dyn[id(s)] and weight[id(s)] and costly[id(s)])
  if todo:
    # (folding's kernels run once, at load, so they take the hand-coded opts even under BEAM: a search costs up to its
    # budget per kernel and could save microseconds once; `tilecraft tune --model` tunes only the per-call kernels, so
    # with BEAM=2 SqueezeNet's Winograd weight fold was searched at its first load)
    with Context(BEAM=0): Tensor.realize(*[Tensor(b) for b in todo.values()])

MAX_CAPTURES = 4  # input signatures whose built graphs (and intermediate buffers) a model keeps

@dataclass(frozen=True)
class NodeProfile:
  """A graph node's share of a call (OnnxModel.profile): its name (or "Op->its first output" for an unnamed node)
  and op type; the names, op types and first outputs of the nodes computed in its kernels (itself last: a Conv and
  a residual Add under a Relu); its kernels' names ("copy" for a copy) in the order they run, and their summed
  time in seconds."""
  node: str
  op: str
  nodes: tuple[str, ...]
  ops: tuple[str, ...]
  values: tuple[str, ...]
  kernels: tuple[str, ...]
  seconds: float

class _Capture:
  """A graph built for one input signature, after its first run: the input Tensors (realized bases whose
  Buffers take the next call's data), the schedule bound to its launches (engine/realize.py: BoundSchedule;
  its kernels' buffers kept, so a rerun writes the same output buffers), the outputs and the index guards.
  Rerunning it is: check the indices that come from graph inputs on the host, copy the inputs into their
  Buffers (and the host values made of them: Node.host), launch the bound kernels, check the computed indices'
  min and max, copy the outputs out of their Buffers. Nothing is built, scheduled or looked up again: besides
  the launches, a call's work grows with the graph's inputs, outputs and guards, not with its nodes.
  `inputs`: (what makes the Buffer's data from a call's feed, the Tensor), a graph input's own or a host value's."""
  __slots__ = ("inputs", "schedule", "bound", "in_bufs", "outputs", "readers", "host_guards", "tensor_guards", "guard_readers", "names",
               "item_nodes")
  def __init__(self, inputs: list[tuple[Callable[[dict], np.ndarray], Tensor]], schedule: list, outputs: list[Tensor], host_guards: list,
               tensor_guards: list, item_nodes: list[tuple[int, tuple[int, ...]]]):
    self.inputs, self.schedule, self.outputs, self.item_nodes = inputs, schedule, outputs, item_nodes
    self.host_guards, self.tensor_guards = host_guards, tensor_guards
    self.bound: Optional[BoundSchedule] = None  # made at the first rerun (a capture that isn't reusable never reruns)
    self.in_bufs: list[tuple[Callable[[dict], np.ndarray], Any]] = []  # (its data from the feed, its Buffer), with bound
    self.readers = [_reader(t) for t in outputs]
    self.guard_readers = [_reader(t) for _, t, _, _, _, _ in tensor_guards]
  def reusable(self) -> bool:
    """Whether every input is a realized base of its own (a buffer the next call's data can go into)."""
    bufs = [t.lazydata.base.buffer for _, t in self.inputs]
    return all(t.lazydata.realized and not t.lazydata.is_view for _, t in self.inputs) and len({id(b) for b in bufs}) == len(bufs)
  def run(self, feed: dict[str, np.ndarray], timings: Optional[list[float]] = None) -> dict[str, np.ndarray]:
    """One call on `feed` (its signature's); with `timings`, each schedule item's time is appended to it (BoundSchedule.run)."""
    for node, nm, size, axis, col, ln in self.host_guards:
      a = feed[nm]
      check_host(node, a[..., col] if col is not None else a, size, axis, col, ln)
    if self.bound is None:
      self.in_bufs = [(make, t.lazydata.buffer) for make, t in self.inputs]
      read_after = [t.lazydata.base.buffer for t in self.outputs + [t for _, t, _, _, _, _ in self.tensor_guards]]
      self.bound = BoundSchedule(self.schedule, keep=[b for _, b in self.in_bufs] + read_after)  # the rest: memory planned
    for make, buf in self.in_bufs: buf.copyin(np.ascontiguousarray(make(feed)).reshape(-1))
    self.bound.run(timings)
    return self.read_outputs(None)
  def read_outputs(self, names: Optional[list[str]]) -> dict[str, np.ndarray]:
    for (node, _, size, axis, col, ln), read in zip(self.tensor_guards, self.guard_readers):
      v = int(read())
      if not in_range(v, size, ln): raise index_error(node, v, size, axis, col, ln)
    if names is not None: self.names = names
    return {name: read() for name, read in zip(self.names, self.readers)}

def _consumers(nodes: list) -> list[list[int]]:
  """For each node (by index), the later nodes that read one of its outputs."""
  readers: dict[str, list[int]] = {}
  for j, n in enumerate(nodes):
    for x in n.input:
      if x: readers.setdefault(x, []).append(j)
  return [sorted({r for o in n.output if o for r in readers.get(o, ()) if r > j}) for j, n in enumerate(nodes)]

def attribute_nodes(schedule: list, made_by: dict[int, int], consumers: list[list[int]]) -> list[tuple[int, tuple[int, ...]]]:
  """Per schedule item, (the graph node it is counted under, the nodes first counted with it), node indices
  (`consumers`: each node's readers, _consumers). An item counts under the node whose output it writes (the
  earliest, for several). A node whose output no item writes was fused into a kernel that computes a reader of
  it: it goes with its first reader's node, followed until a written one (a Conv and a residual Add under the
  Relu whose output the kernel writes; a branch's conv under the Concat it is written into), or, with no reader,
  the first written node after it; it is listed with the first item of that node. An item that writes no node's
  output (a Winograd conv's transforms, a reduce realized for the kernels that read it, one slice of a
  concatenation written in place) counts under the node of the first later item that reads or writes a buffer it
  writes (else the previous item's, or the next one's)."""
  own = [min((made_by[id(lb)] for lb in si.outputs if id(lb) in made_by), default=None) for si in schedule]
  for i in range(len(own) - 1, -1, -1):  # (latest first: a reader's node is known before its writers')
    if own[i] is not None: continue
    si = schedule[i]
    writes = {id(b) for b in si.bufs[:len(si.bufs) - len(si.inputs)]}
    own[i] = next((own[j] for j in range(i + 1, len(schedule)) if any(id(b) in writes for b in schedule[j].bufs)), None)
  for i in range(1, len(own)):
    if own[i] is None: own[i] = own[i - 1]
  for i in range(len(own) - 2, -1, -1):
    if own[i] is None: own[i] = own[i + 1]
  written = sorted({j for j in own if j is not None})
  if not written: return [(0, ())] * len(schedule)
  fused: dict[int, list[int]] = {j: [] for j in written}
  home: list[int] = [0] * len(consumers)
  for j in range(len(consumers) - 1, -1, -1):  # (readers come later: their homes are known)
    if j in fused: home[j] = j
    elif consumers[j]: home[j] = home[consumers[j][0]]
    else: home[j] = next((w for w in written if w > j), written[-1])
  for j, h in enumerate(home): fused[h].append(j)
  out, listed = [], set()
  for j in own:
    assert j is not None
    out.append((j, () if j in listed else tuple(fused[j])))
    listed.add(j)
  return out

def _reader(t: Tensor) -> Any:
  """What reads Tensor t as numpy (graph outputs in bfloat16 as ml_dtypes' bfloat16 where it is installed):
  for a realized base (what the build leaves in a capture), or a contiguous view of one (an Identity or Reshape
  output: the base's first elements, in order), a copy straight out of its Buffer, as Tensor.numpy makes it; for
  anything else, Tensor.numpy. (SqueezeNet's softmax output is such a view: its read after a call took 0.2 ms
  through Tensor.numpy, 0.12 ms now.)"""
  lb, shape = t.lazydata, t.shape
  if not (lb.realized and (not lb.is_view or (lb.st.contiguous and lb.dtype == lb.base.dtype)) and all(isinstance(s, int) for s in shape)
          and 0 not in shape and lb.base.buffer is not None):
    return lambda: _out_numpy(t)
  buf, n, bf16 = lb.base.buffer, prod(shape), t.dtype == dtypes.bfloat16
  def read() -> np.ndarray:
    a = buf.numpy()[:n].reshape(shape)
    return _as_bfloat16(a) if bf16 else a
  return read

def _as_bfloat16(a: np.ndarray) -> np.ndarray:
  try:
    import ml_dtypes
    return a.astype(ml_dtypes.bfloat16)
  except ImportError: return a

def _out_numpy(t: Tensor) -> np.ndarray:
  a = t.numpy()
  return _as_bfloat16(a) if t.dtype == dtypes.bfloat16 else a

def load(model: Union[str, bytes, os.PathLike, Any], device: Optional[str] = None, fold: bool = True) -> OnnxModel:
  """Load an ONNX model (path, bytes or onnx.ModelProto) for running on `device` (default: the default device).
  `fold=False` turns off the graph rewrites (BatchNorm folded into Conv, constant folding)."""
  import tilecraft.onnx.ops  # noqa: F401  (registers the op implementations)
  return OnnxModel(_as_model(model), device, fold)
