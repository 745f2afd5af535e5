"""Graph recipes: composite Tensor methods (softmax, layernorm, matmul, conv2d, ...) replayed from a
record of the lazy graph they built, instead of built op by op again.

A user's loop calls the same composite on inputs of the same kind every time. On realized inputs the
graph such a method builds is a function of the inputs' views, dtypes and devices (and of which
inputs share a base), its arguments and the settings the frontend reads (IMAGE, WINO, SPLIT_REDUCE,
the default dtypes). The first call builds it the ordinary way (validating everything) and records it: per node,
its op, argument, dtype, device, view, forced realize, image dtype and sources. A later call with
the same key makes the same nodes directly: one LazyBuffer each, no checks, broadcasting, dtype
promotion or movement ops. Building costs more than the kernels of a small workload, and right after
a kernel has streamed through memory Python runs cache-cold, at about twice its warm cost.

Only graphs whose leaves are the inputs' realized bases and constants are recorded (anything else
could change between calls); arguments must be plain values (ints, floats by their bits, bools,
None, strings, dtypes, tuples of those), so -0.0 and 0.0 or 1 and True never share. Replayed nodes are not
hash-consed with other live graphs: an expression built both inside and outside a replayed call is
computed once per graph that reads it, which costs time, never correctness. `RECIPES=0` (env or
Context) builds every graph op by op."""
from __future__ import annotations
import functools, struct
from typing import Any, Callable, Optional
from tilecraft.dtype import DType, dtypes
from tilecraft.engine.lazy import LazyBuffer
from tilecraft.helpers import IMAGE, SPLIT_REDUCE, WINO, getenv
from tilecraft.ops import BufferOps
from tilecraft.shape.symbolic import Node

_MAX = 512  # recipes per method; the table is cleared when full

def _arg_key(x: Any) -> Any:
  """x as part of a key, or a TypeError when it can't be one (tensors are keyed as inputs)."""
  t = type(x)
  if t is int or t is bool or t is str or x is None: return (t, x)
  if t is float: return (t, struct.pack("<d", x))
  if t is tuple or t is list: return (t, tuple(_arg_key(y) for y in x))
  if isinstance(x, DType): return (DType, x)
  raise TypeError(t)

class _Recipe:
  """The nodes of a recorded graph in order, sources first. A node is (kind, ...): ("in", input) for
  an input's base; ("view", node, st, shape) for a view; ("op", op, arg, dtype, device, st, srcs, forced, image,
  shape) for an unrealized base (constants too); ("same", lb) for a node every replay shares.

  Constants (not forced, not images) and views of them depend on nothing but the recipe, and the
  scheduler never gives a constant a buffer: the first replay makes them, later ones share them."""
  __slots__ = ("nodes", "out", "base", "walk", "shared")
  def __init__(self, nodes: list[tuple], out: int):
    self.nodes, self.out = nodes, out
    self.base = nodes[out][1] if nodes[out][0] == "view" else out  # the output's base node
    self.walk: Any = None  # the scheduler's walk of this graph, by node index (engine/plan_cache.py: ReplayedWalk)
    shared: list[int] = []
    for i, n in enumerate(nodes):
      if i == out or i == self.base: continue
      if (n[0] == "op" and n[1] is BufferOps.CONST and not n[7] and n[8] is None) or (n[0] == "view" and n[1] in shared): shared.append(i)
    self.shared = tuple(shared)  # nodes to share, once made

def _record(out: Any, bases: list[Any]) -> Optional[_Recipe]:
  """The recipe of the graph under LazyBuffer `out`, whose leaves must be `bases` (the inputs'
  realized bases) or constants; None when it has any other leaf."""
  index: dict[LazyBuffer, int] = {}
  nodes: list[tuple] = []
  slot = {b: i for i, b in reversed(list(enumerate(bases)))}
  stack: list[tuple[LazyBuffer, bool]] = [(out, False)]
  while stack:
    lb, done = stack.pop()
    if lb in index: continue
    if done:
      if lb._base is not None: nodes.append(("view", index[lb._base], lb.st, lb.shape))
      else: nodes.append(("op", lb.op, lb.arg, lb.dtype, lb.device, lb.st, tuple(index[s] for s in lb.srcs), lb.forced_realize, lb.image, lb.shape))
      index[lb] = len(nodes) - 1
      continue
    if lb._base is None and (i := slot.get(lb)) is not None:
      nodes.append(("in", i))
      index[lb] = len(nodes) - 1
      continue
    if not lb.st.concrete: return None  # symbolic: Variables are bound per call
    if lb._base is None:
      if lb.op is None or lb.buffer is not None: return None  # a realized value that isn't an input, or a base with a buffer
      if lb.op is BufferOps.CONST and isinstance(lb.arg, Node): return None  # a Variable
    stack.append((lb, True))
    if lb._base is not None: stack.append((lb._base, False))
    else: stack.extend((s, False) for s in lb.srcs)
  return _Recipe(nodes, index[out])

