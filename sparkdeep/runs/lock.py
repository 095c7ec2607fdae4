"""The output lock: one run at a time writes an output folder."""
from __future__ import annotations

import json
import time
from typing import Any

from sparkdeep import storage
from sparkdeep.storage import LockHeldError, Storage


class OutputLocked(RuntimeError):
    """Another run holds the output folder."""


class OutputLock:
    """An exclusive lock on an output folder for the life of a run: :meth:`Storage.lock`
    on ``<output>/.lock``, with the run as its owner.

    Local folders: ``flock``, which the kernel drops when the process dies. Hadoop URIs
    (``hdfs://``...), where ``flock`` means nothing: the lock file is created only if absent
    and deleted on release; one left by a run killed on this host is taken over, one from
    another host is reported with its owner and age (``break_stale``, the command line's
    ``--break-lock``, takes it over once that run is known to be gone). ``wait_s``: how long
    to wait for a holder to finish before failing.
    """

    def __init__(self, root: str, run_id: str, wait_s: float = 0.0, break_stale: bool = False):
        self.root = root
        self.path = storage.join(root, ".lock")
        self.run_id = run_id
        self.wait_s = wait_s
        self.break_stale = break_stale
        self._held = None

    def __enter__(self) -> "OutputLock":
        remote = not storage.is_local(self.root)
        deadline = time.monotonic() + self.wait_s
        while True:
            held = Storage().lock(self.path, owner=f"run {self.run_id}",
                                  break_after_s=0 if self.break_stale and remote else None)
            try:
                held.__enter__()
            except LockHeldError:
                if time.monotonic() >= deadline:
                    raise self._locked(remote) from None
                time.sleep(1.0 if remote else 0.5)
                continue
            self._held = held
            return self

    def _locked(self, remote: bool) -> OutputLocked:
        try:
            holder = json.loads(Storage().read_bytes(self.path) or b"{}")
        except Exception:  # noqa: BLE001 - released meanwhile, or not a holder we wrote
            holder = {}
        run_id = str(holder.get("owner", "?")).removeprefix("run ")
        waited = f" after waiting {self.wait_s:.0f}s" if self.wait_s else ""
        stale = (f"; if that run is gone (killed on another host), pass --break-lock (or delete {self.path})"
                 if remote else "")
        return OutputLocked(
            f"output {self.root!r} is in use by run {run_id!r} (pid {holder.get('pid', '?')} on "
            f"{holder.get('host', '?')}, since {holder.get('since', '?')}){waited}; wait for it, or pass "
            f"--wait-lock SECONDS{stale}")

    def __exit__(self, *exc: Any) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            held.__exit__(None, None, None)
