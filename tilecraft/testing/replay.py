"""Process replay (DESIGN §11): record the kernels a run renders, then see exactly what a change to
the code generator does to the code it generates.

  RUN_PROCESS_REPLAY=1 <any run>     every Kernel.to_program records (AST, renderer, applied opts,
                                     name, source, the settings that change the source) into REPLAY_DB
                                     (default: <cache dir>/process_replay.db)
  tilecraft replay record [--models resnet50,...]
                                     records the bench suite and the fuzz corpus with hand-coded opts
                                     (and one call of each named light ONNX model: real model shapes)
  tilecraft replay diff --against REV
                                     regenerates every recorded kernel with the code at REV (a
                                     temporary git worktree) and with the working tree, and prints a
                                     unified diff per kernel whose source differs, then the count
  tilecraft replay diff --heuristics  the same with each side's own hand-coded heuristics choosing the opts
                                     (a heuristic change shows, with each changed kernel's old and new opts)

Regeneration runs in one subprocess per tree with only that tree's code importable. The subprocess
runs this very file as a script: it imports nothing of tilecraft at module level and regenerates
through the public API only (Kernel(ast, opts=renderer), apply_opt, to_program(name_override)), so
the code of any revision that has that API can regenerate the recorded kernels. Each kernel is
rebuilt with the settings it was recorded under in force (TC, TC_OPT, NOLOCALS, CPU_ARCH, IMAGE and
what its rendering read, e.g. the renderer's settings_key() ones): whatever the regenerating
environment says, a kernel recorded under TC=3 regenerates as TC=3 and one recorded under
CPU_ARCH=haswell for haswell.
"""
from __future__ import annotations
import contextlib, difflib, json, os, pickle, shutil, sqlite3, subprocess, sys, tempfile
from typing import Any, Iterator, Optional

def db_path() -> str:
  """REPLAY_DB, else process_replay.db in tilecraft's cache dir (recording lives in codegen/replay_record.py)."""
  from tilecraft.codegen.replay_record import db_path as path
  return path()

def recorded(path: Optional[str] = None) -> list[dict[str, Any]]:
  """The recorded kernels (name, device, renderer, opts, src, settings: "NAME=value ..." of the
  recorded settings that were set), oldest first."""
  c = sqlite3.connect(path or db_path(), timeout=60)
  try:
    has_settings = "settings" in {r[1] for r in c.execute("PRAGMA table_info(kernels)")}
    rows = c.execute(f"SELECT key, name, device, renderer, opts, src, {'settings' if has_settings else 'NULL'} FROM kernels ORDER BY recorded, key").fetchall()
  finally: c.close()
  def shown(b: Optional[bytes]) -> str:
    return " ".join(f"{n}={v[1]}" for n, v in sorted(pickle.loads(b).items()) if len(v) > 1) if b else ""
  return [dict(zip(("key", "name", "device", "renderer", "opts", "src", "settings"), r[:6] + (shown(r[6]),))) for r in rows]

# ---- regeneration (this part runs as a script, in the tree being regenerated) ---------------------

@contextlib.contextmanager
def restored_settings(settings: dict[str, tuple]) -> Iterator[None]:
  """A record's settings in force for the block ({name: ("set", value) | ("env", raw) | ("unset",)},
  codegen/replay_record.py): environment values set or removed (put back afterwards), Context overrides
  entered. For the replay's own process: a Context its caller entered would win over an env value."""
  from tilecraft.helpers import Context
  saved = {n: os.environ.get(n) for n, v in settings.items() if v[0] != "set"}
  try:
    for n, v in settings.items():
      if v[0] == "env": os.environ[n] = v[1]
      elif v[0] == "unset": os.environ.pop(n, None)
    with Context(**{n: v[1] for n, v in settings.items() if v[0] == "set"}): yield
  finally:
    for n, old in saved.items():
      if old is None: os.environ.pop(n, None)
      else: os.environ[n] = old

