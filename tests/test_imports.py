"""The package's import graph (docs/architecture.md, "The folders, in pipeline order"): every import
is one the table there allows, every module is on a line of it, and there are no cycles.

Edges: every `import` / `from ... import` in a module, at module level or inside a function or
class, because a cycle through a function-level import is still a cycle in the design (each side
needs the other) even when Python tolerates it at import time. Not edges: imports under
`if TYPE_CHECKING:` (annotations only), except where a test asks for them (inside codegen/ there
must be no cycle even with them). Importing `a.b.c` also imports the packages `a.b` and `a` (their
`__init__`), except the importer's own ancestors, which Python initializes first anyway; an empty
package `__init__` runs nothing and is no dependency of the table's lines. Runtimes are found by name
(device.py's registry imports `tilecraft.runtime.<name>` through importlib), so runtime/* may import
device.py and device.py names no runtime."""
from __future__ import annotations
import ast, functools, pathlib, re
from typing import Optional, Union

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

def imports_of(name: str, path: pathlib.Path, mods: dict[str, pathlib.Path], type_checking: bool = False) -> set[str]:
  """The tilecraft modules `name` imports (see the module docstring for what counts); with
  type_checking, the imports under `if TYPE_CHECKING:` too."""
  pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
  found: set[str] = set()
  def visit(node: ast.AST) -> None:
    for ch in ast.iter_child_nodes(node):
      if isinstance(ch, ast.If) and "TYPE_CHECKING" in ast.unparse(ch.test) and not type_checking: continue
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

@functools.lru_cache(maxsize=None)
def package_graph() -> dict[str, frozenset[str]]:
  """Every module of the package -> the modules it imports (parsed once per test run)."""
  mods = modules()
  return {m: frozenset(imports_of(m, p, mods)) for m, p in mods.items()}

def test_no_import_cycles():
  graph = package_graph()
  assert sum(len(e) for e in graph.values()) > 50, "the graph is suspiciously small: the import parser is broken"
  assert "tilecraft.codegen.kernel" in graph["tilecraft.engine.realize"]
  cycle = find_cycle(graph)
  assert cycle is None, "import cycle: " + " -> ".join(cycle or [])

def test_no_import_cycles_inside_codegen_even_for_type_checking():
  """Inside codegen/ no module needs another that needs it, not even for annotations: the lowering
  passes are functions of their inputs, not mixins that name the class they are mixed into."""
  every = modules()
  mods = {m: p for m, p in every.items() if m.startswith("tilecraft.codegen")}
  graph = {m: imports_of(m, p, every, type_checking=True) & set(mods) for m, p in mods.items()}
  assert "tilecraft.codegen.kernel" in graph and "tilecraft.codegen.lowerer" in graph["tilecraft.codegen.kernel"]
  assert "tilecraft.codegen.lower_state" in graph["tilecraft.codegen.lower_reduce"], "the parser lost the passes' imports of the lowering state"
  cycle = find_cycle(graph)
  assert cycle is None, "import cycle inside codegen/ (TYPE_CHECKING imports included): " + " -> ".join(cycle or [])

# ---- the import table of docs/architecture.md --------------------------------------------------------------

EVERYTHING, EVERYTHING_ABOVE = "everything", "everything above"

def import_table(text: str) -> list[tuple[list[str], Union[str, list[str]]]]:
  """The table's lines, in order: (the names in backticks of the first column, what the last column
  allows: EVERYTHING, EVERYTHING_ABOVE plus the names in backticks, or just the names)."""
  section = text.split("## The folders, in pipeline order", 1)[1].split("\n## ", 1)[0]
  rows = []
  for line in section.splitlines():
    if not line.startswith("| `"): continue
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    names, allows = re.findall(r"`([^`]+)`", cells[0]), re.sub(r"\([^)]*\)", "", cells[-1])  # (parentheses: comments)
    allowed = [n for n in re.findall(r"`([^`]+)`", allows) if n.endswith((".py", "/"))]
    if allows.startswith(EVERYTHING_ABOVE): rows.append((names, [EVERYTHING_ABOVE] + allowed))
    elif allows.startswith(EVERYTHING): rows.append((names, EVERYTHING))
    else: rows.append((names, allowed))
  return rows

