"""`tilecraft show EXPR --shapes a=64x64,b=64x64`: build an expression over named random inputs
and print, for each kernel of its schedule, the AST, the colored shape, the applied opts with
the reason for each, the UOps (-v) and the rendered source.

The expression is not passed to Python's eval: a small interpreter walks its syntax tree and
allows only numbers/strings, the input names, arithmetic and comparison operators, indexing and
slicing, and calls of public Tensor methods on Tensors (no builtins, no other names, nothing
starting with an underscore, nothing that leaves the Tensor world such as .numpy()). Arithmetic on
plain Python values is bounded before it runs: no ints over MAX_INT_BITS bits (9**9**9 would take
Python minutes) and no strings/lists over MAX_SEQ_LEN items ('x'*10**10 would take 10 GB)."""
from __future__ import annotations
import argparse, ast, math, operator, os, re, time
from typing import Any, Callable
import numpy as np
from tilecraft.cli import CLIError, compile_error_line, first_line, fmt_opt, fmt_time, nonnegative_int, open_device, strip_ansi, use_color

_BINOPS: dict[type, Callable[[Any, Any], Any]] = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv,
           ast.Mod: operator.mod, ast.Pow: operator.pow, ast.MatMult: operator.matmul, ast.BitAnd: operator.and_, ast.BitOr: operator.or_,
           ast.BitXor: operator.xor, ast.LShift: operator.lshift, ast.RShift: operator.rshift}
_UNOPS: dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert}
_CMPOPS: dict[type, Callable[[Any, Any], Any]] = {ast.Lt: operator.lt, ast.Gt: operator.gt, ast.LtE: operator.le, ast.GtE: operator.ge, ast.Eq: operator.eq, ast.NotEq: operator.ne}
# public Tensor members that run kernels, leave the Tensor world or change state: not in expressions
_DENY = {"numpy", "tolist", "item", "realize", "schedule", "assign", "contiguous_base", "manual_seed", "lazydata", "to"}

class ExprError(ValueError):
  """An expression `show` refuses or can't evaluate."""

MAX_INT_BITS, MAX_SEQ_LEN = 1024, 1 << 20

def _bits(x: Any) -> float:
  """log2 of |x| for a plain int (0 for 0 and +-1)."""
  return math.log2(abs(x)) if isinstance(x, int) and abs(x) > 1 else 0.0

def _check_const_op(op: ast.operator, a: Any, b: Any) -> None:
  """Refuse, before computing it, plain-Python arithmetic whose result would be huge."""
  ints = isinstance(a, int) and isinstance(b, int)
  if isinstance(op, ast.Pow) and ints and b > 0 and b * _bits(a) > MAX_INT_BITS:
    raise ExprError(f"the constant {a}**{b} is too large (about {b * _bits(a):.3g} bits; at most {MAX_INT_BITS} are allowed)")
  if isinstance(op, ast.LShift) and ints and a != 0 and b + _bits(a) > MAX_INT_BITS:
    raise ExprError(f"the constant {a} << {b} is too large (at most {MAX_INT_BITS} bits are allowed)")
  if isinstance(op, ast.Mult):
    for seq, n in ((a, b), (b, a)):
      if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_SEQ_LEN:
        raise ExprError(f"repeating a {type(seq).__name__} of length {len(seq)} {n} times is too large (at most {MAX_SEQ_LEN} items)")

def _allowed_attr(obj: Any, name: str) -> bool:
  from tilecraft import Tensor
  return isinstance(obj, Tensor) and not name.startswith("_") and name not in _DENY and hasattr(Tensor, name)

def safe_eval(expr: str, env: dict[str, Any]) -> Any:
  """Evaluate `expr` with only the names in `env` and Tensor methods (see the module docstring)."""
  try: tree = ast.parse(expr.strip(), mode="eval")
  except SyntaxError as e: raise ExprError(f"syntax error in {expr!r}: {e.msg}") from None
  def ev(n: ast.AST) -> Any:
    if isinstance(n, ast.Expression): return ev(n.body)
    if isinstance(n, ast.Constant):
      if isinstance(n.value, (int, float, bool, str)) or n.value is None: return n.value
      raise ExprError(f"constant {n.value!r} is not allowed")
    if isinstance(n, ast.Name):
      if n.id in env: return env[n.id]
      raise ExprError(f"unknown name {n.id!r} (inputs: {', '.join(env) or 'none'}; use --shapes {n.id}=...)")
    if isinstance(n, ast.BinOp) and type(n.op) in _BINOPS:
      a, b = ev(n.left), ev(n.right)
      _check_const_op(n.op, a, b)
      return _BINOPS[type(n.op)](a, b)
    if isinstance(n, ast.UnaryOp) and type(n.op) in _UNOPS: return _UNOPS[type(n.op)](ev(n.operand))
    if isinstance(n, ast.Compare) and len(n.ops) == 1 and type(n.ops[0]) in _CMPOPS: return _CMPOPS[type(n.ops[0])](ev(n.left), ev(n.comparators[0]))
    if isinstance(n, (ast.Tuple, ast.List)):
      vals = [ev(e) for e in n.elts if not isinstance(e, ast.Starred) or _starred(e)]
      return tuple(vals) if isinstance(n, ast.Tuple) else vals
    if isinstance(n, ast.Slice): return slice(*(ev(x) if x is not None else None for x in (n.lower, n.upper, n.step)))
    if isinstance(n, ast.Subscript): return ev(n.value)[ev(n.slice)]
    if isinstance(n, ast.Attribute):
      obj = ev(n.value)
      if not _allowed_attr(obj, n.attr): raise ExprError(f"attribute {n.attr!r} is not allowed (only public Tensor methods/properties on Tensors)")
      return getattr(obj, n.attr)
    if isinstance(n, ast.Call):
      if not isinstance(n.func, ast.Attribute): raise ExprError("only Tensor methods can be called, e.g. a.relu() or (a@b).sum(axis=1)")
      fn = ev(n.func)
      args = [ev(a) for a in n.args if not isinstance(a, ast.Starred) or _starred(a)]
      kwargs = {}
      for k in n.keywords:
        if k.arg is None: raise ExprError("**kwargs is not allowed")
        kwargs[k.arg] = ev(k.value)
      return fn(*args, **kwargs)
    raise ExprError(f"{type(n).__name__} is not allowed in expressions")
  return ev(tree)

