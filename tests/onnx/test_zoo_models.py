"""tilecraft.onnx.zoo's models (built with onnx.helper: a BERT-style encoder, MobileNet-v2, EfficientNet-B0) against
onnxruntime within rtol 1e-3, two inputs each (the second call reruns the built graph): on the default CPU device in
the default tier (each compiles 40-120 kernels, a few seconds cold), on LLVM in the slow tier."""
from __future__ import annotations
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from tilecraft.onnx import load  # noqa: E402
from tilecraft.onnx.zoo import zoo_input, zoo_model, zoo_model_names  # noqa: E402
from onnx_checks import check_matches_onnxruntime as check_model  # noqa: E402

NAMES = ["bert_like", "mobilenet_v2", "efficientnet_b0"]

def test_zoo_lists_its_models_and_names_an_unknown_one() -> None:
  assert zoo_model_names() == NAMES
  with pytest.raises(ValueError, match="unknown zoo model 'resnet9'.*mobilenet_v2"): zoo_model("resnet9")

def check_matches_onnxruntime(name: str, device: str | None) -> None:
  check_model(zoo_model(name, seed=0), lambda m, seed: zoo_input(m, seed=seed), device, name)

@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", NAMES)
def test_zoo_model_matches_onnxruntime(name: str) -> None:
  check_matches_onnxruntime(name, None)

@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name", NAMES)
def test_zoo_model_on_llvm_matches_onnxruntime(name: str) -> None:
  check_matches_onnxruntime(name, "LLVM")

def test_bert_like_at_another_size_takes_inputs_of_its_shape() -> None:
  """zoo_input reads the graph's declared input (sequence length) and vocabulary, so a bert_like of
  another size runs with inputs it accepts, and matches onnxruntime."""
  from tilecraft.onnx.zoo import bert_like
  m = bert_like(seq=48, hidden=64, heads=2, ffn=128, vocab=300, layers=1)
  inp = zoo_input(m)
  assert inp["input_ids"].shape == (1, 48) and inp["input_ids"].max() < 300
  check_model(m, lambda mm, seed: zoo_input(mm, seed=seed), None, "bert_like 48x64")
