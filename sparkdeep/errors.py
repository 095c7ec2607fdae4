"""One line naming an error: what a failed job prints, a manifest records, a message quotes.

A JVM error reached through Py4J says ``An error occurred while calling o123.save`` and
hides the cause several exceptions down; :func:`error_line` names the root cause instead
(``java.io.IOException: No space left on device``). A Python worker's error reached through
Spark carries the worker's traceback; its line is the traceback's own error line. An error
TensorFlow raised while tracing or running a ``tf.function`` lists the traced code's frames
in its message (``in user code: ... File "...", line 312, in fused``, or ``Graph execution
error: ... defined at``); its line is the error itself. Anything else gives its first
non-empty line (Spark's own messages often begin with a newline).

:func:`user_frame` names where the error arose for the one who can fix it: the innermost
frame in the project's or the user's own code, not in TensorFlow, Keras, Horovod, Spark or
the standard library (a rank's failure quotes it: ``(at transformers/keras/rank_loop.py:312
in fused)``).
"""
from __future__ import annotations

import functools
import os
import re
import site
import sys
import sysconfig

# TensorFlow's messages that list the traced code's frames, and the frames they list.
_TF_LISTINGS = ("in user code:", "Graph execution error:")
_LISTED_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)', re.M)
_PY_TRACEBACK = "Traceback (most recent call last):"
# Where the project's own modules live: the folder above this package (a checkout's root,
# or the site-packages or --py-files archive the package was installed in).
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def error_line(exc: BaseException, *, typed: bool = True, limit: int | None = None, whole: bool = False,
               where: bool = False) -> str:
    """One line for ``exc``: for a JVM error its root cause (or, where Hadoop wrapped the
    cause to name the address it failed to reach, that wrapper), for a Python worker's or a
    ``tf.function``'s error the error itself, else the first non-empty line of its text.
    ``typed`` puts the Python type in front (``Py4JJavaError: ...``); ``whole`` keeps every
    line of a plain message, joined by ``" | "``; ``where`` appends the frame
    :func:`user_frame` names (``(at path:line in function)``); ``limit`` cuts the line to
    that many characters.

    Examples
    --------
    >>> error_line(ValueError("\\nshard 7 is corrupt\\nrows 10-20"))
    'ValueError: shard 7 is corrupt'
    >>> error_line(ValueError("shard 7 is corrupt\\nrows 10-20"), whole=True, typed=False)
    'shard 7 is corrupt | rows 10-20'
    """
    line = _jvm_line(exc)
    if line is None:
        line = _message_line(str(exc), type(exc).__name__, whole)
    if typed:
        line = f"{type(exc).__name__}: {line}" if line else type(exc).__name__
    elif not line:
        line = type(exc).__name__
    frame = user_frame(exc) if where else None
    if frame:
        line += f" (at {frame})"
    return line[:limit] if limit else line


def user_frame(exc: BaseException) -> str | None:
    """``path:line in function`` of the innermost frame of ``exc`` in the project's or the
    user's own code (TensorFlow's listing of the traced code when its message has one, else
    the traceback; then the exception it was raised from), or None when every frame is a
    library's. A path in the project is shown from its root (``transformers/keras/...``)."""
    seen: set = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        own = [f for f in _frames(exc) if _own(f[0], f[3])]
        if own:
            filename, lineno, function, _ = own[-1]
            return f"{_shown(filename)}:{lineno} in {function}"
        exc = exc.__cause__ or exc.__context__
    return None


def _message_line(text: str, type_name: str, whole: bool) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return ""
    if lines[0] in _TF_LISTINGS:
        # The listed frames (each with its code line, indented deeper), then the error,
        # indented no deeper than the frames.
        raw = text.splitlines()
        frames = [i for i, ln in enumerate(raw) if _LISTED_FRAME.match(ln)]
        if frames:
            indent = _indent(raw[frames[-1]])
            body = [ln for ln in raw[frames[-1] + 1:] if ln.strip()]
            start = next((i for i, ln in enumerate(body) if _indent(ln) <= indent), None)
            if start is not None:
                lines = [body[start].strip().removeprefix(f"{type_name}: "), *(ln.strip() for ln in body[start + 1:])]
    elif _PY_TRACEBACK in text:  # a Python worker's traceback: its first unindented line after it
        after = text[text.index(_PY_TRACEBACK) + len(_PY_TRACEBACK):].splitlines()
        found = next((ln.strip() for ln in after if ln[:1].strip()), None)
        if found:
            return found
    return " | ".join(lines) if whole else lines[0]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _frames(exc: BaseException) -> list[tuple[str, int, str, str | None]]:
    """``(file, line, function, module or None)``, outermost first."""
    text = str(exc).lstrip()
    if text.startswith(_TF_LISTINGS):
        modules = {os.path.realpath(m.__file__): name for name, m in list(sys.modules.items())
                   if isinstance(getattr(m, "__file__", None), str)}
        listed = [(f, int(n), fn, modules.get(os.path.realpath(f))) for f, n, fn in _LISTED_FRAME.findall(text)]
        if listed:
            return listed
    frames, tb = [], exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append((code.co_filename, tb.tb_lineno, code.co_name, tb.tb_frame.f_globals.get("__name__")))
        tb = tb.tb_next
    return frames


def _own(filename: str, module: str | None) -> bool:
    """The project's code (wherever it is installed), or the user's: not a library's, not
    the standard library's, not code generated at run time (AutoGraph's copies, ``<string>``)."""
    if module is not None and module.split(".")[0] == "sparkdeep":
        return True
    if filename.startswith("<") or "__autograph_generated_file" in filename:
        return False
    path = os.path.realpath(filename)
    return not any(path.startswith(folder) for folder in _library_folders())


@functools.lru_cache(maxsize=1)
def _library_folders() -> tuple[str, ...]:
    folders = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    folders.update(getattr(site, "getsitepackages", list)())
    folders.add(getattr(site, "getusersitepackages", str)())
    return tuple(os.path.join(os.path.realpath(f), "") for f in folders if f)


def _shown(filename: str) -> str:
    """From the project's root, or the working folder, when under it; else as it is."""
    path = os.path.abspath(filename)
    for base in (_ROOT, os.getcwd()):
        if path.startswith(os.path.join(base, "")):
            return os.path.relpath(path, base)
    return filename


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