def _starred(n: ast.AST) -> bool: raise ExprError("*args is not allowed")

_SHAPE_RE = re.compile(r"^([A-Za-z][A-Za-z0-9_]*)=([0-9x]*)(?::([a-z0-9]+))?$")

def input_dtypes() -> list[str]:
  """The dtype names --shapes accepts."""
  from tilecraft.dtype import DType, dtypes
  return sorted(n for n in dir(dtypes) if not n.startswith("_") and isinstance(getattr(dtypes, n), DType) and getattr(dtypes, n).itemsize > 0
                and getattr(dtypes, n).count == 1 and not n.startswith("default"))

def max_input_bytes() -> int:
  """The largest random input show makes: a quarter of the machine's memory (4 GiB if unknown)."""
  try: return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4
  except (ValueError, OSError, AttributeError): return 1 << 32

def parse_shapes(spec: str) -> dict[str, tuple[tuple[int, ...], str]]:
  """'a=64x64,b=64:float16' -> {'a': ((64, 64), 'float32'), 'b': ((64,), 'float16')}; 'c=' is a scalar.
  Unknown dtypes and inputs too large to make are refused here, before anything is allocated."""
  from tilecraft.dtype import dtypes
  out: dict[str, tuple[tuple[int, ...], str]] = {}
  for part in filter(None, (p.strip() for p in spec.split(","))):
    m = _SHAPE_RE.match(part)
    if m is None: raise CLIError(f"bad --shapes entry {part!r}: expected NAME=DxDx...[:dtype], e.g. a=64x64 or b=128:float16")
    name, dims, dt = m.group(1), m.group(2), m.group(3) or "float32"
    try: shape = tuple(int(d) for d in dims.split("x")) if dims else ()
    except ValueError: raise CLIError(f"bad shape {dims!r} in {part!r}") from None
    if name in out: raise CLIError(f"input {name!r} given twice in --shapes")
    if dt not in (names := input_dtypes()): raise CLIError(f"unknown dtype {dt!r} for input {name!r}; dtypes: {', '.join(names)}")
    nbytes = math.prod(shape) * (8 + getattr(dtypes, dt).itemsize)  # drawn in 64 bits, then converted
    if nbytes > (limit := max_input_bytes()):
      raise CLIError(f"input {name}={dims} ({math.prod(shape):,} elements of {dt}) is too large: its random data would take "
                     f"{nbytes / 2**30:,.1f} GiB (limit {limit / 2**30:.1f} GiB, a quarter of this machine's memory)")
    out[name] = (shape, dt)
  return out

