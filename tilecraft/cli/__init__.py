"""The `tilecraft` command line: one module per subcommand (bench, show, devices, fuzz, tune,
calibrate, roofline, cache, ...). This file holds what they share: progress lines on stderr, table
formatting, opt formatting and opening a device with a readable error."""
from __future__ import annotations
import argparse, os, re, sys, time
from typing import Any, Iterable, Optional, Sequence, TextIO

_ANSI = re.compile(r"\x1b\[[0-9;]*m")

def strip_ansi(s: str) -> str:
  """`s` without terminal color codes."""
  return _ANSI.sub("", s)

def use_color(stream: Optional[TextIO] = None) -> bool:
  """Colors only on a terminal (stdout by default: the one current at the call), and never with NO_COLOR set."""
  stream = stream if stream is not None else sys.stdout
  return "NO_COLOR" not in os.environ and hasattr(stream, "isatty") and stream.isatty()

class CLIError(Exception):
  """A user-facing error: printed without a traceback, exits with `code`."""
  def __init__(self, msg: str, code: int = 2):
    super().__init__(msg)
    self.code = code

class Progress:
  """Progress on stderr: one rewritten line on a terminal, plain lines otherwise; silent when disabled."""
  def __init__(self, enabled: bool = True, total: int = 0, stream: Optional[TextIO] = None):
    self.enabled, self.total, self.stream = enabled, total, stream if stream is not None else sys.stderr
    self.tty = hasattr(stream, "isatty") and stream.isatty()
    self.i, self._width, self.t0 = 0, 0, time.perf_counter()
  def step(self, msg: str) -> None:
    """Start item i+1 of total, described by msg."""
    self.i += 1
    self.note(f"[{self.i}/{self.total}] {msg}" if self.total else msg)
  def note(self, msg: str) -> None:
    """Replace the progress line with msg."""
    if not self.enabled: return
    if self.tty:
      self.stream.write("\r" + msg.ljust(self._width)[:max(self._width, len(msg))])
      self._width = len(msg)
    else: self.stream.write(msg + "\n")
    self.stream.flush()
  def message(self, msg: str) -> None:
    """A line that stays (warnings, results), printed even when progress is off."""
    self.clear()
    self.stream.write(msg + "\n")
    self.stream.flush()
  def clear(self) -> None:
    """Erase the progress line (terminal only)."""
    if self.enabled and self.tty and self._width:
      self.stream.write("\r" + " " * self._width + "\r")
      self.stream.flush()
      self._width = 0

def fmt_opt(o: Any) -> str:
  """Opt(UPCAST, 1, 16) -> 'UPCAST1:16' (NOLOCALS has no axis)."""
  op = getattr(o.op, "name", str(o.op))
  if o.axis is None: return op
  return f"{op}{o.axis}:{o.amt}"

def fmt_opts(opts: Iterable[Any]) -> str:
  """Opts as space-separated short forms, "-" for none."""
  s = " ".join(fmt_opt(o) for o in opts)
  return s or "-"

def fmt_time(t: Optional[float]) -> str:
  """Seconds as a short human string with a unit (us / ms / s)."""
  if t is None or t != t: return "-"
  if t < 1e-3: return f"{t*1e6:.1f} us"
  if t < 1: return f"{t*1e3:.2f} ms"
  return f"{t:.2f} s"

def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: Optional[str] = None) -> str:
  """A plain-text table; `align` has one char per column: 'l' or 'r' (default: first column left)."""
  cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
  widths = [max(len(strip_ansi(r[i])) for r in cells) for i in range(len(headers))]
  align = align or ("l" + "r" * (len(headers) - 1))
  def line(r: list[str]) -> str:
    out = []
    for i, c in enumerate(r):
      pad = widths[i] - len(strip_ansi(c))
      out.append(c + " " * pad if align[i] == "l" else " " * pad + c)
    return "  ".join(out).rstrip()
  sep = "  ".join("-" * w for w in widths)
  return "\n".join([line(cells[0]), sep] + [line(r) for r in cells[1:]])

def nonnegative_int(s: str) -> int:
  """argparse type: an int >= 0."""
  try: v = int(s)
  except ValueError: raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {s!r}") from None
  if v < 0: raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
  return v

def check_output_path(path: str, what: str) -> None:
  """Refuse (before any long work) an output path that can't be a file we write: a directory, or in a
  directory that doesn't exist. '-' is stdout."""
  if path == "-": return
  if os.path.isdir(path): raise CLIError(f"{what} {path} is a directory, not a file")
  parent = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(parent): raise CLIError(f"{what} {path}: directory {parent} does not exist")

def write_text(path: str, txt: str, what: str) -> None:
  """Write txt to path; an OSError becomes a CLIError naming the path (exit 1)."""
  try:
    with open(path, "w") as f: f.write(txt)
  except OSError as e: raise CLIError(f"can't write {what} {path}: {e.strerror or e}", code=1) from None

def first_line(e: BaseException) -> str:
  """'Type: first line of the message', for one-line reports of long errors (compiler output)."""
  msg = str(e).strip().splitlines()
  return f"{type(e).__name__}: {msg[0] if msg else ''}".rstrip(": ")

def compile_error_line(e: Any) -> str:
  """A CompileError in one line: its message and the compiler's first output line (or that it said nothing)."""
  out = next((ln.strip() for ln in (getattr(e, "stderr", "") or "").splitlines() if ln.strip()), "")
  return f"{e.msg}: {out}" if out else f"{e.msg} (the compiler printed nothing; is CC or CPU_COMPILER a working C compiler?)"

def open_device(name: Optional[str], runs: bool = True) -> str:
  """The canonical device name, opened; a CLIError (exit 2) saying why when it can't be used here
  (`runs`: kernels will run on it, so its target must be one this host executes)."""
  from tilecraft.device import Device, DeviceUnavailable
  try: dev = Device.canonicalize(name) if name else Device.DEFAULT
  except ValueError as e: raise CLIError(str(e)) from None
  try: opened = Device[dev]
  except DeviceUnavailable as e: raise CLIError(f"device {dev} can't be used here: {e}") from None
  if opened.render_only is not None:
    raise CLIError(f"device {dev} can't be used here: it is not available to run kernels, only to render and compile-check them ({opened.render_only})")
  try:  # a bad target setting (CPU_ARCH, or one this host can't run) is named here, not mid-run
    if runs: Device[dev].compiler.check_runnable()
    else: getattr(Device[dev].compiler, "target", None)
  except (ValueError, RuntimeError) as e: raise CLIError(str(e)) from None
  return dev
