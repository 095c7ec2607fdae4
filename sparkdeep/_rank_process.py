"""One training rank as a process: ``python -m sparkdeep._rank_process WORKDIR``.

Started by its Spark barrier task (:func:`sparkdeep.distributed._rank_task`), which wrote
``WORKDIR/call.pkl`` (the function and its arguments, pickled on this run's driver) and
set its variables (``SPARKDEEP_RANK``, and its backend's: Horovod's or ``TF_CONFIG``). Beats to the driver while it runs; writes ``result.pkl``, or on
an exception ``failure.txt`` (also sent to the driver) and exits 1.
"""
from __future__ import annotations

import os
import sys
import time
import traceback

_STARTED = time.time()  # before any import of ours: the interpreter's own start is the gap before it


def main(work: str) -> int:
    from sparkdeep.distributed import _BEAT_ENV, FAST_EXIT_ENV, PROCESS_START_ENV, RANK_ENV, heartbeat, send

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
        message = f"{type(exc).__name__}: {exc}".replace("\n", " | ")
        traceback.print_exc(file=sys.stderr)
        with open(os.path.join(work, "failure.txt"), "w") as fh:
            fh.write(message)
        if setting:
            try:
                send(setting, "fail", rank, message)
            except OSError:
                pass  # the task reports failure.txt with the stage
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
