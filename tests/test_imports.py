"""The package's import graph has no cycles (docs/architecture.md: what each folder may import).

Edges: every `import` / `from ... import` in a module, at module level or inside a function or
class, because a cycle through a function-level import is still a cycle in the design (each side
needs the other) even when Python tolerates it at import time. Not edges: imports under
`if TYPE_CHECKING:` (annotations only). Importing `a.b.c` also imports the packages `a.b` and `a`
(their `__init__`), except the importer's own ancestors, which Python initializes first anyway.
Runtimes are found by name (device.py's registry imports `tilecraft.runtime.<name>` through
importlib), so runtime/* may import device.py and device.py names no runtime."""
from __future__ import annotations
import ast, pathlib
from typing import Optional

ROOT = pathlib.Path(__file__).resolve().parents[1]

def modules() -> dict[str, pathlib.Path]:
  out = {}
  for p in sorted((ROOT / "tilecraft").rglob("*.py")):
    parts = list(p.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__": parts.pop()
    out[".".join(parts)] = p
  return out

def _resolve(name: str, mods: dict[str, pathlib.Path]) -> Optional[str]:
  while name and name not in mods: name = name.rpartition(".")[0]
  return name or None

def imports_of(name: str, path: pathlib.Path, mods: dict[str, pathlib.Path]) -> set[str]:
  """The tilecraft modules `name` imports (see the module docstring for what counts)."""
  pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
  found: set[str] = set()
  def visit(node: ast.AST) -> None:
    for ch in ast.iter_child_nodes(node):
      if isinstance(ch, ast.If) and "TYPE_CHECKING" in ast.unparse(ch.test): continue
      if isinstance(ch, ast.Import): found.update(a.name for a in ch.names)
      elif isinstance(ch, ast.ImportFrom):
        base = ch.module or ""
        if ch.level:
          up = pkg
          for _ in range(ch.level - 1): up = up.rpartition(".")[0]
          base = f"{up}.{base}" if base else up
        found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in ch.names)
      visit(ch)
  visit(ast.parse(path.read_text()))
  out = set()
  for target in found:
    if (t := _resolve(target, mods)) is None or t == name: continue
    parts = t.split(".")
    out |= {p for p in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if p in mods and not (name + ".").startswith(p + ".")}
  return out - {name}

def find_cycle(graph: dict[str, set[str]]) -> Optional[list[str]]:
  """One cycle as [a, b, ..., a], or None."""
  state: dict[str, int] = {}  # 1: on the current path, 2: done
  path: list[str] = []
  def dfs(v: str) -> Optional[list[str]]:
    state[v] = 1
    path.append(v)
    for w in sorted(graph.get(v, ())):
      if state.get(w) == 1: return path[path.index(w):] + [w]
      if w not in state and (c := dfs(w)) is not None: return c
    path.pop()
    state[v] = 2
    return None
  for v in sorted(graph):
    if v not in state and (c := dfs(v)) is not None: return c
  return None

def test_find_cycle_finds_cycles():
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]

def test_graph_sees_function_level_and_relative_imports(tmp_path):
  mods = {"pkg": tmp_path / "__init__.py", "pkg.a": tmp_path / "a.py", "pkg.b": tmp_path / "b.py"}
  mods["pkg.a"].write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n  from pkg import b\ndef f():\n  from .b import g\n")
  assert imports_of("pkg.a", mods["pkg.a"], mods) == {"pkg.b"}
  mods["pkg.b"].write_text("import os\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n  import pkg.a\n")
  assert imports_of("pkg.b", mods["pkg.b"], mods) == set()

def test_no_import_cycles():
  mods = modules()
  graph = {m: imports_of(m, p, mods) for m, p in mods.items()}
  assert sum(len(e) for e in graph.values()) > 50, "the graph is suspiciously small: the import parser is broken"
  assert "tilecraft.codegen.kernel" in graph["tilecraft.engine.realize"]
  cycle = find_cycle(graph)
  assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
