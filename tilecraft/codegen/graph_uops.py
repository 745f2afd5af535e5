"""GRAPHUOPS=1: a picture of each rendered kernel's UOp graph, a file a user can open.

  graph_uops(uops, name, out_dir=None) -> path of the file written
  maybe_graph(uops, name)                -> what Kernel.to_program calls: graph_uops under GRAPHUOPS=1,
                                            one line naming the file on stderr; a clear warning (once)
                                            when the `graphviz` package is missing

One node per UOp of the linearized list, labelled with its position, op, dtype and arg, and filled by
kind (kernel arguments, loops, memory, ALU, accumulators, tensor cores); an edge runs from each source
to the UOp that uses it. The graph is built with the `graphviz` Python package (the optional extra
`pip install 'tilecraft[graph]'`). Where Graphviz's `dot` program is on PATH the picture is rendered
to `<name>.uops.svg` (open it in a browser); else `<name>.uops.dot` is written (any Graphviz viewer
opens it, or `dot -Tsvg` renders it). Files go to GRAPH_DIR (default: <temp dir>/tilecraft-graphs),
one per kernel name (a kernel rendered again overwrites its picture).
"""
from __future__ import annotations
import os, re, shutil, sys, tempfile, warnings
from enum import Enum
from typing import Any, Optional
from tilecraft.helpers import getenv

_FILL = {"DEFINE_GLOBAL": "#ffe0b2", "DEFINE_VAR": "#ffe0b2", "DEFINE_LOCAL": "#ffcc80", "SPECIAL": "#b2ebf2", "CONST": "#eeeeee",
         "RANGE": "#c5cae9", "ENDRANGE": "#c5cae9", "IF": "#d1c4e9", "ENDIF": "#d1c4e9", "BARRIER": "#ef9a9a",
         "LOAD": "#c8e6c9", "STORE": "#a5d6a7", "PREFETCH": "#e8f5e9", "DEFINE_ACC": "#f8bbd0", "PHI": "#f8bbd0", "ACCREAD": "#f8bbd0",
         "WMMA": "#fff59d", "SINK": "#ffffff"}
_ALU_FILL = "#bbdefb"  # ALU, CAST, BITCAST, VECTORIZE, GEP

class GraphvizMissing(ImportError):
  """GRAPHUOPS=1 without the `graphviz` Python package."""

def _graphviz() -> Any:
  try: import graphviz
  except ImportError:
    raise GraphvizMissing("GRAPHUOPS=1 draws kernels' UOp graphs with the graphviz Python package, which is not installed: "
                          "pip install 'tilecraft[graph]' (and Graphviz's `dot`, e.g. apt-get install graphviz, for SVG pictures)") from None
  return graphviz

def out_dir() -> str:
  """GRAPH_DIR, else tilecraft-graphs in the temp dir."""
  return str(getenv("GRAPH_DIR", "")) or os.path.join(tempfile.gettempdir(), "tilecraft-graphs")

def _label(i: int, u: Any) -> str:
  text = u.arg.name if isinstance(u.arg, Enum) else ("" if u.arg is None else repr(u.arg).replace("\\", "\\\\"))
  if len(text) > 60: text = text[:57] + "..."
  return f"{i} {u.op.name}\\n{u.dtype}" + (f"\\n{text}" if text else "")

def graph_uops(uops: list, name: str, directory: Optional[str] = None) -> str:
  """Write the picture of the linearized `uops` of kernel `name`; the path written (.svg where `dot`
  runs, else .dot). Raises GraphvizMissing without the graphviz package."""
  graphviz = _graphviz()
  g = graphviz.Digraph(name=name, graph_attr={"rankdir": "TB", "label": name, "labelloc": "t"},
                       node_attr={"shape": "box", "style": "rounded,filled", "fontname": "monospace", "fontsize": "10"})
  pos = {id(u): i for i, u in enumerate(uops)}
  for i, u in enumerate(uops):
    g.node(str(i), _label(i, u).replace('"', "'"), fillcolor=_FILL.get(u.op.name, _ALU_FILL))
  for i, u in enumerate(uops):
    for s in u.src:
      if id(s) in pos: g.edge(str(pos[id(s)]), str(i))
  d = directory or out_dir()
  os.makedirs(d, exist_ok=True)
  base = os.path.join(d, re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".uops")
  with open(base + ".dot", "w") as f: f.write(g.source)
  if shutil.which("dot") is None: return base + ".dot"
  try: g.render(outfile=base + ".svg", format="svg", cleanup=False)
  except Exception as e:  # noqa: BLE001 - a dot that fails (a huge graph, a broken install) still leaves the .dot file
    warnings.warn(f"GRAPHUOPS: dot could not render {base}.dot ({type(e).__name__}: {e}); the .dot file is there", RuntimeWarning, stacklevel=2)
    return base + ".dot"
  return base + ".svg"

_warned_missing = False

def maybe_graph(uops: list, name: str) -> Optional[str]:
  """Under GRAPHUOPS=1: graph_uops, and one line on stderr naming the file. A missing graphviz package
  is one warning (per process) saying how to install it; rendering goes on."""
  global _warned_missing
  if not getenv("GRAPHUOPS", 0): return None
  try: path = graph_uops(uops, name)
  except GraphvizMissing as e:
    if not _warned_missing:
      _warned_missing = True
      warnings.warn(str(e), RuntimeWarning, stacklevel=3)
    return None
  print(f"GRAPHUOPS: {name} -> {path}", file=sys.stderr)
  return path
