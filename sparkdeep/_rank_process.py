"""One training rank as a process: ``python -m sparkdeep._rank_process WORKDIR``.

Started by its Spark barrier task (:func:`sparkdeep.distributed._rank_task`), which wrote
``WORKDIR/call.pkl`` (the function and its arguments, pickled on this run's driver) and
set its variables (``SPARKDEEP_RANK``, and its backend's: Horovod's or ``TF_CONFIG``). Beats to the driver while it runs; writes ``result.pkl``, or on
an exception ``failure.txt`` and exits 1. The exception's one line (its type, message and
the frame in the user's code, :func:`sparkdeep.errors.error_line`) goes to the driver with
the full traceback, which the driver shows on request (a job's ``--traceback``); on the
rank's standard error (the Spark task's log, in local mode the console) only when the
driver could not be told.
"""
from __future__ import annotations

import os
import sys
import time
import traceback

_STARTED = time.time()  # before any import of ours: the interpreter's own start is the gap before it


def main(work: str) -> int:
    from sparkdeep.channel import _BEAT_ENV, FAST_EXIT_ENV, PROCESS_START_ENV, RANK_ENV, heartbeat, send_failure
    from sparkdeep.errors import error_line
    from sparkdeep.logs import install_default

    install_default()  # the rank's lines (epochs, early stop) reach the task's console like a job's

    os.environ[PROCESS_START_ENV] = repr(_STARTED)
    rank = os.environ.get(RANK_ENV, "?")
    setting = os.environ.get(_BEAT_ENV, "")
    if setting:
        heartbeat(rank, setting)
    import cloudpickle
    try:
        with open(os.path.join(work, "call.pkl"), "rb") as fh:
            fn, args, kwargs = cloudpickle.load(fh)
        result = fn(*args, **kwargs)
        data = cloudpickle.dumps(result)
    except BaseException as exc:  # noqa: BLE001 - reported, then the process exits 1
        message = error_line(exc, whole=True, where=True)
        details = "".join(traceback.format_exception(exc))
        with open(os.path.join(work, "failure.txt"), "w") as fh:
            fh.write(message)
        told = False
        if setting:
            try:
                send_failure(setting, rank, message, details)
                told = True
            except OSError:
                pass  # the task still reports failure.txt with the stage
        if not told:
            sys.stderr.write(details)  # kept in the task's log
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)  # no atexit hooks: a backend's shutdown may block on a peer that is gone
    with open(os.path.join(work, "result.pkl.tmp"), "wb") as fh:
        fh.write(data)
    os.replace(os.path.join(work, "result.pkl.tmp"), os.path.join(work, "result.pkl"))
    sys.stdout.flush()
    sys.stderr.flush()
    if os.environ.get(FAST_EXIT_ENV) == "1":
        # The rank's backend has shut down with its peers (the strategy said so): nothing left
        # for the interpreter's teardown of TensorFlow to do but spend 1-2 s (measured).
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
