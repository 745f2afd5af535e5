"""The scheduler: turns the lazy graph into a list of kernels (ScheduleItems, API).

Fusion rules:
- elementwise ops fuse into whatever reads them (and are recomputed in each reader while cheap; a costly
  value that only one kernel reads, at its own elements, is computed once there however often it is read);
- a reduce fuses with the elementwise ops that feed it, and with the elementwise ops that consume
  its result at the same number of elements (through reshapes only);
- movement ops fold into the views of each kernel's loads;
- on targets without workgroups, a realized reduced value read (broadcast over its axes) under a
  reduce like its own is computed by that reduce's kernel too, and stored as an extra output
  (dependent reduces: softmax's max and sum(exp(x - max)) are one kernel; see _fused_value).
A value is realized (gets a buffer and its own kernel) when it is requested, read through an
expanding view (the same element used many times), padded through an op with f(0) != 0, a reduce
read by more than one kernel or by another reduce, or forced with contiguous(). Where more than one
kernel reads a reduce only through one elementwise epilogue of it (a conv's activation), the epilogue
is realized in the reduce's place: the same bytes, and the epilogue computed once.

In three steps, each over the graph once: _decide_realizes picks the values the rules above realize;
_realize_reduces walks every kernel as it will be built and realizes each reduce its kernel can't
compute (another kind of reduce in the kernel, a reduce of a reduce, a reduce read through a view that
isn't a reshape), reaching the fixed point of "build, find such a reduce, realize it" in one pass;
_build_schedule builds each kernel's AST once (a kernel that takes on a dependent reduce it then
can't use is built again without it: _build_kernel). Nothing restarts through exceptions.
"""
from __future__ import annotations
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Optional
from tilecraft.device import Buffer, Device
from tilecraft.helpers import getenv, prod
from tilecraft.ops import (UNSAFE_PAD_OPS, BinaryOps, BufferOps, ConstBuffer, LazyOp, MemBuffer, MetaOps, ReduceOps, TernaryOps,
                           UnaryOps, _const_key, verify_ast)
from tilecraft.engine.lazy import LazyBuffer
from tilecraft.engine.concat_in_place import write_concats_in_place
from tilecraft.engine.plan_cache import GraphKey, Template, counts, remember_walk, replayed_walk, templates, verified
from tilecraft.shape.shapetracker import ShapeTracker
from tilecraft.shape.symbolic import Node, Variable, sym_eval, unbind_all
from tilecraft.dtype import dtypes

ELEMENTWISE = (UnaryOps, BinaryOps, TernaryOps)

@dataclass
class ScheduleItem:
  """One kernel (or copy) to run (API): `ast` and its buffers, outputs first."""
  ast: LazyOp
  bufs: tuple[Buffer, ...]
  var_vals: dict[Variable, int] = field(default_factory=dict)
  outputs: tuple[LazyBuffer, ...] = ()
  @property
  def inputs(self) -> tuple[Buffer, ...]: return self.bufs[len(self.ast.src):] if self.ast.op is MetaOps.KERNEL else self.bufs[1:]

def _walk(outs: list[LazyBuffer]) -> tuple[list[LazyBuffer], list[LazyBuffer], Optional[GraphKey]]:
  """Every unrealized base reachable from outs, sources before users; the realized bases they read
  (the leaves, in the order first reached); and the graph's structure key for the schedule cache
  (None when it isn't cacheable; see "the schedule cache" below)."""
  order: list[LazyBuffer] = []
  leaves: list[LazyBuffer] = []
  # base -> its index in order (>= 0) or ~its index in leaves; None: not done yet. (LazyBuffers hash
  # and compare by identity: the buffers themselves are the keys, no id() calls.)
  pos: dict[LazyBuffer, Optional[int]] = {}
  parts: list[tuple] = []
  cacheable = True
  stack: list[tuple[LazyBuffer, bool]] = [(o.base, False) for o in reversed(outs)]
  pop, push = stack.pop, stack.append
  while stack:  # (this runs on every realize: plain loops, no properties)
    b, done = pop()
    if done:
      pos[b] = len(order)
      order.append(b)
      if cacheable:
        op = b.op
        if op not in _CACHEABLE or not b.st.concrete or (op is BufferOps.CONST and isinstance(b.arg, Node)): cacheable = False
        else:
          srcs = []
          for s in b.srcs:
            if (sb := s._base) is None: srcs.append((pos[s], None))
            elif s.st.concrete: srcs.append((pos[sb], s.st))
            else:
              cacheable = False
              break
          else: parts.append((op, _const_key(b.arg) if op is BufferOps.CONST else b.arg, b.dtype, b.device, b.st, b.forced_realize, tuple(srcs), b.image))
      continue
    if b in pos: continue
    if b.op is None:
      pos[b] = ~len(leaves)
      leaves.append(b)
      if b.buffer is None or not b.st.concrete: cacheable = False
      else: parts.append((None, b.dtype, b.device, b.st, b.buffer.dtype))
      continue
    pos[b] = None
    push((b, True))
    for s in b.srcs: push((s._base or s, False))
  if not cacheable: return order, leaves, None
  return order, leaves, GraphKey(tuple(parts), tuple([pos[o.base] for o in outs]), fuse_reduces())

