"""The onnx package's nine light models (seeded random weights, tilecraft.onnx.light) against
onnxruntime: the logits (the final Softmax's input) and the probabilities match within rtol 1e-3, on the
default CPU device and on LLVM (every model), and on OPENCL and on PYTHON under EMULATE=CUDA (the GPU
emulator with the CUDA renderer's limits and vector types: SqueezeNet, ShuffleNet). Each is run twice
on two inputs: the second call reruns the graph built by the first. Slow tier: each model compiles tens
of kernels. (A device that can't be opened skips, or fails in CI: tests/conftest.py.) Also: the kernels of a
model's call, recorded as they are built, pass the fuzzer (SqueezeNet on CPU in the default tier)."""
from __future__ import annotations
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from tilecraft import Context, Device  # noqa: E402
from tilecraft.onnx import load  # noqa: E402
from tilecraft.onnx.light import light_input, light_model, light_model_names  # noqa: E402
from onnx_checks import check_matches_onnxruntime as check_model  # noqa: E402

NAMES = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet", "vgg19", "zfnet512"]
CASES = [(n, None) for n in NAMES] + [(n, "LLVM") for n in NAMES] + [(n, "OPENCL") for n in ("shufflenet", "squeezenet")]
EMULATED = ["shufflenet", "squeezenet"]  # on PYTHON under EMULATE=CUDA: ~5-10 s an inference on 2 cores

def check_matches_onnxruntime(name: str, device: str | None) -> None:
  """Model `name` on `device` gives onnxruntime's outputs for two inputs (the second reruns the built graph)."""
  assert name in light_model_names()
  check_model(light_model(name, seed=0), lambda m, seed: light_input(m, seed=seed), device, name)

@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name,device", CASES, ids=[f"{n}-{d or 'CPU'}" for n, d in CASES])
def test_light_model_matches_onnxruntime(name: str, device: str | None) -> None:
  check_matches_onnxruntime(name, device)

@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", EMULATED)
def test_light_model_on_emulated_cuda_matches_onnxruntime(name: str) -> None:
  """Every kernel runs in the PYTHON emulator (bounds, race and barrier checks on) as rendered for CUDA's limits."""
  with Context(EMULATE="CUDA"):
    assert Device["PYTHON"].renderer.target == "CUDA"
    check_matches_onnxruntime(name, "PYTHON")

@pytest.mark.fuzz
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name,device", [("squeezenet", "CPU"), pytest.param("shufflenet", "LLVM", marks=pytest.mark.slow)])
def test_light_model_kernels_fuzzed(name: str, device: str, tmp_path, monkeypatch) -> None:
  """Every distinct kernel of the model's call, recorded as it is built (process replay), passes the fuzzer
  (tilecraft.testing.fuzz.fuzz_recorded): its hand-coded opts and 2 random opt lists against its unoptimized
  kernel. SqueezeNet on CPU (~10 s) is in the default tier; `tilecraft fuzz --replay` runs the same on any
  recorded model (docs/architecture.md)."""
  from tilecraft.engine import plan_cache
  from tilecraft.testing import fuzz
  db = str(tmp_path / "replay.db")
  monkeypatch.setenv("REPLAY_DB", db)
  monkeypatch.setenv("RUN_PROCESS_REPLAY", "1")
  plan_cache.clear()  # (kernels built earlier in this process would not be rendered, so not recorded)
  m = light_model(name, seed=0)
  load(m, device).run(light_input(m))
  monkeypatch.setenv("RUN_PROCESS_REPLAY", "0")
  assert len(fuzz.recorded_kernels(db, device)) >= 15
  reps = fuzz.fuzz_recorded(db, device, n=2, seed=3)
  bad = {k: r.summary() for k, r in reps.items() if not r.ok}
  assert not bad, bad

@pytest.mark.fuzz
def test_fuzz_cli_models(capsys) -> None:
  """`tilecraft fuzz --models M`: one call of the model recorded into a temporary DB, its kernels fuzzed."""
  from tilecraft.__main__ import main
  from tilecraft.engine import plan_cache
  import os
  plan_cache.clear()  # (kernels built earlier in this process would not be rendered, so not recorded)
  env = {k: os.environ.get(k) for k in ("REPLAY_DB", "RUN_PROCESS_REPLAY")}
  assert main(["fuzz", "--models", "squeezenet", "-n", "0", "--quiet"]) == 0
  assert {k: os.environ.get(k) for k in env} == env  # (recording is switched off again afterwards)
  out = capsys.readouterr().out
  assert "kernels of squeezenet's call on CPU" in out and "no unexpected failures" in out
  assert main(["fuzz", "--models", "nosuch"]) == 2 and "unknown model" in capsys.readouterr().err
