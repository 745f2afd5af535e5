"""`tilecraft tune`'s planning: which kernels become tasks. (The searches themselves: tests/cli/test_cli.py
runs the command, tests/engine/test_tune_ray.py runs tasks on Ray.)"""
from __future__ import annotations
import argparse, pickle
import numpy as np
import pytest
from tilecraft.cli import CLIError
from tilecraft.cli.tune import _bench_tasks, _model_tasks

onnx = pytest.importorskip("onnx", reason="onnx is not installed (pip install 'tilecraft[onnx]')")
from onnx import TensorProto, helper  # noqa: E402

def _args(**kw) -> argparse.Namespace:
  return argparse.Namespace(**{"beam": 2, "budget": 5.0, "quick": True, "only": None, "model": None, **kw})

def _model(path: str) -> str:
  """Softmax of two inputs of the same shape (the same kernels twice), and a MatMul."""
  w = helper.make_tensor("w", TensorProto.FLOAT, [16, 8], np.random.default_rng(0).standard_normal(128).astype(np.float32))
  nodes = [helper.make_node("Softmax", ["x"], ["y1"], axis=-1), helper.make_node("Softmax", ["z"], ["y2"], axis=-1),
           helper.make_node("MatMul", ["x", "w"], ["y3"])]
  ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 16]) for n in ("x", "z")]
  outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in (("y1", [4, 16]), ("y2", [4, 16]), ("y3", [4, 8]))]
  g = helper.make_graph(nodes, "g", ins, outs, [w])
  onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
  return path

def test_a_models_distinct_kernels_become_tasks(tmp_path):
  tasks, n_nodes = _model_tasks(_args(model=_model(str(tmp_path / "m.onnx"))), "CPU")
  assert n_nodes == 3
  keys = [pickle.loads(t.ast).key for t in tasks]
  assert len(set(keys)) == len(keys)  # each distinct kernel once
  # the schedule runs the softmax's kernels twice (once per input): each is one task
  import tilecraft.onnx as tonnx
  from tilecraft.helpers import Context
  m = tonnx.load(str(tmp_path / "m.onnx"), "CPU")
  with Context(BEAM=0): m.run({"x": np.ones((4, 16), np.float32), "z": np.zeros((4, 16), np.float32)})
  scheduled = [si.ast.key for si in list(m._captures.values())[-1].schedule]
  assert sorted(keys) == sorted(set(scheduled)) and len(scheduled) > len(keys)
  assert all(t.device == "CPU" and t.beam == 2 and t.budget_s == 5.0 and t.label == "m.onnx" for t in tasks)
  with pytest.raises(CLIError, match="no such file"): _model_tasks(_args(model=str(tmp_path / "none.onnx")), "CPU")

def test_bench_kernels_are_planned_once_each():
  tasks, n = _bench_tasks(_args(only=["sum_64K", "elementwise"]), "CPU")
  assert n == 2 and len(tasks) == len({pickle.loads(t.ast).key for t in tasks}) >= 2

@pytest.mark.slow
def test_tune_on_a_local_ray_fills_the_search_cache(tmp_path):
  """`tilecraft tune --ray` end to end: a local Ray instance, the results in the driver's search cache, Ray stopped after."""
  import os, subprocess, sys
  pytest.importorskip("ray", reason="ray is not installed (pip install 'tilecraft[ray]')")
  from tilecraft.engine.search.db import read_results
  db = str(tmp_path / "search.db")
  env = {**os.environ, "CACHEDB": db, "NO_COLOR": "1", "RAY_USAGE_STATS_ENABLED": "0"}
  for k in ("DEBUG", "NOOPT", "BEAM", "DEVICE"): env.pop(k, None)
  r = subprocess.run([sys.executable, "-m", "tilecraft", "tune", "--quick", "-k", "sum_64K", "--beam", "1", "--budget", "2", "--quiet", "--ray"],
                     env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stdout + r.stderr
  assert "on Ray (local instance)" in r.stdout and "sum_64K" in r.stdout
  n = int(r.stdout.split(" distinct kernels")[0].rsplit(" ", 1)[1])
  assert n >= 1 and len(read_results(db)) == n
