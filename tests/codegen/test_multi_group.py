"""Several GROUP/GROUPTOP axes on one reduce (multi-stage local reductions) and UNROLL of group
axes (DESIGN §5: UNROLL counts from first_reduce, so UNROLL 0 after a GROUP names the group axis).

Every accepted list here is run on random data and compared with numpy and with the unoptimized
kernel, on PYTHON (the emulator checks barriers, races and out-of-bounds accesses) and on OPENCL
(PoCL: real workgroups and local memory), through the fuzzer's guard zones. The two lists pinned
from issue 18 are the reference system's own: a 16M-element sum and a layernorm."""
import copy
import numpy as np
import pytest
from tilecraft import Tensor
from tilecraft.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tilecraft.device import Buffer, CompiledRunner, Device
from tilecraft.dtype import dtypes
from tilecraft.ops import BufferOps, ReduceOps
from tilecraft.renderer.cstyle import OpenCLRenderer
from tilecraft.testing import fuzz
from tilecraft.testing.corpus import corpus

G, GT, L, U, R, PAD = OptOps.GROUP, OptOps.GROUPTOP, OptOps.LOCAL, OptOps.UPCAST, OptOps.UNROLL, OptOps.PADTO
GPU = OpenCLRenderer()  # shapes and refusals need no device
ENTRIES = corpus()

SUM16M_OPTS = [Opt(GT, 0, 5), Opt(GT, 0, 2), Opt(R, 1, 0)]
LAYERNORM_OPTS = [Opt(G, 0, 4), Opt(PAD, 2, 16), Opt(G, 0, 0), Opt(L, 0, 4)]

def device(name: str):
  try: return Device[name]
  except Exception as e: pytest.skip(f"{name} device unavailable here: {type(e).__name__}: {e}")

def sum_ast(n: int):
  """The first kernel of Tensor.sum() over n elements (the frontend splits long reduces in two)."""
  return Tensor.empty(n).sum().schedule()[0].ast

def layernorm_asts(rows: int, cols: int):
  """The two reduce kernels of Tensor.layernorm() on a GPU-like device (PYTHON): the mean, and rsqrt(var + eps)
  reading the mean (on the CPU the scheduler fuses the two into one kernel with dependent reduces)."""
  sched = [si.ast for si in Tensor.empty(rows, cols, device="PYTHON").layernorm().schedule()]
  reduces = [a for a in sched if any(x.op in ReduceOps for x in a.lazyops)]
  assert len(reduces) == 2
  return sorted(reduces, key=lambda a: len({x.arg.idx for x in a.lazyops if x.op is BufferOps.LOAD}))

def make(ast, renderer, opts):
  k = Kernel(ast, renderer)
  for o in opts: k.apply_opt(o)
  return k

def check(ast, inputs: dict, want: np.ndarray, opts, dev: str, rtol=1e-4, atol=1e-4):
  """opts applied, rendered and run on dev (guard zones, every element written) match numpy and the unoptimized kernel."""
  got = fuzz.run_ast(ast, inputs, opts, dev)[0]
  base = fuzz.run_ast(ast, inputs, [], dev)[0]
  np.testing.assert_allclose(got.reshape(want.shape), want, rtol=rtol, atol=atol)
  np.testing.assert_allclose(got, base, rtol=rtol, atol=atol)

# ---- the reference's lists apply with the reference's shapes --------------------------------------

def test_sum16m_list_shape():
  k = make(sum_ast(16_000_000), GPU, SUM16M_OPTS)
  # UNROLL 1 0 names the second group axis (2) and unrolls it whole: one group axis is left
  assert k.full_shape == (256, 5, 6250, 2) and k.colors() == ["blue", "green", "red", "magenta"] and k.group_for_reduces == 1

@pytest.mark.parametrize("which", [0, 1], ids=["mean", "rsqrt-var"])
def test_layernorm_list_shape(which):
  k = make(layernorm_asts(4, 100)[which], GPU, LAYERNORM_OPTS)
  # GROUP 0 4 | PADTO 2 16 pads the rest (25) to 32 | GROUP 0 0 groups all of it | LOCAL 0 4 the rows
  assert k.full_shape == (4, 4, 32) and k.colors() == ["cyan", "green", "green"] and k.group_for_reduces == 2
  ast = k.get_optimized_ast()
  local = [x for x in ast.lazyops if x.op is BufferOps.STORE and x.arg.idx < 0]
  assert len(local) == 1 and local[0].arg.st.size == 4 * 4 * 32  # one partial per thread: local x both group axes

