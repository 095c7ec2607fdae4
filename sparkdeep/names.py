"""Column names a user's table may have, and the internal names the pipeline works with.

Exported data names columns ``x.GENE1``, ``Price (USD)``, ``weight kg`` or ``Größe``.
Spark reads them all, but Delta refuses some characters in a column name (space and
``,;{}()=``, tab, newline) and MLlib stages read a ``.`` as a struct field. Ingest maps
each such name to an internal one (:func:`internal_name`: every run of those characters,
and backticks, becomes one ``_``) and records the original in the column's metadata
(:data:`ORIGINAL_NAME`), so every later step can show it: the saved model's first stage
(:class:`~sparkdeep.transformers.columns.ColumnRenamer`) accepts rows under the original
names, and reports translate back with :func:`display`.

Two names that meet after mapping (``a.b`` and ``a_b``; or ``A b`` and ``a_b``, since
Spark does not tell case apart) are an error naming both: no silent merge.
"""
from __future__ import annotations

import re
from typing import Iterable, Mapping

#: The characters Delta refuses in a column name, ``.`` (a struct field for MLlib) and the
#: backtick (Spark's quote).
UNSAFE = " ,;{}()\n\t=.`"
_UNSAFE_RUN = re.compile("[" + re.escape(UNSAFE) + "]+")
#: The key of a column's metadata that holds its name in the source.
ORIGINAL_NAME = "sparkdeep.original_name"


class NameCollision(ValueError):
    """Two source columns map to the same internal name (ignoring case)."""


def internal_name(name: str) -> str:
    """``name`` with every run of unsafe characters as one ``_`` (unchanged when safe)."""
    return _UNSAFE_RUN.sub("_", name) if any(ch in UNSAFE for ch in name) else name


def mapping(columns: Iterable[str], where: str = "") -> dict[str, str]:
    """``{original: internal}`` for every column whose name changes.

    Raises :class:`NameCollision` naming both columns when two of them would share an
    internal name, ignoring case (Spark resolves names case-insensitively)."""
    seen: dict[str, str] = {}
    out: dict[str, str] = {}
    for c in columns:
        safe = internal_name(c)
        low = safe.lower()
        if low in seen:
            other = seen[low]
            raise NameCollision(
                f"source columns {other!r} and {c!r}{f' ({where})' if where else ''} both become the internal "
                f"name {safe!r} (characters Delta or MLlib refuse become '_', and case is not told apart): "
                "rename one of them, or add one to features.exclude")
        seen[low] = c
        if safe != c:
            out[c] = safe
    return out


def quoted(name: str) -> str:
    """``name`` quoted for ``F.col``/SQL: a backtick inside doubles."""
    return "`" + name.replace("`", "``") + "`"


def sql_string(text: str) -> str:
    """``text`` as a Spark SQL string literal (backslash and quote escaped)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def originals(schema) -> dict[str, str]:
    """``{internal: original}`` from a Spark schema's column metadata (empty when no column was renamed)."""
    return {f.name: f.metadata[ORIGINAL_NAME] for f in schema.fields if ORIGINAL_NAME in (f.metadata or {})}


def display(name: str, originals_: Mapping[str, str]) -> str:
    """An internal (or derived) name as the user knows it: ``x_GENE1__imp`` -> ``x.GENE1__imp``.

    A derived name is a column's internal name, ``__`` and a suffix the stages add; the
    longest prefix that ``originals_`` knows is translated. Give it every column of the
    table (unrenamed ones mapping to themselves), so that a safe name such as ``a_b__d``
    is not read as the renamed ``a_b`` plus a suffix."""
    if not originals_:
        return name
    if name in originals_:
        return originals_[name]
    head, sep, tail = name.partition(" (")  # "<column> (bins)"
    if sep and head in originals_:
        return originals_[head] + sep + tail
    cut = name.rfind("__")
    while cut > 0:
        base = name[:cut]
        if base in originals_:
            return originals_[base] + name[cut:]
        cut = name.rfind("__", 0, cut)
    return name


def display_all(names: Iterable[str], originals_: Mapping[str, str]) -> list[str]:
    return [display(n, originals_) for n in names]
