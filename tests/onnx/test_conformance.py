"""The ONNX backend conformance cases through tilecraft.onnx on the default CPU device. Default tier:
one passing case per op (fast); slow tier: every case in conformance_pass.txt must still pass, and every
in-scope case must either pass or raise NotImplementedError (never a wrong answer)."""
from __future__ import annotations
import os
import pytest

import sys

pytest.importorskip("onnx")
HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path: sys.path.insert(0, HERE)
import conformance as C  # noqa: E402  (tests/onnx/conformance.py)

def _passing() -> list[str]:
  with open(os.path.join(HERE, "conformance_pass.txt")) as f:
    return [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]

PASSING = _passing()

def _one_per_op() -> list[str]:
  seen, out = set(), []
  for n in PASSING:
    if "expanded" in n: continue
    op = C.primary_op(n)
    if op not in seen:
      seen.add(op)
      out.append(n)
  return out

@pytest.mark.parametrize("name", _one_per_op())
def test_case_fast(name: str) -> None:
  status, msg = C.run_case(name)
  assert status == "pass", msg

@pytest.mark.slow
@pytest.mark.parametrize("name", PASSING)
def test_case_passes(name: str) -> None:
  status, msg = C.run_case(name)
  assert status == "pass", msg

@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(n for n in C.all_cases() if C.scope(n)[0] != "out" and n not in set(PASSING)))
def test_case_never_wrong(name: str) -> None:
  status, msg = C.run_case(name)
  assert status in ("pass", "unsupported"), msg
