"""NOLOCALS, RAWAST and GRAPHUOPS (issue 27 item 7), as in the reference:
NOLOCALS=1 makes the hand-coded opts (and BEAM's start) use no local axes on targets with workgroups;
RAWAST=1 (with DEBUG>=3) prints each compiled kernel's AST as scheduled besides its optimized AST;
GRAPHUOPS=1 writes a picture of each rendered kernel's UOp graph (graphviz; .svg where `dot` runs)."""
import os, sys
import numpy as np
import pytest
from tilecraft import Tensor
from tilecraft.codegen import graph_uops
from tilecraft.codegen.kernel import Kernel, Opt, OptOps
from tilecraft.device import Device
from tilecraft.helpers import Context
from tilecraft.ops import MetaOps
from tilecraft.testing.corpus import corpus

def _asts(*names):
  return [corpus()[n].ast for n in names]

# ---- NOLOCALS -------------------------------------------------------------------------------------

def _half_matmul():
  from tilecraft.dtype import dtypes
  from tilecraft.testing.tc_cases import matmul
  return matmul(np.random.default_rng(0), 64, 64, 64, dtypes.float16, dtypes.float32)[0]

@pytest.mark.parametrize("name", ["matmul_16x16x16", "softmax_stats_6x40", "conv_1x4x8x8_w3x3x3_s1_p1", "tc"])
def test_nolocals_heuristics_use_no_local_axes(name):
  """Grouped reduce, one and two local axes, tensor cores: none of them under NOLOCALS=1."""
  ast = _half_matmul() if name == "tc" else corpus()[name].ast
  with Context(EMULATE="CUDA"):
    ren = Device["PYTHON"].renderer
    plain = Kernel(ast, opts=ren).hand_coded_optimizations()
    with Context(NOLOCALS=1): k = Kernel(ast, opts=ren).hand_coded_optimizations()
  assert plain.local_dims + plain.group_for_reduces > 0 and not plain.dont_use_locals  # locals without the setting
  assert (plain.tensor_core is not None) == (name == "tc")
  assert k.applied_opts[0] == Opt(OptOps.NOLOCALS) and k.dont_use_locals
  assert k.local_dims == 0 and k.group_for_reduces == 0 and k.tensor_core is None
  assert k.to_program().local_size is None  # flat global ids: the runtime picks the workgroup

def test_nolocals_is_nothing_without_workgroups():
  with Context(NOLOCALS=1): k = Kernel(corpus()["matmul_16x16x16"].ast, opts=Device["CPU"].renderer).hand_coded_optimizations()
  assert Opt(OptOps.NOLOCALS) not in k.applied_opts and k.applied_opts

def test_nolocals_realize_and_beam_start(monkeypatch):
  """Realizing under NOLOCALS=1 runs right with no local size; a BEAM search starts from NOLOCALS."""
  from tilecraft.engine import realize
  from tilecraft.engine import search
  a = np.arange(24 * 40, dtype=np.float32).reshape(24, 40) / 100
  with Context(NOLOCALS=1):
    out = Tensor(a, device="PYTHON").sum(1).numpy()
  np.testing.assert_allclose(out, a.sum(1), rtol=1e-5)
  starts = []
  def fake_beam(k, bufs, width, **kw):
    starts.append(k)
    return k.copy().hand_coded_optimizations()
  monkeypatch.setattr(search, "beam_search", fake_beam)
  ast = corpus()["matmul_16x16x16"].ast
  with Context(BEAM=1, NOLOCALS=1): k = realize.optimize(Kernel(ast, Device["PYTHON"].renderer))
  assert starts and starts[0].applied_opts == [Opt(OptOps.NOLOCALS)] and k.dont_use_locals and k.local_dims == 0
  with Context(BEAM=1): realize.optimize(Kernel(ast, Device["PYTHON"].renderer))
  assert starts[1].applied_opts == []

def test_nolocals_picks_another_runner():
  """The realize cache keys on NOLOCALS: a kernel compiled without it is not reused under it."""
  from tilecraft.engine import realize
  with Context(NOLOCALS=0): s0 = realize._settings("PYTHON")
  with Context(NOLOCALS=1): s1 = realize._settings("PYTHON")
  assert s0 != s1

# ---- RAWAST ---------------------------------------------------------------------------------------

def test_rawast_prints_the_scheduled_ast(capsys):
  def run(n: int, **settings) -> tuple[str, str]:
    x = Tensor(np.ones((n, 33), np.float32))  # a new shape each time: the kernel is compiled (and printed) anew
    ast = [si.ast for si in (x * 2).sum(1).schedule() if si.ast.op is MetaOps.KERNEL][-1]
    capsys.readouterr()
    with Context(DEBUG=3, **settings): (x * 2).sum(1).realize()
    return capsys.readouterr().out, str(ast)
  out, raw = run(37)
  assert "opts: " in out and raw not in out  # DEBUG=3: the optimized AST and the opts
  out, raw = run(39, RAWAST=1)
  assert raw in out and "opts: " in out
  assert out.index(raw) < out.index("opts: ")

# ---- GRAPHUOPS ------------------------------------------------------------------------------------

def _program(name="matmul_16x16x16", **settings):
  with Context(**settings): return Kernel(corpus()[name].ast, opts=Device["CPU"].renderer).hand_coded_optimizations().to_program(name_override="graph_me")

def test_graphuops_writes_a_picture(tmp_path, capsys):
  pytest.importorskip("graphviz")
  p = _program(GRAPHUOPS=1, GRAPH_DIR=str(tmp_path))
  files = sorted(os.listdir(tmp_path))
  assert "graph_me.uops.dot" in files
  dot = (tmp_path / "graph_me.uops.dot").read_text()
  assert dot.startswith("digraph") and "DEFINE_GLOBAL" in dot and "STORE" in dot and "RANGE" in dot
  assert dot.count("->") >= len(p.uops) - 1  # every UOp but the roots is used by one
  err = capsys.readouterr().err
  assert f"GRAPHUOPS: graph_me -> {tmp_path}" in err
  if graph_uops.shutil.which("dot"): assert "graph_me.uops.svg" in files and (tmp_path / "graph_me.uops.svg").read_text().lstrip().startswith("<")

def test_graphuops_without_dot_writes_the_dot_file(tmp_path, monkeypatch):
  pytest.importorskip("graphviz")
  monkeypatch.setattr(graph_uops.shutil, "which", lambda name: None)
  path = graph_uops.graph_uops(_program().uops, "k", str(tmp_path))
  assert path.endswith("k.uops.dot") and os.path.exists(path)

def test_graphuops_without_graphviz_says_how_to_install(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "graphviz", None)  # import graphviz raises ImportError
  monkeypatch.setattr(graph_uops, "_warned_missing", False)
  with pytest.warns(RuntimeWarning, match=r"pip install 'tilecraft\[graph\]'"): p = _program(GRAPHUOPS=1, GRAPH_DIR=str(tmp_path))
  assert p.src and not os.listdir(tmp_path)  # the kernel still renders

def test_no_picture_by_default(tmp_path):
  _program(GRAPH_DIR=str(tmp_path))
  assert not os.listdir(tmp_path)
