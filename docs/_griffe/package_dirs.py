"""Griffe extension: load the sub-packages that pyproject.toml maps to other folders.

``pyproject.toml`` installs ``jobs/`` as ``sparkdeep.jobs``, ``transformers/`` as
``sparkdeep.transformers`` and so on (``[tool.setuptools.package-dir]``). Griffe finds a
package by its top-level folder (``sparkdeep/``) and walks only that folder, so it never
sees the mapped ones, statically or through the editable install. This extension, named in
``mkdocs.yml``, loads each mapped folder under its installed name once ``sparkdeep`` is
loaded, from the source files: nothing is imported, so the build needs no TensorFlow or
Spark start-up.
"""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import griffe

ROOT = Path(__file__).resolve().parents[2]

#: A reST cross-reference role as the docstrings write them (``:func:`name```, ``:class:`~a.B```).
_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|exc|obj|const):`(~?)([^`]+)`")


def markdown_roles(text: str) -> str:
    """The docstring with each reST role as a Markdown code span (``:func:`a.f``` -> `` `a.f` ``;
    a ``~`` keeps the last name only and a relative ``.name`` loses its dot, as Sphinx shows
    them): Markdown pages would show the role as typed.

    >>> markdown_roles("see :func:`sparkdeep.conf.base_section` and :class:`~a.b.C`")
    'see `sparkdeep.conf.base_section` and `C`'
    """
    return _ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2).lstrip('.')}`", text)


def mapped_packages(root: Path = ROOT) -> dict[str, Path]:
    """``{"sparkdeep.jobs": <root>/jobs, ...}``: the folders pyproject.toml maps under
    ``sparkdeep`` (other than ``sparkdeep/`` itself), each holding an ``__init__.py``."""
    table = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {name: root / folder for name, folder in table.items()
            if name.startswith("sparkdeep.") and (root / folder / "__init__.py").is_file()}


class PackageDirs(griffe.Extension):
    """Attach each mapped folder to the ``sparkdeep`` package griffe loaded, and write each
    docstring's reST roles as Markdown (:func:`markdown_roles`)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_roles(obj.docstring.value)

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs) -> None:
        if pkg.name != "sparkdeep":
            return
        for name, folder in mapped_packages().items():
            child = name.split(".", 1)[1]
            if child in pkg.members:
                continue
            # griffe has no public call that loads a folder under another name; this is the
            # one its own loader uses for a package's sub-packages (griffelib pinned in lock.txt).
            module = loader._load_module(child, folder / "__init__.py", submodules=True, parent=pkg)
            pkg.set_member(child, module)