def regenerate(path: str, heuristics: bool = False) -> dict[str, Any]:
  """{key: {"src": ..., "opts": ..., "error": ...}} for every recorded kernel, rendered by the tilecraft
  importable here under the settings it was recorded with (none for records older than that): with its
  recorded opts, or with `heuristics` the opts this tree's hand-coded heuristics choose for it."""
  from tilecraft.codegen.kernel import Kernel
  from tilecraft.device import Device
  c = sqlite3.connect(path, timeout=60)
  has_settings = "settings" in {r[1] for r in c.execute("PRAGMA table_info(kernels)")}
  rows = c.execute(f"SELECT key, name, device, ast, renderer_obj, opts_obj, {'settings' if has_settings else 'NULL'} FROM kernels").fetchall()
  c.close()
  out: dict[str, Any] = {}
  for key, name, device, ast_b, ren_b, opts_b, settings_b in rows:
    try:
      ast, opts = pickle.loads(ast_b), pickle.loads(opts_b)
      with restored_settings(pickle.loads(settings_b) if settings_b else {}):
        try: ren = pickle.loads(ren_b)
        except Exception: ren = Device[device].renderer  # noqa: BLE001 - a renderer class this tree doesn't have: the device's own
        k = Kernel(ast, opts=ren)
        if heuristics: k = k.hand_coded_optimizations()
        else:
          for o in opts: k.apply_opt(o)
        out[key] = {"src": k.to_program(name_override=name).src, "opts": " ".join(f"{o.op.name}{o.axis},{o.amt}" for o in k.applied_opts), "error": None}
    except Exception as e:  # noqa: BLE001 - reported per kernel
      out[key] = {"src": None, "opts": None, "error": f"{type(e).__name__}: {e}"}
  return out

def regenerate_in(tree: str, path: str, timeout: float = 900, heuristics: bool = False) -> dict[str, Any]:
  """regenerate() in a subprocess that imports tilecraft from `tree` only."""
  with tempfile.TemporaryDirectory(prefix="tilecraft-replay-") as tmp:
    script, out = os.path.join(tmp, "replay_regenerate.py"), os.path.join(tmp, "out.json")
    shutil.copyfile(os.path.abspath(__file__), script)
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), RUN_PROCESS_REPLAY="0", PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([sys.executable, script, "regenerate-heuristics" if heuristics else "regenerate", os.path.abspath(path), out], cwd=tree, env=env, capture_output=True, text=True,
                       timeout=timeout)
    if r.returncode != 0 or not os.path.exists(out):
      raise RuntimeError(f"regenerating in {tree} failed (exit {r.returncode}):\n{(r.stderr or r.stdout)[-3000:]}")
    with open(out) as f: return json.load(f)

def code_tree() -> str:
  """The source tree of the tilecraft running now (the 'working tree' of a replay diff)."""
  import tilecraft
  return os.path.dirname(os.path.dirname(os.path.abspath(tilecraft.__file__)))

def _git(repo: str, *args: str) -> str:
  r = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, timeout=120)
  if r.returncode != 0: raise RuntimeError(f"git {' '.join(args)} failed: {r.stderr.strip()}")
  return r.stdout.strip()

@contextlib.contextmanager
def worktree(repo: str, rev: str) -> Iterator[str]:
  """A temporary detached git worktree of `repo` at `rev`, removed afterwards."""
  commit = _git(repo, "rev-parse", "--verify", f"{rev}^{{commit}}")
  tmp = tempfile.mkdtemp(prefix="tilecraft-replay-wt-")
  path = os.path.join(tmp, "tree")
  _git(repo, "worktree", "add", "--detach", "--quiet", path, commit)
  try: yield path
  finally:
    try: _git(repo, "worktree", "remove", "--force", path)
    except RuntimeError: pass
    shutil.rmtree(tmp, ignore_errors=True)
    with contextlib.suppress(RuntimeError): _git(repo, "worktree", "prune")

def diff(against: str, path: Optional[str] = None, tree: Optional[str] = None, heuristics: bool = False) -> dict[str, Any]:
  """Regenerate the recorded kernels at `against` and in `tree` (default: code_tree()); the changes. With
  `heuristics` each side lays every kernel out with its own hand-coded heuristics instead of the recorded
  opts, so a change to the heuristics shows too (on a database `replay record` made, whose opts are the
  heuristics')."""
  path, tree = path or db_path(), tree or code_tree()
  kernels = {k["key"]: k for k in recorded(path)}
  with worktree(tree, against) as old_tree: old = regenerate_in(old_tree, path, heuristics=heuristics)
  new = regenerate_in(tree, path, heuristics=heuristics)
  changed, errors = [], []
  for key, k in kernels.items():
    a, b = old.get(key, {"src": None, "error": "missing"}), new.get(key, {"src": None, "error": "missing"})
    if a["error"] or b["error"]: errors.append({**k, "old_error": a["error"], "new_error": b["error"]})  # not comparable
    elif a["src"] != b["src"]: changed.append({**k, "old": a["src"], "new": b["src"], "old_opts": a.get("opts"), "new_opts": b.get("opts")})
  return {"against": against, "total": len(kernels), "changed": changed, "errors": errors, "heuristics": heuristics}

