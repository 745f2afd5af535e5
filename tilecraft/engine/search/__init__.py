"""Beam search over Opts, imported only when a search runs (BEAM=n, `tilecraft tune`).

  beam_search(kernel, bufs, amt, allow_test_size=True, ...) -> Kernel   (API)
  get_kernel_actions(kernel, include_0=True) -> dict[int, Kernel]
  last_report: the SearchReport of the latest search in this process

One module per concern:
  actions.py  the action grid, the register/thread caps, the kernels one action away
  worker.py   the jobs a worker process runs: build (render + compile), time, race, verify
  db.py       the sqlite cache of results and per-candidate timings
  beam.py     the search: seeds, rounds, timing relative to the hand-coded kernel, verification
Worker processes (spawn, framing, timeouts, crash reports) come from tilecraft.engine.isolation.
"""
from typing import Any
from tilecraft.engine.search.actions import ACTIONS, get_kernel_actions, kernel_caps_ok  # noqa: F401
from tilecraft.engine.search.beam import SEARCH_VERSION, Candidate, SearchReport, beam_search, close_workers  # noqa: F401
from tilecraft.engine.search.db import SearchDB, cache_db_path, close_cache_dbs  # noqa: F401
from tilecraft.engine.search import beam as _beam

def __getattr__(name: str) -> Any:
  if name == "last_report": return _beam.last_report  # reassigned by every search: read it where it lives
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
