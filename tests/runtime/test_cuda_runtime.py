"""The CUDA device on a real GPU: buffers, launches and timing, and the corpus fuzzed on CUDA against
numpy and the unoptimized kernel. Skipped where CUDA is render + compile-check only (no GPU or no
cuda-python): bench/gpu_check.sh runs these on a GPU machine."""
import numpy as np
import pytest
from tilecraft.codegen.kernel import Kernel, Opt, OptOps
from tilecraft.device import Buffer, CompiledRunner, Device
from tilecraft.dtype import dtypes
from tilecraft.testing import fuzz
from tilecraft.testing.corpus import corpus, known_bug

def _cuda_or_skip():
  if (why := Device["CUDA"].render_only) is not None: pytest.skip(f"CUDA can't run here: {why}")

def test_buffers_and_a_kernel():
  _cuda_or_skip()
  x = np.arange(1000, dtype=np.float32)
  b = Buffer("CUDA", 1000, dtypes.float32).copyin(x)
  assert np.array_equal(b.numpy(), x)
  e = corpus()["sum_axis1_5x7x9"]
  k = Kernel(e.ast, opts=Device["CUDA"].renderer)
  for o in (Opt(OptOps.LOCAL, 1, 9), Opt(OptOps.GROUP, 0, 7)): k.apply_opt(o)
  inputs = fuzz.entry_inputs(e)
  out = fuzz.run_program(e.ast, k.to_program(), inputs, "CUDA")
  assert fuzz.compare_outputs(out, e.reference(inputs, {}), e.ast) is None
  t = CompiledRunner(k.to_program())([Buffer("CUDA", 45, dtypes.float32).allocate(), Buffer("CUDA", 315, dtypes.float32).allocate()])
  assert isinstance(t, float) and 0 < t < 1

@pytest.mark.fuzz
def test_fuzz_corpus_on_cuda():
  _cuda_or_skip()
  total = fuzz.FuzzReport()
  for name, e in corpus().items():
    if known_bug(name, "CUDA", "fuzz"): continue
    rep = fuzz.fuzz_entry(e, 5, "CUDA", seed=1)
    assert rep.ok, f"{name} on CUDA: {rep.summary()}"
    total = total.merge(rep)
  assert total.pairs >= 300, total.summary()
