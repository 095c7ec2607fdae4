"""One line naming an error: what a failed job prints, a manifest records, a message quotes.

A JVM error reached through Py4J says ``An error occurred while calling o123.save`` and
hides the cause several exceptions down; :func:`error_line` names the root cause instead
(``java.io.IOException: No space left on device``). Anything else gives its first
non-empty line (Spark's own messages often begin with a newline).
"""
from __future__ import annotations


def error_line(exc: BaseException, *, typed: bool = True, limit: int | None = None) -> str:
    """One line for ``exc``: for a JVM error its root cause (or, where Hadoop wrapped the
    cause to name the address it failed to reach, that wrapper), else the first non-empty
    line of its text. ``typed`` puts the Python type in front (``Py4JJavaError: ...``);
    ``limit`` cuts the line to that many characters."""
    line = _jvm_line(exc)
    if line is None:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        line = lines[0] if lines else ""
    if typed:
        line = f"{type(exc).__name__}: {line}" if line else type(exc).__name__
    elif not line:
        line = type(exc).__name__
    return line[:limit] if limit else line


def _jvm_line(exc: BaseException) -> str | None:
    java = getattr(exc, "java_exception", None)
    if java is None:
        return None
    try:
        chain = [java]
        while chain[-1].getCause() is not None and len(chain) < 50:
            chain.append(chain[-1].getCause())
        root = chain[-1]
        text = str(root.toString())
        # Hadoop wraps a network error in one of the same class that names the address
        # ("Call From host to 127.0.0.1:8020 failed on connection exception: ...").
        if len(chain) > 1 and chain[-2].getClass().getName() == root.getClass().getName() and \
                str(root.getMessage() or "") in str(chain[-2].getMessage() or ""):
            text = str(chain[-2].toString())
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        return lines[0] if lines else None
    except Exception:  # noqa: BLE001 - the JVM may be gone: fall back to the Python text
        return None
