"""Compiling many C-dialect kernels in one compiler run (Compiler.compile_batch with batch_renames,
the CPU and OPENCL devices) and the fuzzer's prebuild on top of it: kernels that define the same
helpers and have the same name are isolated from each other, each runs from the shared binary with
the results it has when built alone, and a broken kernel is named."""
import numpy as np
import pytest
from tilecraft import Context
from tilecraft.device import CompileError, Device, defined_functions
from tilecraft.testing import fuzz
from tilecraft.testing.corpus import corpus

def test_defined_functions_finds_definitions_not_declarations():
  src = "\n".join([
    "#include <math.h>",
    "typedef float float8 __attribute__((vector_size(32), aligned(4)));",
    "static inline float8 tc_sel_float8(int m, float8 a, float8 b) { return a; }  /* one line */",
    "float sinf(float x);",  # a declaration of an outside function: never renamed
    "static inline void tc_mstore_float8(float* p, int m, float8 v) {",
    "  (void)p;",
    "}",
    "__attribute__((optimize(\"no-tree-loop-if-convert\"))) void E_25(float* restrict data0, const float* restrict data1) {",
    "  for (int i = 0; i < 25; i++) data0[i] = sinf(data1[i]);",
    "}",
    "__kernel __attribute__((reqd_work_group_size(4, 1, 1))) void r_4(__global float* data0) {",
    "}"])
  assert defined_functions(src) == ["tc_sel_float8", "tc_mstore_float8", "E_25", "r_4"]

ENTRY = "arith_bfloat16"  # its programs define helpers (bf16 conversions), and some have the same kernel name

@pytest.mark.parametrize("device", ["CPU", "OPENCL"])
def test_prebuilt_kernels_share_one_binary_and_match_kernels_built_alone(device: str):
  e = corpus()[ENTRY]
  seqs, _, _ = fuzz.sample_opt_sequences(e, fuzz._seeded(0, e.name, "opts"), 4, device)
  lists = [[]] + [list(s) for s in seqs]
  progs = [fuzz.get_program(e.ast, o, device, front=fuzz.FRONT_GUARD) for o in lists]
  # the cases batching must isolate: kernels with one name, helpers every kernel defines
  assert len({p.name for p in progs}) < len(progs) and len({p.src for p in progs}) == len(progs)
  assert set.intersection(*[set(defined_functions(p.src)) - {p.name} for p in progs])
  fuzz._runner_cache.clear()
  with Context(CACHELEVEL=0):  # (a kernel whose own binary is on disk, from an earlier run, would be read from there)
    assert fuzz.prebuild([(e.ast, o) for o in lists], device) == len(progs)
  runners = [fuzz.get_runner(p) for p in progs]
  assert len({id(r.lib) for r in runners}) == 1  # one compiler run, one binary ...
  assert len({id(r.clprg.lib if device == "CPU" else r.clprg.prg) for r in runners}) == 1  # ... loaded once
  inputs = fuzz.entry_inputs(e)
  batched = [fuzz.run_program(e.ast, p, inputs, device, front=fuzz.FRONT_GUARD) for p in progs]
  fuzz._runner_cache.clear()  # now each kernel is built alone
  for p, got in zip(progs, batched):
    alone = fuzz.run_program(e.ast, p, inputs, device, front=fuzz.FRONT_GUARD)
    for g, a in zip(got, alone): np.testing.assert_array_equal(g, a)
  want = e.reference(inputs, {})
  for got in batched:
    for g, w in zip(got, want): np.testing.assert_allclose(g.astype(np.float64), np.asarray(w, np.float64), rtol=e.rtol or 1e-2, atol=e.atol or 1e-2)

def test_a_broken_kernel_in_a_batch_is_named():
  e = corpus()[ENTRY]
  good = fuzz.get_program(e.ast, [], "CPU", front=fuzz.FRONT_GUARD).src
  broken = good.replace("{\n", "{\n  undeclared_thing = 1;\n", 1)
  with pytest.raises(CompileError, match=r"1 of 3 kernels in a batch failed to compile \(kernels \[1\]\)") as ei:
    Device["CPU"].compiler.compile_batch([good, broken, good])
  assert "undeclared_thing" in ei.value.src

def test_build_many_batches_reads_cached_and_isolates_a_failure(tmp_path, monkeypatch):
  """Compiler.build_many, which both the schedule's compile_ahead and the fuzzer's prebuild use: new
  programs in batches (at least one per core in parallel), a program whose own binary is on disk read
  from there, and a batch that fails to build reported as None for each of its programs."""
  import tilecraft.device as device_module
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  monkeypatch.setattr(device_module, "usable_cores", lambda: 2)
  comp = Device["CPU"].compiler
  def kernel(i: int) -> tuple[str, str]:
    return f"void k_{i}(float* restrict data0) {{ data0[0] = {i}.5f; }}\n", f"k_{i}"
  progs = [kernel(i) for i in range(6)]
  with Context(CACHELEVEL=2):
    lone = comp.compile_cached(progs[0][0])  # built alone before
    runs: list[str] = []
    real = type(comp).compile
    monkeypatch.setattr(type(comp), "compile", lambda self, src: (runs.append(src), real(self, src))[1])
    built = comp.build_many(progs, max_batch=16, parallel=True)
    assert built[0] == (lone, None)
    assert len(runs) == 2 and all("k_0" not in r for r in runs)  # 5 new kernels: two batches (two cores), the cached one not rebuilt
    assert len({b[0] for b in built[1:] if b is not None}) == 2
    for b, (_, name) in zip(built[1:], progs[1:]):
      assert b is not None and b[1] is not None and b[1].startswith(name + "__b") and b[1].encode() in b[0]  # its symbol, in its batch's binary
    broken = [kernel(10), ("void k_11(float* restrict data0) { undeclared = 1; }\n", "k_11"), kernel(12)]
    out = comp.build_many(broken, max_batch=16)
    assert out == [None, None, None]  # one batch, which failed: each is compiled alone at its turn

def test_build_many_starts_each_batch_while_the_rest_are_rendered(tmp_path, monkeypatch):
  """build_many from a generator (with `count`): each batch is handed to the compiler as soon as its last program
  is rendered, before the generator is asked for the next one (here without threads, so the order is exact), and
  the results are what a list gives."""
  import tilecraft.device as device_module
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  monkeypatch.setattr(device_module, "usable_cores", lambda: 2)
  comp = Device["CPU"].compiler
  events: list[str] = []
  def rendered():
    for i in range(6):
      events.append(f"render {i}")
      yield f"void s_{i}(float* restrict data0) {{ data0[0] = {i}.25f; }}\n", f"s_{i}"
  real = type(comp).compile_batch
  monkeypatch.setattr(type(comp), "compile_batch", lambda self, srcs: (events.append(f"compile {len(srcs)}"), real(self, srcs))[1])
  with Context(CACHELEVEL=2):
    built = comp.build_many(rendered(), max_batch=3, count=6)
  assert events == ["render 0", "render 1", "render 2", "compile 3", "render 3", "render 4", "render 5", "compile 3"], events
  assert all(b is not None and b[1] == f"s_{i}__b{i % 3}" and b[1].encode() in b[0] for i, b in enumerate(built))
