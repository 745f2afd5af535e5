"""What a beam search's result is keyed by (the search cache, search/db.py): the search's version, the
code generator's source, the kernel's AST and starting opts, the device, renderer and compiler, and the
search settings that change its answer. A stored result is replayed only under the same key, so a
cache moved to another machine, compiler or tilecraft version never hands back an answer found for
something else; and a result cut short by its budget only stands for searches with no larger budget."""
from __future__ import annotations
import hashlib, json, os
from typing import Any, Optional, Sequence
from tilecraft.codegen.kernel import Kernel
from tilecraft.engine.search.actions import opts_key
from tilecraft.ops import MemBuffer
from tilecraft.shape.symbolic import Variable

SEARCH_VERSION = 7  # bump when the action grid, the search's choices or how it times change: old cache rows and timings stop matching

def _identity(obj: Any, attrs: Sequence[str]) -> str:
  parts = [f"{type(obj).__module__}.{type(obj).__qualname__}"]
  parts += [f"{a}={getattr(obj, a, None)!r}" for a in attrs]
  parts += [f"{k}={v!r}" for k, v in sorted(getattr(obj, "__dict__", {}).items()) if not k.startswith("_") and isinstance(v, (int, float, str, bool, tuple, type(None)))]
  return hashlib.sha256("|".join(parts).encode()).hexdigest()[:24]

def renderer_identity(ren: Any) -> str:
  return _identity(ren, ("device", "supports_float4", "has_local", "has_shared", "global_max", "local_max", "shared_max", "tensor_cores",
                         "vector_width"))

_codegen_id: Optional[str] = None

def codegen_identity() -> str:
  """A hash of the code generator's source: generated code (so timings and the best opts) may change
  with it, so cached searches and timings are only reused by the same code generator."""
  global _codegen_id
  if _codegen_id is None:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tilecraft/
    h = hashlib.sha256()
    for sub in ("codegen", "renderer", "shape", "runtime", ""):
      d = os.path.join(root, sub)
      for fn in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if fn.endswith(".py") and (sub or fn in ("ops.py", "dtype.py", "device.py")):
          with open(os.path.join(d, fn), "rb") as f: h.update(fn.encode() + b"\0" + f.read())
    _codegen_id = h.hexdigest()[:24]
  return _codegen_id

def compiler_identity(comp: Any) -> str:
  return hashlib.sha256(f"{type(comp).__qualname__}|{getattr(comp, 'cachekey', '')}|{' '.join(getattr(comp, 'flags', ()))}".encode()).hexdigest()[:24]

def search_var_vals(kernel: Kernel, var_vals: Optional[dict]) -> dict[str, int]:
  """Values for the kernel's Variables by name: given, else bound, else the maximum (buffers are sized for it)."""
  given = {getattr(k, "expr", k): int(v) for k, v in (var_vals or {}).items()}
  out = {}
  for v in sorted(kernel.ast.vars(), key=lambda v: v.expr):
    out[v.expr] = given.get(v.expr, v.val if v.is_bound else v.vmax)
  for b in kernel.bufs:
    if not isinstance(b, MemBuffer) and isinstance(getattr(b, "val", None), Variable):
      v = b.val
      out.setdefault(v.expr, given.get(v.expr, v.val if v.is_bound else v.vmax))
  return out

def result_key(kernel: Kernel, amt: int, allow_test_size: bool, vv: dict[str, int], max_upcast: int, max_lanes: int,
               max_threads: Optional[int], max_uops: int, patience: int, max_rounds: int) -> str:
  """The search cache key of a search of `kernel` (its AST and the opts it starts from) with these settings
  on its renderer's device: it covers everything that decides whether the result is right for a machine
  (see search/db.py). `vv`: the Variable values the search times with (search_var_vals)."""
  from tilecraft.device import Device
  ren = kernel.opts
  settings = [SEARCH_VERSION, codegen_identity(), kernel.ast.key.hex(), ren.device, renderer_identity(ren), compiler_identity(Device[ren.device].compiler),
              amt, bool(allow_test_size), opts_key(tuple(kernel.applied_opts)), max_upcast, max_lanes, max_threads, max_uops, patience, max_rounds,
              sorted(vv.items())]
  return hashlib.sha256(json.dumps(settings).encode()).hexdigest()

def replayable(row: Sequence[Any], budget_s: Optional[float]) -> bool:
  """Whether a stored result (db.get_result's row) stands for a search with this effective budget: a
  complete search always does, one cut by its budget only for searches with no larger budget."""
  complete, budget = row[4], row[5]
  return bool(complete) or (budget_s is not None and (budget is None or budget_s <= budget))