def format_diff(res: dict[str, Any], max_lines: int = 0) -> str:
  """A unified diff per changed kernel (at most max_lines lines each when > 0), then the count."""
  out = []
  for c in res["changed"]:
    head = f"{c['name']} on {c['device']} (opts {c['opts']})" if not res.get("heuristics") else \
           f"{c['name']} on {c['device']} (opts {c['old_opts'] or '(none)'} -> {c['new_opts'] or '(none)'})"
    lines = list(difflib.unified_diff(c["old"].splitlines(), c["new"].splitlines(), f"{res['against']}: {head}", f"working tree: {head}", lineterm=""))
    if max_lines and len(lines) > max_lines: lines = lines[:max_lines] + [f"... ({len(lines) - max_lines} more diff lines)"]
    out += lines
  groups: dict[tuple, list[str]] = {}
  for e in res["errors"]: groups.setdefault((e["old_error"], e["new_error"]), []).append(f"{e['name']} on {e['device']}")
  for (old_e, new_e), names in groups.items():
    out.append(f"{len(names)} kernel(s) not comparable (at {res['against']}: {old_e or 'ok'}; working tree: {new_e or 'ok'}), "
               f"e.g. {', '.join(names[:3])}")
  out.append(f"process replay: {len(res['changed'])} of {res['total']} recorded kernels changed against {res['against']}"
             + (f"; {len(res['errors'])} could not be regenerated on one side" if res["errors"] else ""))
  return "\n".join(out)

def record_models(devices: list[str], models: list[str]) -> int:
  """Run one call of each named ONNX model (tilecraft.onnx.zoo.model_names: the light models, ResNet-50,
  SqueezeNet, ..., and the zoo's, MobileNet-v2, ...) on each device, so that its kernels (real model shapes,
  hand-coded opts) are recorded under RUN_PROCESS_REPLAY=1; they compile and run, as a model's do. The number
  of calls made."""
  from tilecraft.onnx import load
  from tilecraft.onnx.zoo import model_and_input, model_names
  unknown = [m for m in models if m not in model_names()]
  if unknown: raise ValueError(f"unknown model(s) {unknown}: the models are {', '.join(model_names())}")
  n = 0
  for name in models:
    model, feed = model_and_input(name)
    for dev in devices:
      load(model, device=dev).run(feed)
      n += 1
  return n

def record_suite(devices: list[str], quick: bool = False) -> int:
  """Render (and so record, under RUN_PROCESS_REPLAY=1) the bench suite's and the fuzz corpus's kernels
  with hand-coded opts on each device; nothing is compiled or run. The number of kernels rendered."""
  import numpy as np
  from tilecraft import Tensor
  from tilecraft.cli.suite import suite
  from tilecraft.codegen.kernel import Kernel
  from tilecraft.device import Device
  from tilecraft.ops import MetaOps
  from tilecraft.testing.corpus import corpus
  asts = []
  for case in suite(quick):
    arrays = case.make_inputs(np.random.default_rng(0))
    asts += [si.ast for si in case.tilecraft_fn(*[Tensor(a) for a in arrays]).schedule() if si.ast.op is MetaOps.KERNEL]
  asts += [e.ast for e in corpus().values()]
  n = 0
  for dev in devices:
    ren = Device[dev].renderer
    for ast in asts:
      Kernel(ast, opts=ren).hand_coded_optimizations().to_program()
      n += 1
  return n

if __name__ == "__main__":
  if len(sys.argv) == 4 and sys.argv[1] in ("regenerate", "regenerate-heuristics"):
    res = regenerate(sys.argv[2], heuristics=sys.argv[1] == "regenerate-heuristics")
    with open(sys.argv[3], "w") as f: json.dump(res, f)
    sys.exit(0)
  print(__doc__)
  sys.exit(2)