def _layernorm_case(rng, rows=4, cols=100):
  x = rng.standard_normal((rows, cols)).astype(np.float32)
  d = x - x[:, :1]  # layernorm's statistics are of the row shifted by its first element (Tensor.var)
  m = d.mean(1)
  return x, m, [({1: x}, m), ({1: x, 2: m}, 1 / np.sqrt(((d - m[:, None]) ** 2).mean(1) + 1e-5))]

@pytest.mark.parametrize("dev", ["PYTHON", "OPENCL"])
def test_layernorm_list_runs(dev, rng):
  device(dev)
  _, _, cases = _layernorm_case(rng)
  for ast, (inputs, want) in zip(layernorm_asts(4, 100), cases): check(ast, inputs, want, LAYERNORM_OPTS, dev)

def test_sum16m_list_runs_on_opencl(rng):
  """The real 16M sum (plain buffers: the guard zones' byte checks of 64 MB would take most of the time)."""
  dev = device("OPENCL")
  x = rng.random(16_000_000, dtype=np.float32)
  ast = sum_ast(16_000_000)
  inp = Buffer("OPENCL", x.size, dtypes.float32).allocate().copyin(x)
  def run(opts):
    out = Buffer("OPENCL", 256, dtypes.float32).allocate().copyin(np.full(256, np.nan, np.float32))
    CompiledRunner(make(ast, dev.renderer, opts).to_program())([out, inp])
    return out.numpy()
  got, base = run(SUM16M_OPTS), run([])
  np.testing.assert_allclose(got, x.reshape(256, 62500).astype(np.float64).sum(1), rtol=1e-4)
  np.testing.assert_allclose(got, base, rtol=1e-4)

def test_sum_list_structure_runs_on_python(rng):
  """The 16M list's structure (GROUPTOP 5, GROUPTOP 2, UNROLL of the second group axis) on a sum the emulator affords."""
  x = rng.standard_normal((8, 60)).astype(np.float32)
  ast = Tensor.empty(8, 60).sum(1).schedule()[0].ast
  assert make(ast, Device["PYTHON"].renderer, SUM16M_OPTS).colors() == ["blue", "green", "red", "magenta"]
  check(ast, {1: x}, x.sum(1), SUM16M_OPTS, "PYTHON")

# ---- more multi-group and group-unroll lists, proven on random data --------------------------------

LISTS = {  # corpus entry -> opts
  "two-groups": ("matmul_16x16x16", [Opt(G, 0, 2), Opt(G, 0, 2)]),
  "three-groups+local+upcast": ("matmul_16x16x16", [Opt(GT, 0, 2), Opt(G, 0, 2), Opt(L, 0, 4), Opt(G, 0, 2), Opt(U, 0, 2)]),
  "group-two-axes": ("sum_axis02_5x7x9", [Opt(G, 0, 5), Opt(GT, 0, 9)]),
  "grouptop-grouptop-1d": ("sum_1d_49", [Opt(GT, 0, 7), Opt(GT, 0, 7)]),
  "max-two-groups+local": ("max_axis2_5x7x9", [Opt(GT, 0, 3), Opt(G, 0, 3), Opt(L, 0, 5)]),
  "max-group-group": ("max_all_7x25", [Opt(G, 0, 7), Opt(GT, 0, 5)]),
  "groups-padded": ("matmul_7x25x49", [Opt(G, 0, 5), Opt(PAD, 3, 8), Opt(GT, 0, 4)]),
  "unroll-group-part": ("matmul_16x16x16", [Opt(GT, 0, 8), Opt(R, 0, 2)]),
  "unroll-group-whole": ("sum_axis1_5x7x9", [Opt(GT, 0, 0), Opt(R, 0, 0)]),
  "unroll-second-group": ("matmul_16x16x16", [Opt(G, 0, 4), Opt(GT, 0, 2), Opt(R, 1, 2), Opt(U, 0, 4)]),
}

@pytest.mark.parametrize("dev", ["PYTHON", "OPENCL"])
@pytest.mark.parametrize("name", list(LISTS))
def test_lists_run(name, dev):
  device(dev)
  entry, opts = LISTS[name]
  e = ENTRIES[entry]
  k = fuzz.build_kernel(e.ast, opts, dev)
  assert k.applied_opts == opts
  x = fuzz.entry_inputs(e)
  assert fuzz.check_opts(e, opts, x, dev) is None

def test_unroll_of_group_axes_keeps_the_regions():
  k = make(ENTRIES["matmul_16x16x16"].ast, GPU, [Opt(GT, 0, 8)])
  assert k.colors() == ["blue", "blue", "green", "red"]
  k.apply_opt(Opt(R, 0, 2))  # in part: still a group axis, 4 threads
  assert k.full_shape == (16, 16, 4, 2, 2) and k.colors() == ["blue", "blue", "green", "red", "magenta"] and k.group_for_reduces == 1
  k.apply_opt(Opt(R, 0, 0))  # the rest of it: no group axis left
  assert k.full_shape == (16, 16, 2, 2, 4) and k.colors() == ["blue", "blue", "red", "magenta", "magenta"] and k.group_for_reduces == 0