def _subtree_ops(b: LazyBuffer, realizes: set[int], memo: dict[int, int]) -> int:
  """How many elementwise ops computing b would inline (stops at realized values). Iterative: a
  chain of elementwise ops may be any length."""
  if (n := memo.get(id(b))) is not None: return n
  def inlined(x: LazyBuffer) -> list[LazyBuffer]:
    return [s.base for s in x.srcs if s.base.op in ELEMENTWISE_OPS and id(s.base) not in realizes]
  stack: list[tuple[LazyBuffer, bool]] = [(b, False)]
  while stack:
    x, done = stack.pop()
    if done:
      memo[id(x)] = 1 + sum(memo[id(s)] for s in inlined(x))
      continue
    if id(x) in memo: continue
    stack.append((x, True))
    stack.extend((s, False) for s in inlined(x) if id(s) not in memo)
  return memo[id(b)]

ELEMENTWISE_OPS = set(UnaryOps) | set(BinaryOps) | set(TernaryOps) | {MetaOps.CONTIGUOUS}

def _has_unsafe_pad(b: LazyBuffer, realizes: set[int]) -> bool:
  stack, seen = [b], set()
  while stack:
    x = stack.pop()
    if id(x) in seen or x.op is None or id(x) in realizes and x is not b: continue
    seen.add(id(x))
    if x.op in UNSAFE_PAD_OPS or (x.op is UnaryOps.NEG and x.dtype == dtypes.bool) or x.op in ReduceOps and x is not b: return True
    if x.op is BinaryOps.CMPNE or x.op is BinaryOps.CMPLT: pass
    stack.extend(s.base for s in x.srcs)
  return False

def _decide_realizes(order: list[LazyBuffer], outs: list[LazyBuffer]) -> set[int]:
  realizes = {id(o.base) for o in outs if o.base.op is not None}
  for b in order:
    if b.forced_realize or b.op in (MetaOps.COPY, MetaOps.EMPTY, MetaOps.ASSIGN): realizes.add(id(b))
  # sources read through expanding views, or padded through ops that aren't zero at zero
  users: dict[int, int] = {}
  for b in order:
    for s in b.srcs:
      sb = s.base
      if sb.op is None or sb.op is BufferOps.CONST: continue
      users[id(sb)] = users.get(id(sb), 0) + 1
      if s.is_view and _is_expanding(s): realizes.add(id(sb))
      if s.is_view and any(v.mask is not None for v in s.st.views) and _has_unsafe_pad(sb, realizes): realizes.add(id(sb))
      if b.op is MetaOps.COPY: realizes.add(id(sb))
  consumers: dict[int, list[LazyBuffer]] = {}
  for b in order:
    for s in b.srcs: consumers.setdefault(id(s.base), []).append(b)
  # a reduce's elementwise epilogue that more than one kernel reads is stored instead of the reduce, which then fuses
  # into the epilogue's kernel: as many bytes, and the epilogue computed once, not in every reader (a depthwise conv's
  # SiLU, read by a squeeze-and-excitation's pool and by its gating multiply)
  # (readers first: the whole epilogue is stored, not the part of it its last step reads twice, as relu's x in x < 0 ? 0 : x)
  if REALIZE_EPILOGUES:
    for b in reversed(order):
      if b.op in ELEMENTWISE_OPS and id(b) not in realizes and users.get(id(b), 0) > 1 and \
          _reduce_epilogue(b, consumers, realizes) is not None and not _computed_once(b, consumers, realizes): realizes.add(id(b))
  for b in order:
    if b.op in ReduceOps and id(b) not in realizes and users.get(id(b), 0) > 1 and len(_kernels_reading(b, consumers, realizes)[0]) != 1:
      realizes.add(id(b))
  # elementwise values read many times are recomputed only while that stays cheap
  memo: dict[int, int] = {}
  # (read by one kernel only, and only at its own elements all the way to it, a value is computed once in that kernel
  # however many times it is read: an erf GELU's pieces in its matmul's epilogue)
  for b in order:
    if b.op in ELEMENTWISE_OPS and users.get(id(b), 0) > 1 and _subtree_ops(b, realizes, memo) * users[id(b)] > 48 and \
        not _computed_once(b, consumers, realizes): realizes.add(id(b))
  # no kernel computes an expression deeper than MAX_KERNEL_DEPTH ops: a longer chain (a loop of
  # `x = x + 1`) is cut into kernels, each reading the value the one before stored
  depth: dict[int, int] = {}
  for b in order:
    d = 1 + max([depth.get(id(s.base), 0) for s in b.srcs if id(s.base) not in realizes], default=0)
    if d > MAX_KERNEL_DEPTH and (b.op in ELEMENTWISE_OPS or b.op in ReduceOps):
      realizes.add(id(b))
      d = 0
    depth[id(b)] = d
  # a reduce read through elementwise values that the rules above realized since (GELU's erf pieces over a matmul's
  # output) would be computed again by each of the kernels that now read it: it is realized itself, once
  for b in order:
    if b.op in ReduceOps and id(b) not in realizes and len(_kernels_reading(b, consumers, realizes)[0]) > 1: realizes.add(id(b))
  return realizes

