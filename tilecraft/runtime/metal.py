"""Metal compile checks. There is no Metal compiler off Apple machines, so `MetalCompiler` checks the
structure of the source instead (what a renderer bug would most likely break) and returns it: the
Metal framework compiles source when a library is made, so the source is the binary here."""
from __future__ import annotations
import re
from tilecraft.device import CompileError, Compiled, Compiler, render_only_device

# spellings of the other GPU dialects and of C that are not Metal
_FOREIGN = ("__global__", "__shared__", "__syncthreads", "blockIdx", "threadIdx", "__builtin_amdgcn", "__attribute__((shared",
            "double", "long long", "restrict", "#pragma", "__launch_bounds__", "__device__", "extern \"C\"")
_IDS = {"gid": "threadgroup_position_in_grid", "lid": "thread_position_in_threadgroup", "gpos": "thread_position_in_grid"}
# Metal's 64-bit ints are `long` / `ulong` (the MSL spec has no long long): literals take l / ul, never ll
_LL_LITERAL = re.compile(r"\b(?:0[xX][0-9a-fA-F]+|\d+)(?:[uU]?(?:ll|LL)|(?:ll|LL)[uU])\b")

def metal_problems(src: str) -> list[str]:
  """What is structurally wrong with a rendered Metal kernel (empty when nothing is found)."""
  out: list[str] = []
  code = re.sub(r"/\*.*?\*/", "", re.sub(r'"(?:\\.|[^"\\])*"', '""', src), flags=re.S)
  stack: list[tuple[str, int]] = []
  for n, line in enumerate(code.splitlines(), 1):
    for ch in line:
      if ch in "({[": stack.append((ch, n))
      elif ch in ")}]":
        if not stack or {"(": ")", "{": "}", "[": "]"}[stack[-1][0]] != ch: out.append(f"line {n}: unbalanced {ch!r}"); break
        stack.pop()
  out += [f"line {n}: {ch!r} is never closed" for ch, n in stack]
  if not code.lstrip().startswith("#include <metal_stdlib>"): out.append("the source does not start with #include <metal_stdlib>")
  kernels = re.findall(r"\bkernel\s+void\s+(\w+)\s*\(", code)
  if len(kernels) != 1: out.append(f"expected one 'kernel void NAME(' function, found {len(kernels)}")
  bufs = [int(b) for b in re.findall(r"\[\[buffer\((\d+)\)\]\]", code)]
  if sorted(bufs) != list(range(len(bufs))): out.append(f"buffer indices {bufs} are not 0..{len(bufs) - 1}, each once")
  out += [f"uses {w!r}, which is not Metal" for w in _FOREIGN if w in code]
  if (lits := _LL_LITERAL.findall(code)): out.append(f"64-bit literal(s) {sorted(set(lits))[:3]} with the ll suffix (Metal has no long long: l / ul)")
  for var, attr in _IDS.items():
    if re.search(rf"\b{var}\.[xyz]\b", code) and f"[[{attr}]]" not in code: out.append(f"uses {var} without a [[{attr}]] argument")
  body = code[code.find("{", code.find("kernel void")) + 1:] if "kernel void" in code else ""
  for n, line in enumerate(body.splitlines(), 1):
    s = line.strip()
    if s and not s.endswith((";", "{", "}")): out.append(f"kernel body line {n} is not a complete statement: {s[:80]!r}")
  return out

class MetalCompiler(Compiler):
  """Structural checks of Metal source (see metal_problems); a problem raises CompileError."""
  def __init__(self) -> None: super().__init__(None)
  def compile(self, src: str) -> bytes:
    if (problems := metal_problems(src)): raise CompileError("Metal source failed its structural checks: " + "; ".join(problems[:8]), src)
    return src.encode()

def open_device() -> Compiled:
  """METAL here: render + structural checks only (device.py's registry calls this)."""
  from tilecraft.renderer.metal import MetalRenderer
  return render_only_device("METAL", MetalRenderer, MetalCompiler(), "no Metal runtime here; Metal source gets structural checks only")
