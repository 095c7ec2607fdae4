"""The layered YAML config (base + per-environment overlays), installed as ``sparkdeep.conf`` so a wheel carries it.

:func:`base_section` reads the shipped ``base/pipeline.yaml`` itself (never a user's overlay):
the library's own defaults (the estimator's) are these settings, so each default has one home.
"""
from __future__ import annotations

import copy
import functools
import importlib.resources

import yaml


def base_section(section: str) -> dict:
    """One top-level section of the shipped ``base/pipeline.yaml``, parsed (a copy: the
    caller may change it).

    Read through :mod:`importlib.resources`, so it works from a checkout, a wheel and a
    ``--py-files`` zip alike.

    >>> base_section("train")["strategy"]
    'horovod'
    """
    tree = _base()
    if section not in tree:
        raise KeyError(f"the shipped conf/base/pipeline.yaml has no section {section!r}")
    return copy.deepcopy(tree[section])


@functools.lru_cache(maxsize=1)
def _base() -> dict:
    text = importlib.resources.files(__name__).joinpath("base", "pipeline.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text) or {}