MAX_KERNEL_DEPTH = 256  # ops on the longest path from a kernel's store to its loads (see _decide_realizes)

REALIZE_EPILOGUES = True  # _decide_realizes' epilogue rule (a switch for A/B measurements)

def _reduce_epilogue(b: LazyBuffer, consumers: dict[int, list[LazyBuffer]], realizes: set[int]) -> Optional[LazyBuffer]:
  """The reduce r that elementwise b is an epilogue of, or None: b's inlined values (elementwise, not realized) read
  exactly one unrealized reduce, every read between them is a reshape (b has r's elements), nothing outside them reads
  r or any of them (so storing b replaces storing r), and b's elements are no wider than r's."""
  inner, found, stack = {id(b)}, None, [b]
  while stack:
    x = stack.pop()
    for s in x.srcs:
      sb = s.base
      if sb.op is None or sb.op is BufferOps.CONST or id(sb) in realizes: continue
      if s.is_view and not _is_reshape(s.st, sb.shape): return None
      if sb.op in ReduceOps:
        if found is not None and found is not sb: return None
        found = sb
      elif sb.op in ELEMENTWISE_OPS:
        if id(sb) not in inner: inner.add(id(sb)); stack.append(sb)
      else: return None
  if found is None or b.dtype.itemsize > found.dtype.itemsize: return None
  if any(id(c) not in inner for x in (id(found), *inner) if x != id(b) for c in consumers.get(x, [])): return None
  return found

def _kernels_reading(r: LazyBuffer, consumers: dict[int, list[LazyBuffer]], realizes: set[int]) -> tuple[set[int], bool]:
  """The kernels (their realized outputs) that would compute r inline: follow r's readers through
  elementwise ops that aren't realized themselves. Another reduce on the way counts as its own kernel. And whether
  any read on the way (of r or of such an inlined value) is through a view."""
  out: set[int] = set()
  viewed = False
  stack, seen = [(r, c) for c in consumers.get(id(r), [])], set()
  while stack:
    x, c = stack.pop()
    viewed = viewed or any(s.base is x and s.is_view for s in c.srcs)
    if id(c) in seen: continue
    seen.add(id(c))
    if id(c) in realizes or c.op not in ELEMENTWISE_OPS: out.add(id(c))
    if id(c) not in realizes and c.op in ELEMENTWISE_OPS:
      stack.extend((c, d) for d in consumers.get(id(c), []))
      if not consumers.get(id(c)): out.add(id(c))
  return out, viewed

def _computed_once(b: LazyBuffer, consumers: dict[int, list[LazyBuffer]], realizes: set[int]) -> bool:
  """Whether one kernel computes b and every element of it once, inline: its readers, through the elementwise values
  inlined with it, end in a single kernel, and every read on the way is of the value itself, not a view (two views,
  x[:-1] + x[1:], would compute each element twice)."""
  kernels, viewed = _kernels_reading(b, consumers, realizes)
  return len(kernels) == 1 and not viewed

def _is_expanding(v: LazyBuffer) -> bool:
  """Does this view read some element of its base more than once?"""
  size, base_size = v.st.size, v.base.st.size
  if isinstance(size, Node) or isinstance(base_size, Node):
    return any(st == 0 and s != 1 for st, s in zip(v.st.real_strides(ignore_valid=True), v.st.shape))
  if size > base_size: return True
  return any(st == 0 and s != 1 for st, s in zip(v.st.real_strides(ignore_valid=True), v.st.shape))