def covers(name: str, module: str) -> int:
  """How specifically a table name ("x.py", "x/", "x/y.py", "__init__.py" for the package, "x/__init__.py"
  for a folder's own) names a module: 0 not at all, 1 as a folder's, 2 the module itself."""
  if name == "__init__.py" or name.endswith("/__init__.py"): return 2 if module == ".".join(["tilecraft", *name.split("/")[:-1]]) else 0
  if name.endswith("/"):
    pkg = "tilecraft." + name.rstrip("/").replace("/", ".")
    return 1 if module == pkg or module.startswith(pkg + ".") else 0
  return 2 if module == "tilecraft." + name[:-3].replace("/", ".") else 0

def line_of(module: str, rows: list) -> Optional[int]:
  """The index of the most specific table line naming module, or None."""
  best = max(((max(covers(n, module) for n in names), i) for i, (names, _) in enumerate(rows)), default=(0, 0))
  return best[1] if best[0] else None

def allowed(module: str, target: str, rows: list) -> bool:
  i, j = line_of(module, rows), line_of(target, rows)
  if i is None or j is None or i == j: return i == j and i is not None
  _, allows = rows[i]
  if allows == EVERYTHING: return True
  if EVERYTHING_ABOVE in allows and j < i: return True
  return any(covers(n, target) for n in allows)

def _empty_package(path: pathlib.Path) -> bool:
  body = ast.parse(path.read_text()).body
  return path.name == "__init__.py" and all(isinstance(x, ast.Expr) and isinstance(x.value, ast.Constant) for x in body)

def test_import_table_parser():
  text = """## The folders, in pipeline order\n| folder | job | may import |\n|---|---|---|
| `a.py`, `b/` | x | nothing |\n| `b/c.py` | y | `a.py` |\n| `d/` | z (`e.py` here is a job) | everything above, and `f/g.py` (why: `h.py`) |\n| `f/` | w | everything |
## Next section\n| `x/` | not the table | `a.py` |\n"""
  rows = import_table(text)
  assert rows == [(["a.py", "b/"], []), (["b/c.py"], ["a.py"]), (["d/"], [EVERYTHING_ABOVE, "f/g.py"]), (["f/"], EVERYTHING)]
  assert line_of("tilecraft.b.c", rows) == 1 and line_of("tilecraft.b.x", rows) == 0 and line_of("tilecraft.x", rows) is None
  assert allowed("tilecraft.b.c", "tilecraft.a", rows) and not allowed("tilecraft.b.c", "tilecraft.b.x", rows)
  assert allowed("tilecraft.a", "tilecraft.b.x", rows) and not allowed("tilecraft.a", "tilecraft.b.c", rows)
  assert allowed("tilecraft.d.x", "tilecraft.b.c", rows) and allowed("tilecraft.d.x", "tilecraft.f.g", rows)
  assert not allowed("tilecraft.d.x", "tilecraft.f.h", rows) and allowed("tilecraft.f.h", "tilecraft.d", rows)

def test_every_import_is_one_the_table_allows():
  rows = import_table((ROOT / "docs" / "architecture.md").read_text())
  assert len(rows) >= 10, "the import table of docs/architecture.md wasn't found (its section title changed?)"
  mods = modules()
  assert not (missing := sorted(m for m in mods if line_of(m, rows) is None)), f"modules on no line of the table: {missing}"
  empty = {m for m, p in mods.items() if _empty_package(p)}
  bad = []
  for m, p in mods.items():
    for t in sorted(package_graph()[m] - empty):
      if not allowed(m, t, rows): bad.append(f"{m} imports {t} (line {rows[line_of(m, rows)][0]} may import {rows[line_of(m, rows)][1]})")
  assert not bad, "imports docs/architecture.md's table doesn't allow:\n" + "\n".join(bad)
