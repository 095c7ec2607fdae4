"""Run ids, the steps of a run, timestamps and the code version a run records."""
from __future__ import annotations

import datetime as dt
import os
import re
import secrets
import subprocess

from sparkdeep.typed_yaml import ConfigError

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

#: The steps of a run, in order: each consumes the outputs of the ones before it.
STEPS = ("ingest", "prepare", "train", "score", "evaluate")


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def new_run_id() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def check_run_id(run_id: str) -> str:
    if not RUN_ID.match(run_id):
        raise ConfigError(f"--run-id {run_id!r}: use 1-128 letters, digits, '.', '_' or '-', "
                          "starting with a letter or digit")
    return run_id


def code_version() -> dict:
    """The package version and, from a checkout, the git commit (and whether it is dirty)."""
    from importlib import metadata
    try:
        package = metadata.version("sparkdeep")
    except metadata.PackageNotFoundError:
        package = None
    # sparkdeep/runs/ids.py -> the checkout (or site-packages, where git finds nothing)
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    commit = dirty = None
    try:
        commit = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
        if commit:
            dirty = bool(subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                                        capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return {"package": package, "git_commit": commit, "git_dirty": dirty}