# Dependent reduces (a reduce reading another reduce's result broadcast over the same axes, e.g.
# softmax's sum(exp(x - max(x)))) fuse into one kernel that stores both values: the row is read from
# memory once and the second loop re-reads it from cache. Only on targets whose reduces are serial
# loops (no workgroups: CPU, LLVM), where nothing is lost; on GPUs the separate kernels can group
# their reduces, which a kernel with dependent reduces can't. And only for rows that fit in cache.
FUSE_REDUCE_MAX = 1 << 15  # elements per reduced output
def fuse_reduces() -> bool:
  """`FUSE_REDUCES` (default 1; 0: every dependent reduce in a kernel of its own), read per schedule.
  Schedule templates and remembered walks are keyed by it (engine/plan_cache.py: GraphKey)."""
  return bool(int(getenv("FUSE_REDUCES", 1)))

def _same_reduce(a: LazyBuffer, b: LazyBuffer) -> bool:
  """Can one kernel compute both reduces: the same axes of sources of one shape (the ops may differ:
  a kernel computes a sum and a max of one row side by side)?"""
  return a.shape == b.shape and a.arg == b.arg and a.srcs[0].shape == b.srcs[0].shape

def _reduce_conflict(x: LazyBuffer, st: ShapeTracker, under_reduce: bool, kernel_reduce: Optional[LazyBuffer]) -> bool:
  """A kernel can't compute reduce x where it reads it: under its own reduce (a reduce of a reduce),
  through a view that isn't a reshape, or next to a different reduce. x then gets a kernel of its own."""
  return under_reduce or not _is_reshape(st, x.shape) or (kernel_reduce is not None and not _same_reduce(kernel_reduce, x))

def _kernel_walk(root: LazyBuffer, realizes: set[int]) -> Iterator[LazyBuffer]:
  """Walk root's kernel in the order _KernelBuilder.build visits it (sources left to right; a reduce's
  source as soon as the reduce is reached) and yield each reduce it can't compute (_reduce_conflict).
  The caller realizes it (and settles its kernel) before resuming; when that realized a reduce this
  walk computed inline already, the walk starts over, so what it decides is what a build with the
  new realize set decides."""
  while True:
    seen: set[tuple] = set()
    inlined: set[int] = set()  # the reduces this kernel computes so far
    kernel_reduce: Optional[LazyBuffer] = None
    stack: list[tuple[LazyBuffer, ShapeTracker, bool]] = [(root, ShapeTracker.from_shape(root.shape), False)]
    while stack:
      x, st, under = stack.pop()
      if (key := (id(x), st, under)) in seen: continue
      seen.add(key)
      if x.op is None or x.op is BufferOps.CONST or (x is not root and id(x) in realizes): continue  # a load or a constant
      if x.op in ReduceOps:
        if _reduce_conflict(x, st, under, kernel_reduce):
          yield x
          if not inlined.isdisjoint(realizes): break  # something computed above is a load now: walk again
          continue
        kernel_reduce = x
        inlined.add(id(x))
        s = x.srcs[0]
        stack.append((s.base, s.st if s.is_view else ShapeTracker.from_shape(s.shape), True))
      elif x.op in ELEMENTWISE_OPS:
        stack.extend((s.base, s.st + st if s.is_view else st, under) for s in reversed(x.srcs))
    else: return

def _realize_reduces(order: list[LazyBuffer], realizes: set[int]) -> None:
  """Add to realizes every reduce the kernels can't compute inline (_reduce_conflict): the fixed point
  of building all kernels and realizing each conflict found, reached in one pass. Kernels are walked
  in the order they are built; a reduce realized while walking one gets its own kernel, walked at once
  (it comes earlier in the order: building from the start again would reach it first). Kernels walked
  before don't change their decisions: a realized reduce only cuts their walk, and what they computed
  besides it was of one kind already. Only reduces are added: which elementwise values are realized
  is decided before (_decide_realizes)."""
  for b in order:
    if id(b) not in realizes or b.op is None or b.op is MetaOps.COPY: continue
    walks = [_kernel_walk(b, realizes)]
    while walks:
      if (x := next(walks[-1], None)) is None:
        walks.pop()
        continue
      realizes.add(id(x))
      walks.append(_kernel_walk(x, realizes))

