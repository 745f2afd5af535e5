"""Image buffers (imagef/imageh) on OPENCL: texel reads and writes, UPCASTMID, the heuristics' image
steps, the allocator, and the refusals on targets without images (codegen/lower_image.py)."""
import numpy as np
import pytest
from tilecraft.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tilecraft.codegen.lower_image import ImageLoweringError
from tilecraft.device import Buffer, Device
from tilecraft.dtype import dtypes
from tilecraft.helpers import Context
from tilecraft.renderer.cstyle import CRenderer, OpenCLRenderer
from tilecraft.testing.corpus import image_corpus
from tilecraft.testing.opt_sampler import _kernel_state
from tilecraft.testing.fuzz import check_opts, entry_inputs, fuzz_corpus, run_program, get_program

pytestmark = pytest.mark.opencl
IMAGES = image_corpus()
MATMUL, CONV = IMAGES["imagef_matmul_8x12x16"], IMAGES["imagef_conv_6x6x4_w3x3x8_p1"]
G, GT, MID = OptOps.GROUP, OptOps.GROUPTOP, OptOps.UPCASTMID

def kernel(entry, opts=(), dev="OPENCL"):
  k = Kernel(entry.ast, Device[dev].renderer)
  for o in opts: k.apply_opt(o)
  return k

def check(entry, opts):
  """opts vs the required-only kernel and vs numpy (engine/verify tolerances), on random inputs."""
  assert (f := check_opts(entry, opts, entry_inputs(entry, 1), "OPENCL")) is None, f

@pytest.mark.parametrize("name", list(IMAGES))
def test_required_and_hand_coded_match_numpy(name):
  e = IMAGES[name]
  req = kernel(e).required_optimizations()
  assert req.applied_opts and all(o.op is OptOps.UPCAST and o.amt == 4 for o in req.applied_opts)
  src = req.to_program().src
  assert "write_imagef(" in src and ("read_imagef(" in src or "read_imageh(" in src) and "image2d_t" in src
  check(e, req.applied_opts)
  check(e, kernel(e).hand_coded_optimizations().applied_opts)

def test_image_conv_with_upcastmid():
  """Input and weights as images, the padded border read through masks (0 outside), bias as a plain
  buffer; the reduce grouped and the output's texel axis upcast mid-reduce."""
  opts = [Opt(G, 1, 4), Opt(MID, 2, 4)]  # shape (6, 6, 8 | 3, 12): the output's texel axis is cout (axis 2)
  k = kernel(CONV, opts)
  assert "white" in k.colors() and k.group_for_reduces == 2
  src = k.to_program().src
  assert src.count("read_imagef(") >= 2 and "barrier(" in src and "write_imagef(" in src
  check(CONV, opts)
  check(CONV, opts + [Opt(OptOps.LOCAL, 1, 3), Opt(OptOps.UPCAST, 0, 2)])
  k2 = kernel(CONV, [Opt(GT, 1, 3), Opt(MID, 2, 4), Opt(OptOps.UPCAST, 2, 2)])
  assert "white" in k2.colors() and k2.colors()[-1] == "yellow"
  check(CONV, k2.applied_opts)

def test_image_matmul_hand_coded_groups_with_upcastmid():
  k = kernel(MATMUL).hand_coded_optimizations()
  assert [o.op for o in k.applied_opts[:2]] == [GT, MID] and "white" in k.colors()
  check(MATMUL, k.applied_opts)
  # the plain layouts too: texel reads of A along the (unrolled) reduce, of B along the upcast output axis
  for opts in ([Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UNROLL, 0, 4)], [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UPCAST, 1, 2), Opt(OptOps.LOCAL, 0, 8)],
               [Opt(OptOps.UPCAST, 1, 4), Opt(G, 0, 4), Opt(OptOps.UNROLL, 0, 3)]):
    check(MATMUL, opts)

def test_image_input_reads_whole_texels():
  """The heuristics' image-input step: the reduce axis A is contiguous along is unrolled by 4, so a
  thread reads A's texels whole (no per-channel selects)."""
  from tilecraft.codegen.heuristic import _image_inputs
  k = kernel(MATMUL, [Opt(OptOps.UPCAST, 1, 4)])
  _image_inputs(k)
  assert k.applied_opts[-1] == Opt(OptOps.UNROLL, 0, 4) and "image input 1" in k.applied_opts_reasons[-1]
  src = k.to_program().src
  assert "?val" not in src.replace(" ", "") and ".s3" in src  # channels picked statically
  check(MATMUL, k.applied_opts)

