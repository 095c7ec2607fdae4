"""Where a benchmark's results go: one JSON file under bench/results/ (read by RESULTS.md)."""
import json
import os
import time


def write(path: str, results: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(results, fh, indent=2)
    print(f"wrote {path}")


def finish(path: str, results: dict, args) -> int:
    """Stamp ``results`` with the run's arguments and time, write them; the script's exit code."""
    results["config"] = vars(args)
    results["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write(path, results)
    return 0


def best_seconds(fn, repeat: int) -> float:
    """The shortest wall time of ``repeat`` calls of ``fn`` in this process."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best