class _KernelBuilder:
  """Builds one kernel's AST, for a realize set _realize_reduces settled. A build that can't use a
  dependent-reduce fusion it tried stops and says why in `conflict`, and the caller builds the kernel
  again without it (_build_kernel)."""
  def __init__(self, out: LazyBuffer, realizes: set[int], fusable: set[int], prefused: frozenset = frozenset()):
    self.out, self.realizes = out, realizes
    self.inputs: dict[int, tuple[int, LazyBuffer]] = {}
    self.var_vals: dict[Variable, int] = {}
    self.reduce: Optional[LazyBuffer] = None
    self.memo: dict[tuple, LazyOp] = {}
    # realized reduced values this kernel may compute itself (see FUSE_REDUCE_MAX), those it does
    # (the kernel's extra outputs, in order) with their values, and the realized values it loads
    self.fusable, self.prefused = fusable, prefused
    self.fused: dict[int, tuple[LazyBuffer, LazyOp]] = {}
    self.loaded: set[int] = set()
    self.building: list[LazyBuffer] = []  # the fused values being built, innermost last
    # why the build stopped: ("refuse", b): b was loaded before the kernel took it on, build again
    # computing it from the start; ("nofuse", b): b can't be fused here, build again loading it
    self.conflict: Optional[tuple[str, LazyBuffer]] = None

  def _unbind(self, st: ShapeTracker) -> ShapeTracker:
    st, vals = st.unbind()
    self.var_vals.update(vals)
    return st

  def build(self, b: LazyBuffer, st: ShapeTracker, under_reduce: bool) -> Optional[LazyOp]:
    """The AST computing base b, viewed through st (b's shape -> the kernel's space), or None when the
    build stopped (self.conflict). Elementwise ops are walked with an explicit stack (sources left to
    right, as buffers are numbered in the order they are first loaded): an expression may be any
    depth. A reduce builds its source by calling build again, which nests once (a reduce under a
    reduce is another kernel)."""
    memo = self.memo
    if (hit := memo.get((id(b), st, under_reduce))) is not None: return hit
    # entries: (base, its view, None) to visit; (base, its view, its sources' (base, view) pairs) to assemble
    stack: list[tuple[LazyBuffer, ShapeTracker, Optional[list]]] = [(b, st, None)]
    while stack:
      x, xst, srcs = stack.pop()
      key = (id(x), xst, under_reduce)
      if srcs is not None:
        ops = tuple(memo[(id(sb), sst, under_reduce)] for sb, sst in srcs)
        memo[key] = ops[0] if x.op is MetaOps.CONTIGUOUS else LazyOp(x.op, ops, x.arg)
        continue
      if key in memo: continue
      ret = self._node(x, xst, under_reduce)
      if self.conflict is not None: return None
      if ret is not None:
        memo[key] = ret
        continue
      srcs = [(s.base, s.st + xst if s.is_view else xst) for s in x.srcs]
      stack.append((x, xst, srcs))
      stack.extend((sb, sst, None) for sb, sst in reversed(srcs))
    return memo[(id(b), st, under_reduce)]

  def _is_load(self, b: LazyBuffer) -> bool:
    return b.op is None or (id(b) in self.realizes and b is not self.out and b not in self.building)

  def _node(self, b: LazyBuffer, st: ShapeTracker, under_reduce: bool) -> Optional[LazyOp]:
    """The AST of base b viewed through st when it is a leaf of this kernel (a load, a constant, a
    fused value) or its reduce; None for an elementwise op whose sources build() walks (or when the
    build stopped: self.conflict)."""
    if b.op is not None and self._is_load(b) and (id(b) in self.fused or id(b) in self.prefused or (under_reduce and id(b) in self.fusable)):
      ret = self._fused_value(b, st, under_reduce)
      if ret is not None or self.conflict is not None: return ret
    if self._is_load(b):
      if id(b) in self.fused or id(b) in self.prefused:  # read here in a way the fused value can't give
        self.conflict = ("nofuse", b)
        return None
      self.loaded.add(id(b))
      idx, _ = self.inputs.setdefault(id(b), (len(self.inputs) + 1, b))
      return LazyOp(BufferOps.LOAD, (), MemBuffer(idx, _buf_dtype(b), self._unbind(st)))
    if b.op is BufferOps.CONST:
      val = b.arg
      if isinstance(val, Variable) and val.is_bound:
        u, v = val.unbind()
        self.var_vals[u] = v  # type: ignore[index]
        val = u
      return LazyOp(BufferOps.CONST, (), ConstBuffer(val, b.dtype, self._unbind(st)))
    if b.op in ELEMENTWISE_OPS: return None
    if b.op in ReduceOps:
      if _reduce_conflict(b, st, under_reduce, self.reduce):
        # _realize_reduces settled every conflict a plain build meets; one inside a fused value's
        # build (its reduce seen through another view) means that value isn't fused here
        if not self.building: raise RuntimeError(f"scheduler: reduce {b} was left unrealized where its kernel can't compute it")
        self.conflict = ("nofuse", self.building[-1])
        return None
      self.reduce = b
      s = b.srcs[0]
      inp = self.build(s.base, s.st if s.is_view else ShapeTracker.from_shape(s.shape), True)
      return None if inp is None else LazyOp(b.op, (inp,), b.arg)
    raise RuntimeError(f"scheduler can't fuse {b.op}")

  def _fused_value(self, b: LazyBuffer, st: ShapeTracker, under_reduce: bool) -> Optional[LazyOp]:
    """The value of realized b computed in this kernel (a dependent reduce), or None to load it. Under
    this kernel's reduce, b must be a value of a reduce like it, broadcast over its axes; after the
    reduce, read element for element."""
    red = self.reduce
    if red is None or (r := _only_reduce(b, self.realizes)) is None or not _same_reduce(r, red): return None
    if prod(b.shape) != prod(red.shape): return None
    want = ShapeTracker.from_shape(b.shape).reshape(red.shape)
    if under_reduce: want = want.expand(red.srcs[0].shape)
    elif not _is_reshape(st, b.shape): return None
    if under_reduce and not (len(st.views) == 1 and st.views == want.views): return None
    if id(b) not in self.fused:
      if id(b) in self.loaded:  # read before as an input: build again, computing it from the start
        self.conflict = ("refuse", b)
        return None
      self.building.append(b)
      val = self.build(b, ShapeTracker.from_shape(b.shape).reshape(red.shape), False)
      self.building.pop()
      self.reduce = red
      if val is None: return None
      self.fused[id(b)] = (b, val)
    return self.fused[id(b)][1]