def random_input(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
  """Normal floats, small ints (so products don't overflow) or random bools."""
  from tilecraft import dtypes
  dt = np.dtype(getattr(dtypes, dtype).np or np.float32)  # bfloat16 has no numpy type: drawn as float32
  if dt.kind == "f": return rng.standard_normal(shape).astype(dt)
  if dt.kind == "b": return rng.random(shape) < 0.5
  if dt.kind == "u": return rng.integers(0, 8, shape).astype(dt)
  return rng.integers(-8, 8, shape).astype(dt)

def add_arguments(ap: argparse.ArgumentParser) -> None:
  """The options of `tilecraft show`."""
  ap.add_argument("expr", help="expression over the inputs, e.g. '(a@b).relu()' or 'a.softmax(-1)'")
  ap.add_argument("--shapes", default="", help="inputs: NAME=DxD[:dtype],... e.g. a=64x64,b=64x64 (dtype default float32)")
  ap.add_argument("--device", default=None, help="device (default: Device.DEFAULT, i.e. $DEVICE or CPU)")
  ap.add_argument("-v", "--verbose", action="store_true", help="also print the UOps")
  ap.add_argument("--kernel", metavar="NAME|N", help="only the kernel with this name (or 1-based index)")
  ap.add_argument("--run", action="store_true", help="also run the kernels: the time of each and the result")
  ap.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the random inputs (an integer >= 0)")

def _uop_lines(uops: list) -> list[str]:
  idx = {id(u): i for i, u in enumerate(uops)}
  lines = []
  for i, u in enumerate(uops):
    src = ", ".join(str(idx.get(id(s), "?")) for s in u.src)
    arg = getattr(u.arg, "name", None) or repr(u.arg)
    lines.append(f"  {i:4d} {u.op.name:13s} {str(u.dtype):24s} [{src}] {arg if u.arg is not None else ''}".rstrip())
  return lines

def run(args: argparse.Namespace) -> int:
  """Run `tilecraft show`: print each kernel of the expression's schedule."""
  from tilecraft import Tensor, dtypes
  from tilecraft.codegen.kernel import Kernel
  from tilecraft.device import Device
  from tilecraft.engine import realize
  from tilecraft.helpers import BEAM, NOOPT
  from tilecraft.ops import MetaOps
  device = open_device(args.device, runs=args.run)
  rng = np.random.default_rng(args.seed)
  env: dict[str, Any] = {}
  for name, (shape, dt) in parse_shapes(args.shapes).items():
    env[name] = Tensor(random_input(rng, shape, dt), device=device, dtype=getattr(dtypes, dt))
  try: out = safe_eval(args.expr, env)
  except ExprError as e: raise CLIError(str(e)) from None
  except Exception as e: raise CLIError(f"evaluating {args.expr!r} failed: {type(e).__name__}: {e}") from None  # noqa: BLE001
  if not isinstance(out, Tensor): raise CLIError(f"{args.expr!r} gives a {type(out).__name__}, not a Tensor")
  sched = out.schedule()
  color = use_color()
  mode = "NOOPT" if NOOPT else f"BEAM={int(BEAM)}" if BEAM >= 1 else "hand-coded"
  print(f"{args.expr}  ->  shape {out.shape} {out.dtype.name} on {device}: {len(sched)} schedule item(s), opts: {mode}")
  optimize = getattr(realize, "optimize", None)
  shown = 0
  for i, si in enumerate(sched, start=1):
    if si.ast.op is not MetaOps.KERNEL:
      print(f"\n=== {i}/{len(sched)}: {si.ast.op.name} (not a kernel)")
      continue
    k = Kernel(si.ast, Device[device].renderer)
    k = optimize(k, list(si.bufs)) if optimize is not None else k.hand_coded_optimizations()
    p = k.to_program()
    if args.kernel and args.kernel not in (p.name, str(i)): continue
    shown += 1
    print(f"\n=== kernel {i}/{len(sched)}: {p.name} on {device}")
    print("--- AST")
    print(str(si.ast))
    cshape = k.colored_shape()
    print(f"--- shape: {cshape if color else strip_ansi(cshape)}   "
          "(global blue, local cyan, grouped reduce green, reduce red, unrolled magenta, upcast yellow)")
    print(f"    full shape {k.full_shape}; global size {p.global_size}; local size {p.local_size}")
    print(f"--- opts ({len(k.applied_opts)}, {mode}):")
    reasons = list(getattr(k, "applied_opts_reasons", [])) + [""] * len(k.applied_opts)
    for o, why in zip(k.applied_opts, reasons): print(f"  {fmt_opt(o):14s} {o}" + (f"  -- {why}" if why else ""))
    if not k.applied_opts: print("  (none)")
    if args.verbose and k.uops is not None:
      print(f"--- uops ({len(k.uops)}): index op dtype [sources] arg")
      print("\n".join(_uop_lines(k.uops)))
    print(f"--- source ({p.name}):")
    print(p.src.rstrip())
  if args.kernel and not shown: raise CLIError(f"no kernel named {args.kernel!r} in the schedule")
  if args.run:
    from tilecraft.device import CompileError
    try: _run(args, out, sched, device)
    except CompileError as e: raise CLIError(f"--run: a kernel failed to compile: {compile_error_line(e)}", code=1) from None
    except Exception as e: raise CLIError(f"--run: running {args.expr!r} failed: {first_line(e)}", code=1) from None  # noqa: BLE001
  return 0

def _run(args: argparse.Namespace, out: Any, sched: list, device: str) -> None:
  """show --run: realize (compiling), time each kernel once more, print the result."""
  from tilecraft.engine import realize
  from tilecraft.ops import MetaOps
  realize_items = [si for si in sched if si.ast.op is MetaOps.KERNEL]
  t0 = time.perf_counter()
  out.realize()
  wall = time.perf_counter() - t0
  print(f"\n--- run (first run, compiling included: {fmt_time(wall)})")
  for si in realize_items:
    r = realize.get_runner(si.ast, device, list(si.bufs))
    print(f"  {r.p.name:32s} {fmt_time(r(list(si.bufs), si.var_vals, wait=True))}")
  with np.printoptions(threshold=20, edgeitems=3, precision=4):
    print(f"result {out.shape}:\n{out.numpy()}")
