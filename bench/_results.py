"""Where a benchmark's results go: one JSON file under bench/results/ (read by RESULTS.md)."""
import json
import os


def write(path: str, results: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(results, fh, indent=2)
    print(f"wrote {path}")