def _only_reduce(b: LazyBuffer, realizes: set[int]) -> Optional[LazyBuffer]:
  """The one reduce b's kernel would compute (b itself, or the reduce under b's elementwise ops), or None."""
  found: list[LazyBuffer] = []
  stack, seen = [b], set()
  while stack:
    x = stack.pop()
    if id(x) in seen or x.op is None or (id(x) in realizes and x is not b): continue
    seen.add(id(x))
    if x.op in ReduceOps: found.append(x); continue
    if x.op not in ELEMENTWISE_OPS and x.op is not BufferOps.CONST: return None
    stack.extend(s.base for s in x.srcs)
  return found[0] if len(found) == 1 else None

def _is_reshape(st: ShapeTracker, shape: tuple) -> bool:
  """st reads its base (of `shape`) element for element in order: a pure reshape."""
  return len(st.views) == 1 and st.views[0].contiguous and st.size == prod(shape)

def _rebuild(root: LazyOp, leaf: Any, memo: dict) -> LazyOp:
  """root with each node x for which leaf(x) is not None replaced by that (its sources not visited),
  and every node above rebuilt on the new sources. Iterative: an AST may be any depth."""
  stack: list[tuple[LazyOp, bool]] = [(root, False)]
  while stack:
    x, done = stack.pop()
    if done:
      srcs = tuple(memo[s] for s in x.src)
      memo[x] = x if all(a is b for a, b in zip(srcs, x.src)) else LazyOp(x.op, srcs, x.arg)
      continue
    if x in memo: continue
    if (r := leaf(x)) is not None:
      memo[x] = r
      continue
    stack.append((x, True))
    stack.extend((s, False) for s in reversed(x.src) if s not in memo)
  return memo[root]

def _reshape_leaves(op: LazyOp, shape: tuple, memo: dict) -> LazyOp:
  """Re-express the post-reduce part of a kernel in the reduce's output shape."""
  def leaf(x: LazyOp) -> Optional[LazyOp]:
    if x.op in ReduceOps: return x
    if x.op is BufferOps.LOAD or x.op is BufferOps.CONST: return LazyOp(x.op, (), replace(x.arg, st=x.arg.st.reshape(shape)))
    return None
  return _rebuild(op, leaf, memo)

def _buffer_for(lb: LazyBuffer, var_vals: dict) -> Buffer:
  b = lb.base
  if b.buffer is None:
    size = prod(b.shape)
    if isinstance(size, Node): size = sym_eval(unbind_all(size)[0], {**_bound_vals(size), **var_vals})
    b.buffer = Buffer(b.device, int(size), _buf_dtype(b))
  return b.buffer

