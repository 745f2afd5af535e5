"""PACK (codegen/pack.py, lowering in codegen/lower_pack.py): kernels that read an input through a
packed stack array compute what numpy and the unpacked kernel compute, masks included; every rule
refuses with KernelOptError and leaves the kernel unchanged; later opts that break a pack are refused."""
import importlib.util, itertools, re
from pathlib import Path
import numpy as np
import pytest
from tilecraft import Context, Tensor
from tilecraft.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tilecraft.codegen.pack import PREFETCH_MIN_BYTES
from tilecraft.codegen.uops import UOps
from tilecraft.device import Buffer, CompiledRunner, Device
from tilecraft.dtype import dtypes
from tilecraft.renderer.cstyle import OpenCLRenderer
from tilecraft.renderer.llvmir import LLVMRenderer
from tilecraft.testing.opt_sampler import _kernel_state

_spec = importlib.util.spec_from_file_location("_tc_bench_common", Path(__file__).resolve().parents[2] / "bench" / "common.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)  # type: ignore[union-attr]

U, R, B, S, P, PAD = OptOps.UPCAST, OptOps.UNROLL, OptOps.BLOCK, OptOps.SWAP, OptOps.PACK, OptOps.PADTO

def kern(ast, seq, ren=None):
  k = Kernel(ast, ren or Device["CPU"].renderer)
  for o in seq: k.apply_opt(Opt(*o))
  return k

def run(k, inputs, out_size):
  out = Buffer("CPU", out_size, dtypes.float32).allocate()
  CompiledRunner(k.to_program())([out] + [Buffer("CPU", a.size, dtypes.float32).copyin(a) for a in inputs])
  return out.numpy()

@pytest.mark.parametrize("seq", [
  [(S, 0, 1), (P, 2, 0)],                                           # no upcasts: scalar pack, the whole reduce
  [(U, 1, 8), (U, 0, 4), (U, 1, 2), (S, 0, 1), (P, 2, 0)],          # the matmul rule's layout: vector pack
  [(U, 1, 8), (U, 0, 4), (B, 0, 16), (S, 0, 1), (P, 2, 0)],         # a block's panel, inside the block loop
  [(U, 1, 4), (B, 0, 8), (P, 2, 0)],                                # refused: B varies along the column loop, inside the block loop
  [(U, 1, 8), (R, 0, 4), (S, 0, 1), (P, 2, 0)],                     # unrolled reduce lanes in the pack
  [(U, 1, 8), (S, 0, 1), (P, 2, 0), (R, 0, 4), (U, 0, 2)],          # opts after PACK re-lay the array
  [(PAD, 2, 32), (S, 0, 1), (P, 2, 0)],                              # padded (masked) reduce: the pack stores 0 there
  [(U, 1, 8), (S, 0, 1), (P, 2, 0), (PAD, 0, 3)],                    # padded column tiles (the scope loop)
  [(U, 1, 8), (S, 0, 1), (P, 2, 0), (PAD, 1, 32)],                   # padded rows (the inner loop): B, broadcast along them, stays unmasked
  [(U, 1, 8), (PAD, 0, 5), (U, 0, 5), (S, 0, 1), (P, 2, 0)],         # the same before the pack, the padded rows upcast (AVX2's 6-row tile)
])
def test_pack_matmul_matches_numpy(seq, rng):
  M, N, K = 24, 32, 48
  a, b = rng.random((M, K), dtype=np.float32), rng.random((K, N), dtype=np.float32)
  ast = bench.matmul_ast(M, N, K)
  try: k = kern(ast, seq)
  except KernelOptError as e:
    assert seq == [(U, 1, 4), (B, 0, 8), (P, 2, 0)] and "varies along output axis" in str(e)
    return
  assert k.packed == (2,)
  assert "pack2[" in k.to_program().src
  np.testing.assert_allclose(run(k, [a, b], M * N).reshape(M, N), a @ b, rtol=1e-4)

def test_pack_conv_weights_and_broadcast_elementwise(rng):
  # conv axes (cout, y, x, cin, ky, kx): the weights don't vary along the y and x loops
  img, w = rng.random((8, 6, 6), dtype=np.float32), rng.random((4, 8, 3, 3), dtype=np.float32)
  k = kern(bench.conv3x3_ast(8, 4, 6, 6), [(U, 2, 2), (R, 2, 0), (P, 2, 0)])
  np.testing.assert_allclose(run(k, [img, w], 4 * 36).reshape(4, 6, 6), bench.numpy_conv3x3(img, w), rtol=1e-4)
  # a broadcast elementwise kernel (out[i, j] = (x[j] + y[i]) * x[j]; buffers x, y, x): the column
  # vector y doesn't vary along the inner (column) loop, x does; the pack has no reduce loop
  x, y = rng.random((1, 16), dtype=np.float32), rng.random((16, 1), dtype=np.float32)
  k = Kernel(((Tensor(x) + Tensor(y)) * Tensor(x)).schedule()[-1].ast, Device["CPU"].renderer)
  k.apply_opt(Opt(U, 1, 4))
  with pytest.raises(KernelOptError, match="varies along output axis 1"): k.apply_opt(Opt(P, 1, 0))
  k.apply_opt(Opt(P, 2, 0))
  assert k.packed == (2,)
  np.testing.assert_allclose(run(k, [x, y, x], 256).reshape(16, 16), (x + y) * x, rtol=1e-6)

@pytest.mark.parametrize("seq", [
  [(U, 2, 8), (U, 1, 4), (S, 1, 2), (P, 2, 0)],                     # k^T per head: packed inside the head loop, per column tile
  [(U, 2, 8), (U, 1, 4), (R, 0, 4), (S, 1, 2), (P, 2, 0)],          # unrolled reduce lanes
  [(U, 2, 8), (PAD, 1, 12), (U, 1, 12), (S, 1, 2), (P, 2, 0)],       # padded rows (the inner loop)
  [(S, 1, 2), (P, 2, 0), (U, 1, 8), (U, 2, 4)],                      # opts after PACK re-lay the array
])
def test_pack_inside_a_batch_loop_matches_numpy(seq, rng):
  """A batched A @ B^T (attention's q @ k^T): B moves along the batch loop and the column loop; with the column loop just
  inside the batch loop, the pack's scope is the column loop (the innermost loop B moves along): the array is refilled for
  each (batch, column tile) and read by every row tile inside it."""
  q, kk = rng.random((3, 20, 24), dtype=np.float32), rng.random((3, 16, 24), dtype=np.float32)
  t = Tensor(q) @ Tensor(kk).transpose(-1, -2)
  ast = [si for si in t.schedule() if si.ast.op.name == "KERNEL"][-1].ast
  k = kern(ast, seq)
  assert k.packed == (2,)
  src = k.to_program().src
  assert "pack2[" in src
  np.testing.assert_allclose(run(k, [q, kk], q.size // 24 * 16).reshape(3, 20, 16), q @ kk.transpose(0, 2, 1), rtol=1e-4)
  # refused where B's innermost loop has no loop inside it: the columns innermost, or the batch innermost
  for bad in ([(U, 2, 8), (P, 2, 0)], [(U, 2, 8), (S, 0, 2), (P, 2, 0)]):
    with pytest.raises(KernelOptError, match="no output loop runs inside"): kern(ast, bad)
  # refused where a loop outside the scope doesn't move the buffer: a conv's weights (moving along cout only) with the
  # image rows outermost, the cout loop inside them: each image row would pack the same tile again
  with pytest.raises(KernelOptError, match="outside the pack's scope"): kern(bench.conv3x3_ast(8, 4, 6, 6), [(S, 0, 1), (P, 2, 0)])

def _tries(k, opt):
  try: k.apply_opt(opt)
  except KernelOptError: return False
  return True

def test_pack_heuristic_matmul_through_tensor(rng):
  a, b = rng.random((64, 512), dtype=np.float32), rng.random((512, 96), dtype=np.float32)
  np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-4)

def test_pack_refusals():
  ast = bench.matmul_ast(16, 32, 64)
  def refused(seq, match, ren=None):
    k = kern(ast, seq[:-1], ren)
    before = _kernel_state(k)
    with pytest.raises(KernelOptError, match=match): k.apply_opt(Opt(*seq[-1]))
    assert _kernel_state(k) == before and k.packed == kern(ast, seq[:-1], ren).packed
  refused([(S, 0, 1), (P, 2, 0)], "CPU", OpenCLRenderer())
  refused([(S, 0, 1), (P, 2, 0)], "stack arrays", LLVMRenderer())
  refused([(S, 0, 1), (P, 0, 0)], "no input buffer 0")    # the output
  refused([(S, 0, 1), (P, 3, 0)], "no input buffer 3")
  refused([(S, 0, 1), (P, 2, 4)], "amount must be 0")
  refused([(S, 0, 1), (P, 2, 0), (P, 2, 0)], "already packed")
  refused([(P, 2, 0)], "varies along output axis 1")      # B moves along the inner (column) loop
  refused([(S, 0, 1), (P, 1, 0)], "varies along output axis 1")
  refused([(S, 0, 1), (P, 2, 0), (S, 0, 1)], "varies along output axis 1")  # a later opt that breaks the pack
  k = kern(bench.matmul_ast(16, 16, 64), [(U, 1, 0)])
  with pytest.raises(KernelOptError, match="no output loop runs inside"): k.apply_opt(Opt(P, 2, 0))  # one loop: nothing reuses the tile  # one output loop: nothing reuses the tile
  big = bench.matmul_ast(4, 4, 1 << 17)  # a 512 KB panel
  k = kern(big, [(S, 0, 1)])
  with pytest.raises(KernelOptError, match="CPU_PACK_MAX_BYTES"): k.apply_opt(Opt(P, 2, 0))
  k.apply_opt(Opt(B, 0, 1024)); k.apply_opt(Opt(P, 2, 0))  # blocked: one block's panel fits


@pytest.mark.parametrize("K,block", [(64, 8), (72, 12), (96, 32)])
def test_pack_blocked_single_output_loop_matches_numpy(K, block, rng):
  """BLOCK with one output loop: the block loop (the pack's scope) runs outside the parallel output loop, so the kernel is
  one OpenMP region in which every thread fills its own private array once per block and shares out the output loop. As
  a plain `parallel for private(pack1)` inside the block loop it read the threads' uninitialized copies (NaN, garbage)."""
  M, N = 32, 49
  a, b = rng.random((M, K), dtype=np.float32) - 0.5, rng.random((K, N), dtype=np.float32) - 0.5
  k = kern(bench.matmul_ast(M, N, K), [(U, 0, 8), (B, 0, block), (U, 0, 4), (P, 1, 0)])
  assert k.packed == (1,)
  src = k.to_program().src
  assert "#pragma omp parallel private(pack1)" in src and "#pragma omp for schedule(static) nowait" in src
  np.testing.assert_allclose(run(k, [a, b], M * N).reshape(M, N), a @ b, rtol=1e-4, atol=1e-5)

_TRANSPOSED = r"\(float(\d+)\)\{val\d+\[0\],val\d+\[0\]"  # a column of a transposed block: lane 0 of the rows' vector loads

_TRANSPOSED_CASES = [  # (M, N, K, opts, transposed: (with 8-float blocks, with 4-float blocks))
  (64, 49, 64, [(U, 0, 16), (PAD, 1, 8), (U, 1, 8), (U, 0, 2), (P, 1, 0)], (True, True)),            # a 1x1 conv's tile (rows of K floats)
  (40, 49, 64, [(PAD, 0, 32), (U, 0, 16), (PAD, 1, 8), (U, 1, 8), (U, 0, 2), (P, 1, 0)], (True, True)),  # padded rows: masked lanes read 0
  (64, 24, 96, [(U, 0, 8), (U, 1, 4), (B, 0, 32), (P, 1, 0)], (True, True)),                         # a BLOCK's panel, inside the block loop
  (32, 24, 30, [(U, 0, 16), (U, 1, 4), (P, 1, 0)], (False, False)),                                  # K not a multiple of the block: lane by lane
  (32, 24, 40, [(PAD, 2, 16), (U, 0, 16), (U, 1, 4), (P, 1, 0)], (True, True)),                      # padded reduce, whole blocks: one gate per block
  (32, 24, 36, [(PAD, 2, 16), (U, 0, 16), (U, 1, 4), (P, 1, 0)], (False, True)),                     # the padding starts inside an 8-block
  (32, 24, 64, [(U, 0, 8), (R, 0, 4), (U, 1, 4), (P, 1, 0)], (False, False)),                        # unrolled reduce lanes: the rows aren't unit-stride
  (12, 24, 64, [(U, 0, 6), (U, 1, 4), (P, 1, 0)], (False, False)),                                   # 6 lanes: not a multiple of the block
  (32, 49, 64, [(U, 0, 8), (B, 0, 8), (U, 0, 4), (P, 1, 0)], (True, True)),                          # one output loop, BLOCK (see above)
  (32, 49, 72, [(U, 0, 8), (B, 0, 12), (U, 0, 4), (P, 1, 0)], (False, True)),
]
# every case on this host's ISA; AVX2 (haswell: 8-float blocks) and SSE (x86-64: 4-float blocks) on the cases where they differ
@pytest.mark.parametrize("arch,M,N,K,seq,transposed", [("native", *c) for c in _TRANSPOSED_CASES] +
                         [(arch, *_TRANSPOSED_CASES[i]) for arch in ("haswell", "x86-64") for i in (1, 5, 9)])
def test_pack_transposed_copy_matches_numpy(arch, M, N, K, seq, transposed, rng):
  """The row operand of A @ B (a 1x1 conv's weights: each upcast row a run of K floats, the array [K][rows]) is copied by
  V x V blocks (V rows' vector loads, V column stores) where that is exact, lane by lane elsewhere; same values either way,
  masked rows and padding stored as 0. On AVX-512, AVX2 (haswell) and SSE (x86-64: 4-float blocks)."""
  a, b = rng.random((M, K), dtype=np.float32) - 0.5, rng.random((K, N), dtype=np.float32) - 0.5
  with Context(CPU_ARCH=arch):
    k = kern(bench.matmul_ast(M, N, K), seq)
    assert k.packed == (1,)
    src = k.to_program().src
    blocks = {int(w) for w in re.findall(_TRANSPOSED, src)}
    width = min(32, 4 * Device["CPU"].renderer.vector_width) // 4  # floats per block
    assert blocks == ({width} if transposed[width == 4] else set()), blocks
    np.testing.assert_allclose(run(k, [a, b], M * N).reshape(M, N), a @ b, rtol=1e-4, atol=1e-5)

def _ranges(u) -> list:
  return list(dict.fromkeys([u] if u.op is UOps.RANGE else [r for x in u.src for r in _ranges(x)]))

def _at(u, env: dict):
  """The value of an index or gate UOp with its loops' counters in env (keyed by the RANGE UOps)."""
  from tilecraft.ops import BinaryOps
  if u.op is UOps.CONST: return u.arg
  if u.op is UOps.RANGE: return env[u]
  x, y = (_at(v, env) for v in u.src)
  return {BinaryOps.ADD: int.__add__, BinaryOps.MUL: int.__mul__, BinaryOps.IDIV: int.__floordiv__, BinaryOps.MOD: int.__mod__, BinaryOps.CMPLT: int.__lt__}[u.arg](x, y)

@pytest.mark.parametrize("blocked,M,K,vectors", [(False, 32, 1024, 4), (True, 32, 1024, 4), (False, 12, 1000, 4), (True, 12, 768, 4), (False, 32, 1024, 1)],
                         ids=["whole panel", "blocked", "3 row tiles", "3 row tiles, blocked", "half-line tiles"])
def test_a_pack_prefetches_the_next_copys_lines_spread_over_the_steps(rng, blocked, M, K, vectors):
  """The loop that reads a packed panel asks (PREFETCH) for the lines the next iteration of the pack's scope loop (the
  next column tile, or the next block under BLOCK) will copy: one hint per 64-byte line of the tile's row (32 floats:
  2), inside the reduce loop, each gated so that over one scope iteration every line of the next copy is asked for
  exactly once (8 row tiles: every 8th step; 3 row tiles of 1000 steps: where row tile x 1000 + step divides by 3).
  Column tiles of 8 floats, half a line: the lines of the tile two later (the next one starts in this one's line).
  None where more than PREFETCH_MAX_REUSE row tiles read each tile (PREFETCH_MAX_REUSE_WHOLE without BLOCK), for the whole panel of a column operand smaller
  than PREFETCH_MIN_BYTES, or with the switch off; the result is the same either way."""
  import tilecraft.codegen.lower_pack as lower_pack
  N = 4096  # (a column operand of at least PREFETCH_MIN_BYTES: 12-16 MB)
  a, b = rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
  seq = [(U, 1, 8), (U, 0, 4)] + ([(U, 1, vectors)] if vectors > 1 else []) + ([(B, 0, 256)] if blocked else []) + [(S, 0, 1), (P, 2, 0)]
  k = kern(bench.matmul_ast(M, N, K), seq)
  src = k.to_program().src
  hints = [u for u in k.uops if u.op is UOps.PREFETCH]
  lines = -(-vectors // 2)  # 8 floats a vector, 16 a line
  assert len(hints) == lines and src.count("__builtin_prefetch(data2") == lines and all(len(h.src) == 3 for h in hints), src
  loops = [u for u in k.uops if u.op is UOps.RANGE]
  assert all(k.uops.index(h) > k.uops.index(loops[-1]) for h in hints)  # in the innermost (reduce) loop
  copy = [u for u in k.uops if u.op is UOps.LOAD and u.src[0].op is UOps.DEFINE_GLOBAL and u.src[0].arg == 2]
  scope = next(r for r in loops if r.arg == (("reduce", 2) if blocked else ("parallel", 0)))
  outer = [r for r in loops if k.uops.index(r) < k.uops.index(scope)]  # (the column tile loop, under BLOCK)
  hint_loops = [r for r in _ranges(hints[0].src[1]) + _ranges(hints[0].src[2]) if r is not scope and r not in outer]
  copy_loops = [r for c in copy for r in _ranges(c.src[1]) if r is not scope and r not in outer]
  assert {r.arg for r in hint_loops} == {("global", 1), ("reduce", 3 if blocked else 2)}, hint_loops  # row tiles x rows
  for fixed in ({r: 0 for r in outer}, {r: 1 for r in outer}):
    for it in (0, 2):  # at scope iteration it, the hints ask for exactly the lines the copy reads at it + 1, each once
      asked: list = []
      for vals in itertools.product(*[range(r.src[1].arg) for r in dict.fromkeys(hint_loops)]):
        env = {scope: it, **fixed, **dict(zip(dict.fromkeys(hint_loops), vals))}
        asked += [_at(h.src[1], env) // 16 for h in hints if _at(h.src[2], env)]
      read = {_at(c.src[1], {scope: it + (2 if vectors == 1 else 1), **fixed, **dict(zip(dict.fromkeys(copy_loops), vals))}) // 16
              for c in copy for vals in itertools.product(*[range(r.src[1].arg) for r in dict.fromkeys(copy_loops)])}
      assert len(asked) == len(set(asked)) and set(asked) == read
  got = run(k, [a, b], M * N).reshape(M, N)
  np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4)
  keep = lower_pack.PREFETCH_NEXT_COPY
  lower_pack.PREFETCH_NEXT_COPY = False
  try:
    k_off = kern(bench.matmul_ast(M, N, K), seq)
    assert "__builtin_prefetch" not in k_off.to_program().src
    np.testing.assert_array_equal(run(k_off, [a, b], M * N).reshape(M, N), got)
  finally: lower_pack.PREFETCH_NEXT_COPY = keep
  # 64 row tiles read each tile: the copy is a small part of their compute (measured slower with hints), so none
  assert lower_pack.PREFETCH_MAX_REUSE < 64 and "__builtin_prefetch" not in kern(bench.matmul_ast(256, N, K), seq).to_program().src
  # 24 row tiles: within PREFETCH_MAX_REUSE under BLOCK, past PREFETCH_MAX_REUSE_WHOLE without it
  assert lower_pack.PREFETCH_MAX_REUSE_WHOLE < 24 <= lower_pack.PREFETCH_MAX_REUSE
  assert blocked == ("__builtin_prefetch" in kern(bench.matmul_ast(96, N, K), seq).to_program().src)
  # a column operand under PREFETCH_MIN_BYTES (256 KB) is likely in cache: no hints for its whole panel's copy (its
  # blocks' copies still get them)
  assert K * 64 * 4 < PREFETCH_MIN_BYTES and blocked == ("__builtin_prefetch" in kern(bench.matmul_ast(M, 64, K), seq).to_program().src)
