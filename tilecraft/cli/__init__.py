"""The `tilecraft` command line: one module per subcommand (bench, show, devices, fuzz, tune,
calibrate, roofline). This file holds what they share: progress lines on stderr, table
formatting, opt formatting and opening a device with a readable error."""
from __future__ import annotations
import os, re, sys, time
from typing import Any, Iterable, Optional, Sequence, TextIO

_ANSI = re.compile(r"\x1b\[[0-9;]*m")

def strip_ansi(s: str) -> str:
  """`s` without terminal color codes."""
  return _ANSI.sub("", s)

def use_color(stream: TextIO = sys.stdout) -> bool:
  """Colors only on a terminal, and never with NO_COLOR set."""
  return "NO_COLOR" not in os.environ and hasattr(stream, "isatty") and stream.isatty()

class CLIError(Exception):
  """A user-facing error: printed without a traceback, exits with `code`."""
  def __init__(self, msg: str, code: int = 2):
    super().__init__(msg)
    self.code = code

class Progress:
  """Progress on stderr: one rewritten line on a terminal, plain lines otherwise; silent when disabled."""
  def __init__(self, enabled: bool = True, total: int = 0, stream: TextIO = sys.stderr):
    self.enabled, self.total, self.stream = enabled, total, stream
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

def open_device(name: Optional[str]) -> str:
  """The canonical device name, opened; a CLIError (exit 2) saying why when it can't be used here."""
  from tilecraft.device import Device, DeviceUnavailable
  try: dev = Device.canonicalize(name) if name else Device.DEFAULT
  except ValueError as e: raise CLIError(str(e)) from None
  try: opened = Device[dev]
  except DeviceUnavailable as e: raise CLIError(f"device {dev} can't be used here: {e}") from None
  if opened.render_only is not None:
    raise CLIError(f"device {dev} can't be used here: it is not available to run kernels, only to render and compile-check them ({opened.render_only})")
  try: getattr(Device[dev].compiler, "target", None)  # a bad target setting (CPU_ARCH) is named here, not mid-run
  except ValueError as e: raise CLIError(str(e)) from None
  return dev