def _buf_dtype(b: LazyBuffer) -> Any:
  """What base b's buffer holds: its image dtype (LazyBuffer.to_image), or its dtype."""
  if b.buffer is not None: return b.buffer.dtype
  return b.image if b.image is not None else b.dtype

def _bound_vals(x: Any) -> dict:
  return unbind_all(x)[1] if isinstance(x, Node) else {}

def create_schedule(outs: list[LazyBuffer]) -> list[ScheduleItem]:
  """The kernels that compute `outs`, in an order that respects their dependencies."""
  outs = [o for o in outs if not o.base.realized]
  if not outs: return []
  rp = outs[0].base.replayed if len(outs) == 1 else None
  if rp is not None and (hit := replayed_walk(outs[0].base, fuse_reduces())) is not None:
    counts.walk_hits += 1
    return instantiate(*hit)
  order, leaves, key = _walk(outs)
  if key is not None:
    try: t = templates.get(key)
    except TypeError: key = t = None  # an op argument that can't be part of a key
    if t is not None:
      counts.graph_hits += 1
      if rp is not None: remember_walk(rp, outs[0].base, order, leaves, t)
      return instantiate(t, order, leaves)
    if key is not None: counts.graph_misses += 1
  realizes = _decide_realizes(order, outs)
  _realize_reduces(order, realizes)
  items = write_concats_in_place(_build_schedule(order, realizes), outs)
  if key is not None and (t := _template_of(items, order, leaves)) is not None:
    templates.put(key, t)
    if rp is not None: remember_walk(rp, outs[0].base, order, leaves, t)
  return items

# ---- the schedule cache (engine/plan_cache.py: templates) -------------------------------------------
# A repeated graph's schedule is the same up to the buffers it reads and writes. _walk keys a graph by
# its structure (GraphKey): every op, argument, dtype, device, view and forced realize, sources as
# positions in the walk's order (so shared subgraphs are part of the key) and realized inputs as
# positions among the leaves. A Template remembers, per schedule item, its AST (the very object: runner
# caches find it by identity) and the positions its buffers come from. Not cached: graphs with symbolic
# shapes or Variables (bound values compare equal), and scheduler-level ops other than CONTIGUOUS (copies, ...).
_CACHEABLE = ELEMENTWISE_OPS | set(ReduceOps) | {BufferOps.CONST}

def _template_of(items: list[ScheduleItem], order: list[LazyBuffer], leaves: list[LazyBuffer]) -> Optional[Template]:
  """The template of a schedule just built for (order, leaves), or None if it can't be one."""
  where: dict[int, int] = {}
  for pos, lb in [(i, b) for i, b in enumerate(order)] + [(~j, b) for j, b in enumerate(leaves)]:
    if lb.buffer is not None:
      if id(lb.buffer) in where: return None  # two values in one buffer: not a structure this can describe
      where[id(lb.buffer)] = pos
  node_pos = {id(b): i for i, b in enumerate(order)}
  out = []
  for si in items:
    if si.var_vals or (not si.outputs and si.ast.op is not MetaOps.KERNEL) or any(id(o) not in node_pos for o in si.outputs) or any(id(b) not in where for b in si.bufs): return None
    out.append((si.ast, tuple(where[id(b)] for b in si.bufs), tuple(node_pos[id(o)] for o in si.outputs)))
  return Template(tuple(out), fuse_reduces())

def instantiate(t: Template, order: list[LazyBuffer], leaves: list[LazyBuffer]) -> list[ScheduleItem]:
  """Template t's schedule for the graph walked as (order, leaves)."""
  return [ScheduleItem(ast, tuple(_buffer_for(order[p], {}) if p >= 0 else leaves[~p].buffer for p in pos), {}, tuple(order[o] for o in outs))
          for ast, pos, outs in t.items]

def _verify_once(ast: LazyOp) -> None:
  """verify_ast, once per kernel (a user's loop schedules the same ones every call)."""
  if ast in verified: return
  verify_ast(ast)
  verified.put(ast, None)

def _fusable(order: list[LazyBuffer], realizes: set[int]) -> set[int]:
  """Realized reduced values a later kernel with a reduce like theirs may compute itself (see FUSE_REDUCE_MAX)."""
  out: set[int] = set()
  if not fuse_reduces(): return out
  local: dict[str, bool] = {}
  for b in order:
    if id(b) not in realizes or b.image is not None or b.op not in ELEMENTWISE_OPS and b.op not in ReduceOps: continue
    if (r := _only_reduce(b, realizes)) is None or not all(isinstance(x, int) for x in r.srcs[0].shape): continue
    if prod(r.srcs[0].shape) > FUSE_REDUCE_MAX * prod(r.shape): continue
    if b.device not in local: local[b.device] = Device[b.device].renderer.has_local
    if not local[b.device]: out.add(id(b))
  return out

