"""Process replay (tilecraft.testing.replay, `tilecraft replay`): to_program records what it renders
under RUN_PROCESS_REPLAY=1, and `replay diff --against REV` reports exactly the kernels whose
source differs between REV and the working tree. REV here is the working tree's own code with one
rewrite rule removed, committed in a temporary git worktree."""
from __future__ import annotations
import contextlib, io, os, shutil, subprocess
import pytest
from tilecraft.__main__ import main
from tilecraft.codegen import lowerer, replay_record, rewrite
from tilecraft.codegen.kernel import Kernel, Opt, OptOps
from tilecraft.device import Device
from tilecraft.testing import replay
from tilecraft.testing.corpus import corpus

def _git_checkout() -> bool:
  if shutil.which("git") is None: return False
  r = subprocess.run(["git", "-C", replay.code_tree(), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
  return r.returncode == 0 and os.path.samefile(r.stdout.strip(), replay.code_tree())

pytestmark = pytest.mark.skipif(not _git_checkout(), reason="needs git and a git checkout of tilecraft")

# Appended to codegen/rewrite.py in REV, and run here on a copy of the module to know what must change:
# the folding of scalar ALUs over constants is gone.
DROP_RULE = '''
assert sum(f is _fold_alu for _, f in constant_folding.rules) == 1, "the replay test expects one _fold_alu rule"
constant_folding = PatternMatcher([r for r in constant_folding.rules if r[1] is not _fold_alu])
symbolic_rules = constant_folding + algebraic
'''

# Appended to codegen/heuristic.py in REV2: no hand-coded opts at all.
NO_HEURISTICS = '''
def hand_coded_optimizations(k):
  return k
'''

NAMES = ["ew_7", "ew_permute_7x25x49", "matmul_16x16x16", "matmul_7x25x49", "pad_2d_5x7", "conv_1x4x8x8_w3x3x3_s1_p1", "sum_axis1_5x7x9",
         "idiv_mod_const_int32", "shrink_flip_stride_pad_8x12", "arith_float", "pad_reduce_exp2_5x7", "sym_ew_nx7"]
OPTS = {"matmul_16x16x16": [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 4)], "pad_2d_5x7": [Opt(OptOps.UPCAST, 0, 0)]}

def _render_all() -> dict[str, str]:
  ren, out = Device["CPU"].renderer, {}
  for name in NAMES:
    k = Kernel(corpus()[name].ast, opts=ren)
    if name in OPTS:
      for o in OPTS[name]: k.apply_opt(o)
    else: k = k.hand_coded_optimizations()
    out[name] = k.to_program(name_override=f"replay_{name}").src
  return out

def test_replay_diff_reports_exactly_the_changed_kernels(tmp_path, monkeypatch):
  db = str(tmp_path / "replay.db")
  monkeypatch.setenv("REPLAY_DB", db)
  monkeypatch.setenv("RUN_PROCESS_REPLAY", "1")
  srcs = _render_all()
  monkeypatch.setenv("RUN_PROCESS_REPLAY", "0")
  rows = replay.recorded(db)
  assert sorted(r["name"] for r in rows) == sorted(f"replay_{n}" for n in NAMES)
  assert all(r["src"] == srcs[r["name"][len("replay_"):]] for r in rows) and all("CRenderer" in r["renderer"] for r in rows)
  # what must change: render again here with the rule dropped from a copy of the rewrite module
  ns = dict(vars(rewrite))
  exec(DROP_RULE, ns)
  with monkeypatch.context() as m:
    m.setattr(lowerer, "symbolic_rules", ns["symbolic_rules"])
    dropped = _render_all()
  expected = {f"replay_{n}" for n in NAMES if dropped[n] != srcs[n]}
  assert 0 < len(expected) < len(NAMES), f"the rule should change some kernels but not all: {sorted(expected)}"
  # REV: the working tree's code with the rule dropped, committed in a temporary worktree
  tree = replay.code_tree()
  with replay.worktree(tree, "HEAD") as wt:
    shutil.rmtree(os.path.join(wt, "tilecraft"))
    shutil.copytree(os.path.join(tree, "tilecraft"), os.path.join(wt, "tilecraft"), ignore=shutil.ignore_patterns("__pycache__"))
    with open(os.path.join(wt, "tilecraft", "codegen", "rewrite.py"), "a") as f: f.write(DROP_RULE)
    git = ["git", "-C", wt, "-c", "user.name=replay-test", "-c", "user.email=replay-test@localhost", "-c", "commit.gpgsign=false"]
    subprocess.run(git + ["add", "-A", "tilecraft"], check=True, capture_output=True)
    subprocess.run(git + ["commit", "-q", "--no-verify", "-m", "replay test: drop one rewrite rule"], check=True, capture_output=True)
    rev = subprocess.run(["git", "-C", wt, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    out = io.StringIO()
    with contextlib.redirect_stdout(out): assert main(["replay", "diff", "--against", rev, "--db", db]) == 0
    # REV2: the rule back, and no hand-coded heuristics: the recorded opts hide that; --heuristics shows it, per kernel
    shutil.copyfile(os.path.join(tree, "tilecraft", "codegen", "rewrite.py"), os.path.join(wt, "tilecraft", "codegen", "rewrite.py"))
    with open(os.path.join(wt, "tilecraft", "codegen", "heuristic.py"), "a") as f: f.write(NO_HEURISTICS)
    subprocess.run(git + ["commit", "-q", "-a", "--no-verify", "-m", "replay test: no heuristics"], check=True, capture_output=True)
    rev2 = subprocess.run(["git", "-C", wt, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    plain, heur = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(plain): assert main(["replay", "diff", "--against", rev2, "--db", db, "--names"]) == 0
    with contextlib.redirect_stdout(heur): assert main(["replay", "diff", "--against", rev2, "--db", db, "--names", "--heuristics"]) == 0
  assert f"process replay: 0 of {len(NAMES)} recorded kernels changed against {rev2}" in plain.getvalue(), plain.getvalue()
  tiled = {n: " ".join(f"{o.op.name}{o.axis},{o.amt}" for o in Kernel(corpus()[n].ast, opts=Device["CPU"].renderer).hand_coded_optimizations().applied_opts)
           for n in NAMES}
  lines = {line.split(" on CPU")[0]: line for line in heur.getvalue().splitlines() if " on CPU: " in line}
  assert set(lines) == {f"replay_{n}" for n, opts in tiled.items() if opts} and len(lines) >= 3, heur.getvalue()
  assert all(lines[f"replay_{n}"].endswith(f": (none) -> {tiled[n]}") for n in NAMES if tiled[n]), heur.getvalue()
  text = out.getvalue()
  reported = {line.split(": ", 1)[1].split(" on CPU")[0] for line in text.splitlines() if line.startswith("+++ working tree: ")}
  assert reported == expected, text
  assert f"process replay: {len(expected)} of {len(NAMES)} recorded kernels changed against {rev}" in text
  # each diff shows the difference: the rule's folded constants on the working-tree side
  assert text.count("\n@@ ") >= len(expected)

def test_recording_never_breaks_rendering(tmp_path, monkeypatch):
  """A database that can't be written is one warning; the kernel still renders."""
  blocker = tmp_path / "file"
  blocker.write_text("x")
  monkeypatch.setenv("REPLAY_DB", str(blocker / "sub" / "replay.db"))  # a directory under a file
  monkeypatch.setenv("RUN_PROCESS_REPLAY", "1")
  monkeypatch.setattr(replay_record, "_warned", False)
  k = Kernel(corpus()["ew_7"].ast, opts=Device["CPU"].renderer)
  with pytest.warns(RuntimeWarning, match="process replay: could not record"): p = k.to_program()
  assert "void" in p.src

def test_replay_cli_errors(tmp_path, capsys):
  assert main(["replay", "diff", "--db", str(tmp_path / "none.db")]) == 2
  assert "no replay database" in capsys.readouterr().err

def test_replay_records_a_models_kernels(tmp_path, monkeypatch, capsys):
  """`replay record --models M` also records the kernels one call of a light ONNX model runs (here a
  tiny stand-in for the light models: a conv and a relu); an unknown name is refused before anything
  is recorded."""
  pytest.importorskip("onnx")
  import numpy as np
  from onnx import TensorProto, helper, numpy_helper
  from tilecraft.onnx import light
  w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
  graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])], "tiny",
                            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 9])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 9, 9])], [w])
  model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
  monkeypatch.setattr(light, "light_model_names", lambda: ["tiny"])
  monkeypatch.setattr(light, "light_model", lambda name, seed=0, logits=True: model)
  monkeypatch.setattr(light, "light_input", lambda m, seed=0: {"x": np.ones((1, 3, 9, 9), np.float32)})
  monkeypatch.setattr(replay, "record_suite", lambda devices, quick=False: 0)  # (the suite's own recording is tested above)
  db = str(tmp_path / "replay.db")
  monkeypatch.setenv("REPLAY_DB", db)  # (the command sets both: restored after the test)
  monkeypatch.setenv("RUN_PROCESS_REPLAY", "0")
  assert main(["replay", "record", "--device", "CPU", "--models", "tiny,bogus", "--db", db]) == 2
  assert "unknown model(s) ['bogus']" in capsys.readouterr().err and not os.path.exists(db)
  assert main(["replay", "record", "--device", "CPU", "--models", "tiny", "--db", db]) == 0
  rows = replay.recorded(db)
  assert any(r["name"].startswith("r_") and "CRenderer" in r["renderer"] for r in rows), [r["name"] for r in rows]

