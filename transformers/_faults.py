"""Failures injected into ranks, for the tests of recovery (killed, frozen, raising ranks).

Off unless ``SPARKDEEP_TEST_FAIL_AT_EPOCH`` is set in the ranks' environment:
``RANK:EPOCH`` makes that rank raise after that epoch; ``RANK:EPOCH:exit`` kills it (no
Python exception); ``RANK:EPOCH:stop`` freezes it (SIGSTOP), as a hung host would. The
training loop calls :func:`after_epoch_hook`'s result and knows nothing else of this.
"""
from __future__ import annotations

import os
import signal
from typing import Callable

FAIL_AT_EPOCH_ENV = "SPARKDEEP_TEST_FAIL_AT_EPOCH"


def after_epoch_hook() -> Callable[[int, int], None] | None:
    """``hook(rank, epoch)`` to call after each finished epoch, or None when nothing is injected."""
    setting = os.environ.get(FAIL_AT_EPOCH_ENV, "")
    if not setting:
        return None
    parts = setting.split(":")
    if len(parts) not in (2, 3) or not (parts[0].isdigit() and parts[1].isdigit()) or \
            (len(parts) == 3 and parts[2] not in ("exit", "stop")):
        raise ValueError(f"{FAIL_AT_EPOCH_ENV}={setting!r}: use RANK:EPOCH, RANK:EPOCH:exit or RANK:EPOCH:stop")
    rank_at, epoch_at, how = int(parts[0]), int(parts[1]), parts[2] if len(parts) == 3 else "raise"

    def hook(rank: int, epoch: int) -> None:
        if (rank, epoch) != (rank_at, epoch_at):
            return
        if how == "exit":
            os._exit(3)  # a rank that dies without a Python exception
        if how == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)  # frozen: no exit, no error, no heartbeat
            return
        raise RuntimeError(f"injected failure after epoch {epoch} ({FAIL_AT_EPOCH_ENV})")
    return hook