def _build_schedule(order: list[LazyBuffer], realizes: set[int]) -> list[ScheduleItem]:
  """The schedule items for a settled realize set (_realize_reduces), in order: each kernel is built once
  its sources' are, and a kernel that computes dependent reduced values (_fused_value) replaces theirs."""
  items: list[Optional[ScheduleItem]] = []
  fusable = _fusable(order, realizes)  # shrinks as kernels take values on, or find they can't
  item_of: dict[int, int] = {}  # id(value) -> the index in items of the kernel computing it
  for b in order:  # sources come first, so producers are scheduled before consumers
    if id(b) not in realizes: continue
    if b.op is MetaOps.COPY:
      src = b.srcs[0]
      items.append(ScheduleItem(LazyOp(MetaOps.COPY, (), src.dtype.itemsize * prod(src.shape)),
                                (_buffer_for(b, {}), _buffer_for(src, {})), {}, (b,)))
      continue
    kb, value = _build_kernel(b, realizes, fusable, items, item_of)
    out_shape = b.shape
    out_st = ShapeTracker.from_shape(out_shape)
    if kb.reduce is not None and kb.reduce.shape != out_shape:
      value = _reshape_leaves(value, kb.reduce.shape, {})
      out_st = out_st.reshape(kb.reduce.shape)
    fused = list(kb.fused.values())
    for lb, _ in fused:  # their own kernels, built earlier, are replaced by this one
      items[item_of.pop(id(lb))] = None
      fusable.discard(id(lb))
    stores = [LazyOp(BufferOps.STORE, (value,), MemBuffer(0, _buf_dtype(b), kb._unbind(out_st)))]
    stores += [LazyOp(BufferOps.STORE, (v,), MemBuffer(i + 1, _buf_dtype(lb), kb._unbind(out_st))) for i, (lb, v) in enumerate(fused)]
    if fused: stores = [_shift_inputs(x, len(fused), {}) for x in stores]
    ast = LazyOp(MetaOps.KERNEL, tuple(stores))
    _verify_once(ast)
    inputs = [lb for _, lb in sorted(kb.inputs.values(), key=lambda x: x[0])]
    outs = (b, *[lb for lb, _ in fused])
    for o in outs: item_of[id(o)] = len(items)
    items.append(ScheduleItem(ast, tuple(_buffer_for(x, kb.var_vals) for x in (*outs, *inputs)), kb.var_vals, outs))
  return [si for si in items if si is not None]

def _build_kernel(b: LazyBuffer, realizes: set[int], fusable: set[int], items: list[Optional[ScheduleItem]],
                  item_of: dict[int, int]) -> tuple[_KernelBuilder, LazyOp]:
  """b's kernel, with the dependent-reduce fusions it can take on. A build that stops over a fused value
  (kb.conflict) runs again: computing the value from the start ("refuse": it was loaded before the
  kernel took it on), or loading it ("nofuse": from here on it is fused nowhere; also when the
  value's own kernel can't be dropped, as it stores more values or a kernel after it reads it). Each
  fusable value the kernel meets costs at most two more builds."""
  prefused: frozenset = frozenset()
  while True:
    kb = _KernelBuilder(b, realizes, fusable - {id(b)}, prefused)
    value = kb.build(b, ShapeTracker.from_shape(b.shape), False)
    if kb.conflict is None:
      dropped: set[int] = set()
      for lb, _ in kb.fused.values():
        j = item_of[id(lb)]
        if (si := items[j]) is None or len(si.outputs) > 1 or any(x is not None and k not in dropped and lb.buffer in x.inputs for k, x in enumerate(items[j + 1:], j + 1)):
          kb.conflict = ("nofuse", lb)
          break
        dropped.add(j)
      else: return kb, value  # type: ignore[return-value]
    assert kb.conflict is not None
    why, lb = kb.conflict
    if why == "refuse": prefused |= {id(lb)}
    else: fusable.discard(id(lb)); prefused = frozenset()  # noqa: E702

def _shift_inputs(op: LazyOp, n: int, memo: dict) -> LazyOp:
  """op with every input buffer index moved up by n (room for n more outputs)."""
  def leaf(x: LazyOp) -> Optional[LazyOp]:
    if x.op is BufferOps.LOAD: return LazyOp(x.op, (), replace(x.arg, idx=x.arg.idx + n))
    return x if x.op is BufferOps.CONST else None
  return _rebuild(op, leaf, memo)