# ---- the settings that change the source are recorded and restored (issue 27 item 6) -------------

def test_replay_restores_the_recorded_settings(tmp_path, monkeypatch):
  """A kernel recorded under TC=3 (PYTHON, EMULATE=CUDA: tensor-core layout emulated through local
  memory, no WMMA) and one recorded under CPU_ARCH=haswell regenerate to the very same source in a
  replay process where TC=1 and another CPU_ARCH are in force."""
  import platform
  import numpy as np
  from tilecraft.dtype import dtypes
  from tilecraft.helpers import Context
  from tilecraft.testing.tc_cases import matmul
  db = str(tmp_path / "replay.db")
  monkeypatch.setenv("REPLAY_DB", db)
  monkeypatch.setenv("RUN_PROCESS_REPLAY", "1")
  monkeypatch.delenv("TC", raising=False)
  monkeypatch.delenv("CPU_ARCH", raising=False)
  srcs = {}
  ast = matmul(np.random.default_rng(0), 64, 64, 64, dtypes.float16, dtypes.float32)[0]
  with Context(EMULATE="CUDA", TC=3):
    k = Kernel(ast, opts=Device["PYTHON"].renderer).hand_coded_optimizations()
    assert k.use_tensor_cores == 3
    srcs["tc3"] = k.to_program(name_override="replay_tc3").src
  with Context(EMULATE="CUDA", TC=1): assert "WMMA" in Kernel(ast, opts=Device["PYTHON"].renderer).hand_coded_optimizations().to_program().src
  assert "WMMA" not in srcs["tc3"]
  x86 = platform.machine() in ("x86_64", "AMD64")
  if x86:
    cpu_ast = corpus()["matmul_16x16x16"].ast
    def cpu_src(arch: str, name: str) -> str:
      with Context(CPU_ARCH=arch): return Kernel(cpu_ast, opts=Device["CPU"].renderer).hand_coded_optimizations().to_program(name_override=name).src
    srcs["haswell"] = cpu_src("haswell", "replay_haswell")
    monkeypatch.setenv("RUN_PROCESS_REPLAY", "0")
    assert cpu_src("x86-64", "replay_haswell") != srcs["haswell"], "the kernel should render differently for another CPU_ARCH"
  monkeypatch.setenv("RUN_PROCESS_REPLAY", "0")
  rows = {r["name"]: r for r in replay.recorded(db)}
  # regenerate in a process of its own (the replay's way) with other settings in force
  monkeypatch.setenv("TC", "1")
  monkeypatch.setenv("CPU_ARCH", "x86-64")
  out = replay.regenerate_in(replay.code_tree(), db)
  for name, src in srcs.items():
    got = out[rows[f"replay_{name}"]["key"]]
    assert got["error"] is None and got["src"] == src, f"{name}: {got['error'] or 'the regenerated source differs'}"
  # `replay list` shows them
  buf = io.StringIO()
  with contextlib.redirect_stdout(buf): assert main(["replay", "list", "--db", db]) == 0
  assert "TC=3" in buf.getvalue() and (not x86 or "CPU_ARCH=haswell" in buf.getvalue()), buf.getvalue()
