"""The launch property, checked on the PYTHON device's emulated GPU targets: an opt list `apply_opt`
accepts never fails at launch (threads per workgroup, local and global dims, local memory). The
programs are rendered and compiled with the fuzzer's program cache (fuzz.get_program), and only the
launch's checks run: nothing is executed, so big kernels are cheap (tests/testing/test_launch_limits.py)."""
from __future__ import annotations
from typing import Optional, Sequence
from tilecraft.codegen.kernel import Kernel, Opt
from tilecraft.device import Device
from tilecraft.dtype import DType, dtypes
from tilecraft.helpers import Context
from tilecraft.ops import LazyOp
from tilecraft.testing.fuzz import _seeded, get_program, get_runner
from tilecraft.testing.opt_sampler import grow_opts


def launch_error(ast: LazyOp, opts: Sequence[Opt], tc_use: int = 0, var_vals: Optional[dict] = None,
                 kernel: Optional[Kernel] = None) -> Optional[str]:
  """Render and compile `ast` with `opts` for the PYTHON device's current EMULATE target and make the
  checks its launch makes before running anything (threads per workgroup, local and global dims,
  local memory): the launch's error message, or None. Nothing is executed, so big kernels are cheap."""
  from tilecraft.runtime.emulate import EmulatorError, check_launch
  with Context(TC=tc_use) if tc_use else Context():
    p = get_program(ast, opts, "PYTHON", kernel=kernel)
  r = get_runner(p)
  gs, ls = p.launch_dims(var_vals or {})
  try: check_launch(r.clprg.exe, gs, ls, r.clprg.limits)
  except EmulatorError as e: return str(e)
  return None

def launch_kernels() -> dict[str, LazyOp]:
  """Kernels whose opts can reach the emulated targets' limits: a grouped reduce whose output dtype
  is narrower than its reduce (bool of a float sum, half of a float sum), and matmuls for each
  target's tensor cores (half -> float on CUDA/AMD/Metal, float on Metal) large enough for TC use 3's
  staging to pass 32-64 KB."""
  from tilecraft.ops import BinaryOps, ReduceOps, UnaryOps
  from tilecraft.testing.corpus import ST, alu, cast, const, kernel as kern, ld, red, store
  def rowsum(rows: int, cols: int) -> LazyOp: return red(ReduceOps.SUM, ld(1, dtypes.float32, ST((rows, cols))), (1,))
  def matmul(m: int, n: int, k: int, din: DType, dout: DType) -> LazyOp:
    a = ST((m, k)).reshape((m, 1, k)).expand((m, n, k))
    b = ST((k, n)).permute((1, 0)).reshape((1, n, k)).expand((m, n, k))
    opnd = (lambda x: x) if din == dout else (lambda x: cast(x, dout))
    return kern(store(0, dout, ST((m, n, 1)), red(ReduceOps.SUM, alu(BinaryOps.MUL, opnd(ld(1, din, a)), opnd(ld(2, din, b))), (2,))))
  return {"bool_of_sum_256x1024": kern(store(0, dtypes.bool, ST((256, 1)), alu(BinaryOps.CMPLT, const(0.0, dtypes.float32, ST((256, 1))), rowsum(256, 1024)))),
          "half_of_sum_128x2048": kern(store(0, dtypes.float16, ST((128, 1)), LazyOp(UnaryOps.CAST, (rowsum(128, 2048),), dtypes.float16))),
          "matmul_half_float_128x128x64": matmul(128, 128, 64, dtypes.float16, dtypes.float32),
          "matmul_float_64x64x32": matmul(64, 64, 32, dtypes.float32, dtypes.float32)}

def launch_errors(kernels: dict[str, LazyOp], n: int, targets: Sequence[str] = ("CUDA", "METAL", "AMD"), seed: int = 0,
                  max_opts: int = 6) -> tuple[list[str], int]:
  """The launch property: for each target and kernel, `n` opt sequences (grow_opts; TC with a random
  use 1-3 where the target has tensor cores) that apply_opt accepts must pass every launch check.
  Returns (failures, sequences checked); reproducible per (seed, target, kernel)."""
  fails: list[str] = []
  checked = 0
  for target in targets:
    with Context(EMULATE=target):
      ren = Device["PYTHON"].renderer
      for name, ast in kernels.items():
        rng = _seeded(seed, target, name, "launch")
        k0 = Kernel(ast, opts=ren)
        for _ in range(n):
          seq = grow_opts(k0, rng, max_opts, tc_use=int(rng.integers(1, 4)))
          if seq.error is not None:
            fails.append(f"{target} {name} {list(seq)} + {seq.error[0]}: {seq.error[1]}")
            continue
          checked += 1
          try: msg = launch_error(ast, list(seq), seq.tc_use, kernel=seq.kernel)  # type: ignore[attr-defined]
          except Exception as e:  # noqa: BLE001  (rendering or compiling an accepted opt list must work too)
            msg = f"{type(e).__name__}: {e}"
          if msg is not None: fails.append(f"EMULATE={target} {name} TC={seq.tc_use} {list(seq)}: {msg}")
  return fails, checked
