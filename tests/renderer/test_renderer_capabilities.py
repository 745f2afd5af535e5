"""Renderer capabilities are declared fields of `Renderer` (renderer/__init__.py): every capability the
code generator reads off a renderer is one of them, so no reader needs a `getattr` default and a
misspelled capability is an AttributeError, not a silent default."""
from __future__ import annotations
import ast, pathlib
from tilecraft.renderer import Renderer

ROOT = pathlib.Path(__file__).resolve().parents[2]
# how codegen/ names a renderer: `ren`, `self.ren`, `k.opts`, `self.opts`, `self.k.opts`
_RENDERER_EXPRS = {"ren", "self.ren", "k.opts", "self.opts", "self.k.opts"}

def capability_reads(src: str) -> set[str]:
  """The attribute names read off a renderer in src: `ren.x` and `getattr(ren, "x", ...)` (methods
  called on it, such as `render`, included)."""
  out: set[str] = set()
  for node in ast.walk(ast.parse(src)):
    if isinstance(node, ast.Attribute) and ast.unparse(node.value) in _RENDERER_EXPRS: out.add(node.attr)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2 and \
        ast.unparse(node.args[0]) in _RENDERER_EXPRS and isinstance(node.args[1], ast.Constant):
      out.add(node.args[1].value)
  return out

def test_capability_reads_finds_both_forms():
  assert capability_reads("def f(k, ren):\n  a = ren.has_local\n  b = getattr(k.opts, 'image_max', (0, 0))\n  c = k.shape\n") == {"has_local", "image_max"}

def test_every_capability_codegen_reads_is_declared():
  reads = {}
  for p in sorted((ROOT / "tilecraft" / "codegen").glob("*.py")):
    for name in capability_reads(p.read_text()): reads.setdefault(name, []).append(p.name)
  assert {"has_local", "vector_dtypes", "supports_images", "tensor_cores"} <= set(reads), "the scan found too little: is the parser broken?"
  undeclared = {n: files for n, files in reads.items() if not hasattr(Renderer, n)}
  assert not undeclared, f"renderer attributes read in codegen/ but not declared on Renderer: {undeclared}"