def _replay(r: _Recipe, bases: list[Any]) -> Any:
  made: list[Any] = []
  append = made.append
  for n in r.nodes:  # (a node per LazyBuffer, and this runs on every call: no calls but the constructor)
    kind = n[0]
    if kind == "view":
      src = made[n[1]]
      append(LazyBuffer(src.device, n[2], src.dtype, None, None, (), src, n[3]))  # (positional: keywords cost more)
    elif kind == "op":
      _, op, arg, dt, device, st, srcs, forced, image, shape = n
      k = len(srcs)
      lb = LazyBuffer(device, st, dt, op, arg, () if k == 0 else (made[srcs[0]],) if k == 1 else (made[srcs[0]], made[srcs[1]]) if k == 2
                      else tuple([made[i] for i in srcs]), None, shape)
      if forced: lb.forced_realize = True
      if image is not None: lb.image = image
      append(lb)
    elif kind == "same": append(n[1])
    else: append(bases[n[1]])
  if r.shared:
    for i in r.shared: r.nodes[i] = ("same", made[i])
    r.shared = ()
  out = made[r.out]
  if (b := out._base if out._base is not None else out).op is not None:  # realizing it alone can skip the scheduler's walk
    # (without the output and its base, which the scheduler has at hand: a base holding a list that holds
    # it would be a reference cycle, and its buffers would wait for the garbage collector, not the pool)
    made[r.out] = made[r.base] = None
    b.replayed = (r, made)
  return out

def recorded(fn: Callable) -> Callable:
  """Decorate a composite Tensor method `fn(self, *args, **kwargs)` returning one Tensor: replay its
  graph from a recipe when the inputs (self and Tensor arguments) are realized and everything else
  is a plain value (see the module docstring); otherwise, or the first time, call it."""
  cache: dict[tuple, Optional[_Recipe]] = {}
  @functools.wraps(fn)
  def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
    if not getenv("RECIPES", 1): return fn(self, *args, **kwargs)
    tensor = type(self)
    inputs, parts = [self], []
    try:
      for a in ((*args, *[kwargs[k] for k in sorted(kwargs)]) if kwargs else args):
        if isinstance(a, tensor):
          parts.append(("T", len(inputs)))
          inputs.append(a)
        else: parts.append(_arg_key(a))
    except TypeError: return fn(self, *args, **kwargs)
    bases, sig = [], []
    for t in inputs:
      lb = t.lazydata
      b = lb._base if lb._base is not None else lb
      if b.op is not None or b.buffer is None or not lb.st.concrete: return fn(self, *args, **kwargs)
      sig.append((lb.st, lb.dtype, lb.device, b.st, b.buffer.dtype, b.image, bases.index(b) if b in bases else len(bases)))  # (by identity)
      bases.append(b)
    key = (tuple(parts), tuple(sorted(kwargs)), tuple(sig), int(getenv(IMAGE.name, IMAGE.default)), int(getenv(WINO.name, WINO.default)),
           int(getenv(SPLIT_REDUCE.name, SPLIT_REDUCE.default)), dtypes.default_float, dtypes.default_int)
    if (r := cache.get(key)) is not None: return tensor(_replay(r, bases))
    forced = [b.forced_realize for b in bases]
    out = fn(self, *args, **kwargs)
    if key in cache or not isinstance(out, tensor) or [b.forced_realize for b in bases] != forced: return out
    if len(cache) >= _MAX: cache.clear()
    cache[key] = _record(out.lazydata, bases)  # (None: not recordable; the key is then never looked up again)
    return out
  wrapper.cache = cache  # type: ignore[attr-defined]
  return wrapper