def test_partial_texel_store_is_refused():
  k = kernel(MATMUL)  # no required upcast: each thread would write one channel of a texel
  with pytest.raises(ImageLoweringError, match="texel"): k.to_program()
  assert isinstance(ImageLoweringError("x"), KernelOptError)
  k = kernel(MATMUL, [Opt(OptOps.LOCAL, 1, 2)])  # the texel axis split across threads: required upcast can't make whole texels
  before = _kernel_state(k)
  k.required_optimizations()
  if _kernel_state(k) == before:
    with pytest.raises(ImageLoweringError): k.to_program()

def test_upcastmid_refusals_leave_the_kernel_unchanged():
  k = kernel(MATMUL, [Opt(G, 0, 4)])
  for bad in (Opt(MID, 1, 2), Opt(MID, 0, 4), Opt(MID, 2, 4), Opt(MID, 9, 4)):
    before = _kernel_state(k)
    with pytest.raises(KernelOptError): k.apply_opt(bad)
    assert _kernel_state(k) == before
  with pytest.raises(KernelOptError, match="grouped"): kernel(MATMUL).apply_opt(Opt(MID, 1, 4))

@pytest.mark.parametrize("dev", ["CPU", "PYTHON-CUDA"])
def test_other_targets_refuse_images(dev):
  """CPU (and every C-family target but OpenCL), and the emulator when it emulates CUDA: no images."""
  with Context(EMULATE="CUDA" if dev == "PYTHON-CUDA" else ""):
    k = Kernel(MATMUL.ast, Device["PYTHON"].renderer if dev != "CPU" else CRenderer())
    k.required_optimizations()
    before = _kernel_state(k)
    with pytest.raises(ImageLoweringError, match="no image buffers"): k.to_program()
    assert _kernel_state(k) == before
  if dev == "CPU":
    with pytest.raises(NotImplementedError, match="image"): Buffer(dev, 16, dtypes.imagef((1, 4, 4))).allocate()

def test_python_emulator_runs_images():
  """The emulator keeps an image as its flat texels (reads outside give 0, writes outside are an
  error): the conv with UPCASTMID matches numpy and the required-only kernel there too."""
  opts = [Opt(G, 1, 4), Opt(MID, 2, 4)]
  assert (f := check_opts(CONV, opts, entry_inputs(CONV, 1), "PYTHON")) is None, f
  h = IMAGES["imageh_matmul_4x8x8"]
  assert (f := check_opts(h, kernel(h, dev="PYTHON").hand_coded_optimizations().applied_opts, entry_inputs(h, 1), "PYTHON")) is None, f

def test_image_over_the_device_limit_is_refused():
  ren = OpenCLRenderer()
  ren.image_max = (2, 2)
  k = Kernel(MATMUL.ast, ren).required_optimizations()
  with pytest.raises(ImageLoweringError, match="limit"): k.to_program()

def test_image_buffers_roundtrip_and_are_pooled_by_dtype():
  alloc = Device["OPENCL"].allocator
  a = np.arange(32, dtype=np.float32)
  b = Buffer("OPENCL", 32, dtypes.imagef((2, 4, 4))).copyin(a)
  assert np.array_equal(b.numpy(), a)
  h = np.arange(32, dtype=np.float16)
  assert np.array_equal(Buffer("OPENCL", 32, dtypes.imageh((4, 2, 4))).copyin(h).numpy(), h)
  with pytest.raises(ValueError, match="holds"): Buffer("OPENCL", 31, dtypes.imagef((2, 4, 4))).allocate()
  handle = b._buf
  del b
  hits = alloc.hits
  same_bytes = Buffer("OPENCL", 32, dtypes.imagef((4, 2, 4))).allocate()  # same size, other texel layout: not that image
  assert same_bytes._buf is not handle
  again = Buffer("OPENCL", 32, dtypes.imagef((2, 4, 4))).allocate()
  assert again._buf is handle and alloc.hits == hits + 1
  plain = Buffer("OPENCL", 32, dtypes.float).allocate()
  assert plain._buf is not handle

def test_masked_image_read_is_zero_inside_the_image():
  """A masked element reads 0 even where its coordinates are inside the image (the read is gated)."""
  e = CONV
  inputs = entry_inputs(e, 2)
  p = get_program(e.ast, kernel(e).required_optimizations().applied_opts, "OPENCL")
  got = run_program(e.ast, p, inputs, "OPENCL")[0]
  want = e.reference(inputs, {})[0]
  np.testing.assert_allclose(got.reshape(-1), want.reshape(-1), rtol=1e-4, atol=1e-4)

@pytest.mark.fuzz
def test_fuzz_image_kernels():
  reps = fuzz_corpus("OPENCL", 6, seed=5, names=list(IMAGES), isolate=False)
  assert all(r.ok for r in reps.values()), {n: str(r.first_failure()) for n, r in reps.items() if not r.ok}
  assert sum(r.pairs for r in reps.values()) >= 20