# ---- refusals: local memory counts every group axis, and a refusal changes nothing ------------------

def _tiny_shared(nbytes):
  r = copy.copy(GPU)
  r.shared_max = nbytes
  return r

def _state(k):
  return (tuple(k.sts), k.full_shape, list(k.colors()), k.local_dims, k.upcasted, k.group_for_reduces, list(k.applied_opts))

def test_shared_max_counts_every_group_axis():
  ast = ENTRIES["sum_axis1_5x7x9"].ast  # (5, 9, 7): reduce axis 7
  make(ast, _tiny_shared(28), [Opt(G, 0, 7)])  # 7 partials of 4 bytes fit
  k = make(Tensor.empty(4, 256).sum(1).schedule()[0].ast, _tiny_shared(64), [Opt(G, 0, 4)])
  make(Tensor.empty(4, 256).sum(1).schedule()[0].ast, _tiny_shared(64), [Opt(G, 0, 16)])  # one axis of 16 fits...
  before = _state(k)
  with pytest.raises(KernelOptError, match="shared_max"): k.apply_opt(Opt(G, 0, 8))  # ...4 x 8 on two axes doesn't
  assert _state(k) == before
  k.apply_opt(Opt(GT, 0, 4))  # 4 x 4 does
  assert k.group_for_reduces == 2
  with pytest.raises(KernelOptError, match="shared_max"): k.apply_opt(Opt(U, 0, 4))  # upcasts count too
  assert k.group_for_reduces == 2 and k.upcasted == 0

def _entry(name): return lambda: ENTRIES[name].ast
def _rowsum(rows, cols): return lambda: Tensor.empty(rows, cols).sum(1).schedule()[0].ast

REFUSED = {  # ast, opts applied first, the refused opt, the rule
  "group-past-the-last-axis": (_entry("sum_axis1_5x7x9"), [Opt(G, 0, 7)], Opt(G, 0, 0), "out of range"),
  "second-group-non-divisor": (_entry("matmul_16x16x16"), [Opt(G, 0, 4)], Opt(GT, 0, 3), "does not divide"),
  "groups-over-the-thread-limit": (_rowsum(4, 4096), [Opt(G, 0, 32), Opt(GT, 0, 16)], Opt(G, 0, 4), "threads"),
  "unroll-group-over-32": (_rowsum(4, 256), [Opt(G, 0, 64)], Opt(R, 0, 0), "over 32"),
  "padto-grows-the-workgroup-over-the-limit": (_rowsum(1023, 64), [Opt(L, 0, 0)], Opt(PAD, 0, 5), "1025 threads"),
  "group-a-magenta-axis": (_entry("matmul_16x16x16"), [Opt(G, 0, 4), Opt(R, 0, 2)], Opt(G, 1, 2), "not a reduce axis"),
}

@pytest.mark.parametrize("name", list(REFUSED))
def test_refused_lists_leave_the_kernel_unchanged(name):
  build, pre, opt, match = REFUSED[name]
  k = make(build(), GPU, pre)
  before = _state(k)
  with pytest.raises(KernelOptError, match=match): k.apply_opt(opt)
  assert _state(k) == before

# ---- merged dims (docs/architecture.md: where the reference's lists differ) -------------------------

@pytest.mark.parametrize("dev", ["PYTHON", "OPENCL"])
def test_repeat_interleave_merges_to_one_dim(dev):
  """The reference keeps (18, 8) (the input's index is non-linear in the first axis) and applies
  UPCAST 1 4; here the kernel is (144,), that axis doesn't exist, and UPCAST 0 4 is the same lanes."""
  d = device(dev)
  x = np.random.default_rng(3).standard_normal((6, 8)).astype(np.float32)
  src = Tensor(x, device=dev).realize()
  ast = src.reshape(6, 1, 8).expand(6, 3, 8).reshape(18, 8).contiguous().schedule()[-1].ast
  k = Kernel(ast, d.renderer)
  assert k.full_shape == (144,) and len(k.sts[1].views) == 2
  with pytest.raises(KernelOptError, match="out of range"): k.apply_opt(Opt(U, 1, 4))
  got = fuzz.run_ast(ast, {1: x}, [Opt(U, 0, 4)], dev)[0]
  np.testing.assert_array_equal(got.reshape(18, 8), np.repeat(x, 3, axis=0))
