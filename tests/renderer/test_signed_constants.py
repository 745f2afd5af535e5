"""A negative constant after a minus (cstyle.py render_alu): `x - (-3.75)` and `-(-3.75)` render with the constant in
parentheses. Unparenthesized, "x--3.75f" lexes as x-- 3.75f, and every C-style compiler refuses the kernel (GridSample's
cubic weights built it: a SUB whose right operand folded to a negative constant)."""
from __future__ import annotations
import subprocess
import numpy as np
import pytest
from tilecraft.device import Device
from tilecraft.dtype import dtypes
from tilecraft.ops import BinaryOps, UnaryOps
from tilecraft.renderer.cstyle import OpenCLRenderer
from tilecraft.renderer.cuda import CUDARenderer

@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64])
def test_negative_constant_after_minus_compiles_and_computes(dt, tmp_path) -> None:
  r = Device["CPU"].renderer
  c = r.render_const(-3 if dtypes.is_int(dt) else -3.75, dt)
  ty = r.render_dtype(dt)
  body = [f"out[0] = {r.render_alu(BinaryOps.SUB, ['x', c], dt, dt)};", f"out[1] = {r.render_alu(UnaryOps.NEG, [c], dt, dt)};",
          f"out[2] = {r.render_alu(BinaryOps.SUB, ['x', r.render_alu(UnaryOps.NEG, ['x'], dt, dt)], dt, dt)};"]
  src = tmp_path / "k.c"
  src.write_text("#include <math.h>\n#include <stdio.h>\n" + f"int main(void) {{ {ty} x = 2; {ty} out[3];\n" + "\n".join(body) +
                 '\nprintf("%g %g %g\\n", (double)out[0], (double)out[1], (double)out[2]); return 0; }\n')
  exe = tmp_path / "k"
  cc = subprocess.run(["gcc", "-O1", "-o", str(exe), str(src), "-lm"], capture_output=True, text=True)
  assert cc.returncode == 0, cc.stderr + src.read_text()
  got = [float(v) for v in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
  k = 3 if dtypes.is_int(dt) else 3.75
  np.testing.assert_array_equal(got, [2 + k, k, 4])

@pytest.mark.parametrize("ren", [OpenCLRenderer(), CUDARenderer()], ids=["opencl", "cuda"])
def test_gpu_renderers_parenthesize_too(ren) -> None:
  c = ren.render_const(-0.5, dtypes.float32)
  assert "--" not in ren.render_alu(BinaryOps.SUB, ["x", c], dtypes.float32, dtypes.float32)
  assert "--" not in ren.render_alu(UnaryOps.NEG, [c], dtypes.float32, dtypes.float32)
