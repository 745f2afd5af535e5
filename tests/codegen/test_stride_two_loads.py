"""Stride-2 gathers on a CPU as two vector loads and a shuffle (lowerer.py: _load_stride_two): the rows
of a stride-2 pooling or depthwise conv window. Against numpy, with hand-coded and random opts, with
padding (lanes whose validity differs: masked loads) and without, on CPU (this host's ISA and AVX2)
and LLVM."""
from __future__ import annotations
import numpy as np
import pytest
from tilecraft import Context, Tensor
from tilecraft.codegen.kernel import Kernel
from tilecraft.device import Device
from tilecraft.host import cpu_target, missing_features

def maxpool_ref(x: np.ndarray, k: int, s: int, p: int) -> np.ndarray:
  xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)), constant_values=-np.inf)
  oh, ow = (xp.shape[2] - k) // s + 1, (xp.shape[3] - k) // s + 1
  return np.max([xp[:, :, i:i + s * oh:s, j:j + s * ow:s] for i in range(k) for j in range(k)], axis=0)

def depthwise_ref(x: np.ndarray, w: np.ndarray, s: int, p: int) -> np.ndarray:
  xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p, p), (p, p)))
  k = w.shape[-1]
  oh, ow = (xp.shape[2] - k) // s + 1, (xp.shape[3] - k) // s + 1
  return sum(xp[:, :, i:i + s * oh:s, j:j + s * ow:s] * w[None, :, 0, i, j, None, None] for i in range(k) for j in range(k))

CASES = [("maxpool", 17, 0), ("maxpool", 23, 1), ("depthwise", 16, 1), ("depthwise", 21, 1), ("depthwise", 30, 0)]

def build(kind: str, hw: int, pad: int, rng: np.random.Generator, device: str) -> tuple:
  x = rng.standard_normal((1, 6, hw, hw)).astype(np.float32)
  if kind == "maxpool": return Tensor(x, device).max_pool2d(3, 2, pad), maxpool_ref(x, 3, 2, pad)
  w = rng.standard_normal((6, 1, 3, 3)).astype(np.float32)
  return Tensor(x, device).conv2d(Tensor(w, device), stride=2, padding=pad, groups=6), depthwise_ref(x, w, 2, pad)

@pytest.mark.parametrize("arch", ["native", "haswell"])
@pytest.mark.parametrize("kind,hw,pad", CASES)
def test_stride_two_windows_match_numpy(kind: str, hw: int, pad: int, arch: str, rng: np.random.Generator) -> None:
  with Context(CPU_ARCH=arch):
    if missing_features(cpu_target()): pytest.skip(f"this host can't run {arch}")
    t, want = build(kind, hw, pad, rng, "CPU")
    si = t.schedule()[-1]
    k = Kernel(si.ast, Device["CPU"].renderer).hand_coded_optimizations()
    src = k.to_program().src
    if kind == "maxpool" and hw >= 23: assert "[0],val" in src and "[2],val" in src, "the stride-2 rows load as two vectors and a shuffle"
    np.testing.assert_allclose(t.numpy(), want, rtol=1e-5, atol=1e-5)

@pytest.mark.parametrize("arch", ["native", "haswell"])
def test_a_stride_two_half_whose_lanes_are_all_valid_is_a_plain_load(arch: str, rng: np.random.Generator) -> None:
  """A padded row's stride-2 window (SqueezeNet's 3x3 s2 max-pool to 55-wide rows, padded to 56): the half of the
  gather whose elements are all valid in every step is a plain vector load, not a masked one with an all-true mask
  (AVX2's vmaskmov costs more than a load, and gcc doesn't fold the constant mask away: the pool 1.19x faster); only
  the half that reaches the padded lane stays masked."""
  x = rng.standard_normal((1, 4, 111, 111)).astype(np.float32)
  with Context(CPU_ARCH=arch):
    t = Tensor(x).max_pool2d(3, 2)
    src = Kernel(t.schedule()[-1].ast, Device["CPU"].renderer).hand_coded_optimizations().to_program().src
    loads = [ln for ln in src.splitlines() if " val" in ln and "data1" in ln]
    plain, masked = [ln for ln in loads if "tc_mload" not in ln], [ln for ln in loads if "tc_mload" in ln]
    assert len(masked) == 3 and len(plain) > 3, loads  # (the last vector's half that reaches lane 55, one per tap of the window row)
    if not missing_features(cpu_target()): np.testing.assert_allclose(t.numpy(), maxpool_ref(x, 3, 2, 0), rtol=1e-6)

@pytest.mark.parametrize("device", ["CPU", "LLVM"])
@pytest.mark.parametrize("kind,hw,pad", CASES[1:4])
def test_stride_two_windows_random_opts(kind: str, hw: int, pad: int, device: str) -> None:
  """Random opts (the fuzzer's sampler) vs the unoptimized kernel and numpy, guard zones included."""
  from tilecraft.testing.corpus_build import CorpusEntry
  from tilecraft.testing.fuzz import check_opts, guarded
  from tilecraft.testing.opt_sampler import random_opts
  rng = np.random.default_rng(hw)
  t, want = build(kind, hw, pad, rng, device)
  from tilecraft.engine.realize import run_schedule
  sched = t.schedule()
  run_schedule(sched[:-1])  # (a padded max-pool's -inf padding is its own kernel)
  si = sched[-1]
  inputs = {i: b.numpy().copy() for i, b in enumerate(si.bufs) if i >= 1}
  e = CorpusEntry(f"stride2_{kind}", si.ast, lambda r: {i: v.copy() for i, v in inputs.items()}, lambda inp, vv: [want.astype(np.float32)])
  k0 = Kernel(guarded(si.ast), opts=Device[device].renderer)
  for _ in range(5):
    opts = random_opts(k0, rng, max_opts=3)
    assert check_opts(e, list(opts), e.make_inputs(rng), device) is None, opts
