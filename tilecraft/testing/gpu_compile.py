"""Compile checks for the GPU targets without a GPU: the kernels the differential fuzzer runs on an
emulated target (the PYTHON device under EMULATE=CUDA|AMD|METAL), built with the real target's
renderer (the same capabilities, so the opt sampler draws the same sequences), rendered, and
compiled in batches: one compiler run per (target, architecture, chunk), disk-cached like any
binary. `EMULATOR_FUZZ` is what the emulator's default-tier fuzz test runs per target."""
from __future__ import annotations
import re
from typing import Any, Iterator, Optional
from tilecraft.codegen.kernel import Kernel, Opt
from tilecraft.device import Compiler
from tilecraft.dtype import dtypes
from tilecraft.renderer import Program, Renderer
from tilecraft.runtime.python import target_renderer
from tilecraft.testing.corpus import CorpusEntry, corpus
from tilecraft.testing.fuzz import _seeded, sample_opt_sequences, stable_name

# EMULATE target -> (seed, opt sequences per corpus kernel) of the emulator's default fuzz run
EMULATOR_FUZZ: dict[str, tuple[int, int]] = {"": (0, 5), "CUDA": (1, 5), "METAL": (2, 5), "AMD": (3, 5)}

def renders_on(entry: CorpusEntry, ren: Renderer) -> bool:
  """Whether the target has every dtype the kernel uses (Metal has no float64)."""
  names = getattr(ren, "type_names", None)
  return names is None or all(op.dtype.scalar() in names or op.dtype == dtypes.void for op in entry.ast.lazyops)

def fuzzed_kernels(target: str, seed: Optional[int] = None, n: Optional[int] = None) -> Iterator[tuple[str, list[Opt], Kernel]]:
  """(entry name, opts, kernel) for each corpus kernel unoptimized and for each opt sequence the
  fuzzer draws for it on the emulated `target` (with `seed`/`n` defaulting to EMULATOR_FUZZ)."""
  dseed, dn = EMULATOR_FUZZ[target]
  seed, n = dseed if seed is None else seed, dn if n is None else n
  ren = target_renderer(target)
  for name, e in corpus().items():
    if not renders_on(e, ren): continue
    k0 = Kernel(e.ast, opts=ren)
    yield name, [], k0
    seqs, _, fails = sample_opt_sequences(e, _seeded(seed, name, "opts"), n, kernel=k0)
    if fails: raise AssertionError(f"{name}: applying opts failed on {target}: {fails[0].message}")
    for s in seqs: yield name, list(s), s.kernel  # type: ignore[attr-defined]

def unique_programs(kernels: Iterator[tuple[str, list[Opt], Kernel]]) -> list[tuple[str, list[Opt], Program]]:
  """Render each kernel once per distinct source (same code under another name is compiled once),
  each with a name unique in the batch."""
  out: list[tuple[str, list[Opt], Program]] = []
  seen: set[str] = set()
  for name, opts, k in kernels:
    p = k.to_program(name_override=f"{stable_name(k)}_{len(out)}")
    body = re.sub(rf"\b{re.escape(p.name)}\b", "KERNEL", p.src)
    if body in seen: continue
    seen.add(body)
    out.append((name, opts, p))
  return out

def compile_in_chunks(programs: list[Program], compiler: Compiler, chunk: int, chunks: int) -> bytes:
  """Compile the `chunk`-th of `chunks` interleaved slices of programs as one batch."""
  part = programs[chunk::chunks]
  if not part: return b""
  return compiler.compile_batch([p.src for p in part])

def coverage(items: list[tuple[str, list[Opt], Program]]) -> dict[str, Any]:
  """What the batch exercises: opt kinds, local memory and barriers, dtypes, vectors, Variables."""
  from tilecraft.codegen.uops import UOps
  ops = {o.op.name for _, opts, _ in items for o in opts}
  uops = [u for _, _, p in items for u in (p.uops or [])]
  return {"opts": ops, "local": any(u.op is UOps.DEFINE_LOCAL for u in uops), "barrier": any(u.op is UOps.BARRIER for u in uops),
          "half": any(u.dtype.scalar() == dtypes.float16 for u in uops), "bfloat16": any(u.dtype.scalar() == dtypes.bfloat16 for u in uops),
          "vector_load": any(u.op is UOps.LOAD and u.dtype.count > 1 for u in uops), "vars": any(u.op is UOps.DEFINE_VAR for u in uops)}
