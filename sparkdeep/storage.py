"""One storage API for the output folder: local paths and Hadoop FileSystem URIs alike.

A path keeps its scheme: ``/data/out`` and ``file:///data/out`` are local (plain
``os`` calls, so nothing needs a JVM), ``hdfs://nn:8020/out``, ``s3a://bucket/out``,
``abfs://...`` go through the Hadoop ``FileSystem`` of the running Spark session (the
connectors and credentials Spark itself uses).

Writes of small files (manifests, reports, pointers) are atomic where the store allows:
a temporary file renamed over the target (POSIX ``rename``; HDFS ``FileContext.rename``
with ``OVERWRITE``); on object stores a single PUT is already all-or-nothing.

**The output lock** (:meth:`Storage.lock`): ``flock`` on a local file; elsewhere a lock
file created with ``overwrite=False`` (atomic create-if-absent on HDFS and other
file systems with a NameNode-like service) holding the owner, removed on release. On an
object store without conditional writes (S3 through ``s3a`` before Hadoop's
``fs.s3a.create.conditional.enabled``), create-if-absent is a check then a PUT, so two
writers starting in the same instant can both succeed: there, run one scheduler per
output folder, which is what the lock protects in the first place. A lock file left by a
killed process is taken over at once when that process ran on this host and is gone;
otherwise it is reported with its owner and age, and ``break_after_s`` takes it over.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from urllib.parse import urlparse

log = logging.getLogger(__name__)


class LockHeldError(RuntimeError):
    """Another process holds the lock; the message names its owner and since when."""


class ChecksumError(OSError):
    """A file that does not match its Hadoop ``.crc`` side file: changed or corrupted."""


def scheme(path: str) -> str:
    """``file`` for local paths (with or without ``file:``), else the URI scheme."""
    s = urlparse(path).scheme
    return "file" if s in ("", "file") or (len(s) == 1 and os.name == "nt") else s


def is_local(path: str) -> bool:
    return scheme(path) == "file"


def local(path: str) -> str:
    """A local path or ``file:`` URI as an absolute OS path (``~`` expanded).

    Raises ValueError for a ``file:`` URI naming a host: ``file://tmp/x`` means the host
    ``tmp``, not the folder ``/tmp/x`` (write ``file:///tmp/x``)."""
    if path.startswith("file:"):
        parsed = urlparse(path)
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"{path!r} names the host {parsed.netloc!r}; a local folder is file:///absolute/path "
                             "(three slashes) or a plain path")
        if not parsed.path:
            raise ValueError(f"{path!r} names no folder (an empty one would mean the current directory)")
        path = parsed.path
    return os.path.abspath(os.path.expanduser(path))


def qualify(path: str) -> str:
    """Local paths made absolute; URIs kept as they are (their scheme and authority)."""
    return local(path) if is_local(path) else path.rstrip("/")


def join(root: str, *parts: str) -> str:
    if is_local(root):
        return os.path.join(root, *parts)
    return "/".join([root.rstrip("/"), *(p.strip("/") for p in parts)])


class Storage:
    """Files under local paths or Hadoop URIs; ``spark`` is needed only for URIs."""

    def __init__(self, spark=None):
        self._sc = spark.sparkContext if spark is not None else None

    # -- the Hadoop side ---------------------------------------------------------------
    def _context(self):
        if self._sc is None:
            # The running SparkContext, from any thread (a thread's "active session" may be unset).
            from pyspark import SparkContext
            self._sc = SparkContext._active_spark_context
            if self._sc is None:
                raise RuntimeError("a Hadoop URI needs a running Spark session for its FileSystem")
        return self._sc

    def _jvm(self):
        sc = self._context()
        return sc._jvm, sc._jsc.hadoopConfiguration()

    def _fs(self, path: str):
        jvm, conf = self._jvm()
        hpath = jvm.org.apache.hadoop.fs.Path(path)
        return hpath.getFileSystem(conf), hpath

    # -- queries -----------------------------------------------------------------------
    def exists(self, path: str) -> bool:
        if is_local(path):
            return os.path.exists(local(path))
        fs, p = self._fs(path)
        return bool(fs.exists(p))

    def is_dir(self, path: str) -> bool:
        if is_local(path):
            return os.path.isdir(local(path))
        fs, p = self._fs(path)
        return bool(fs.exists(p) and fs.getFileStatus(p).isDirectory())

    def listdir(self, path: str) -> list[str]:
        """Names directly under ``path`` (sorted); FileNotFoundError when there is none."""
        if is_local(path):
            return sorted(os.listdir(local(path)))
        fs, p = self._fs(path)
        if not fs.exists(p):
            raise FileNotFoundError(f"no folder at {path!r}")
        return sorted(str(s.getPath().getName()) for s in fs.listStatus(p))

    def files(self, folder: str) -> list[str]:
        """Every file under ``folder``, as sorted paths relative to it ('/'-separated);
        FileNotFoundError when ``folder`` is not a folder. Local links are listed, not followed."""
        if is_local(folder):
            root = local(folder)
            if not os.path.isdir(root):
                raise FileNotFoundError(f"no folder at {folder!r}")
            found = []
            for here, dirs, names in os.walk(root):
                found += [os.path.relpath(os.path.join(here, n), root).replace(os.sep, "/") for n in names]
            return sorted(found)
        fs, p = self._fs(folder)
        if not (fs.exists(p) and fs.getFileStatus(p).isDirectory()):
            raise FileNotFoundError(f"no folder at {folder!r}")
        base = fs.makeQualified(p).toUri().getPath().rstrip("/") + "/"
        found, it = [], fs.listFiles(p, True)
        while it.hasNext():
            found.append(str(it.next().getPath().toUri().getPath())[len(base):])
        return sorted(found)

    def modified(self, path: str) -> float:
        """Last modification, seconds since the epoch."""
        if is_local(path):
            return os.path.getmtime(local(path))
        fs, p = self._fs(path)
        return fs.getFileStatus(p).getModificationTime() / 1000.0

    # -- changes -----------------------------------------------------------------------
    def makedirs(self, path: str) -> None:
        if is_local(path):
            os.makedirs(local(path), exist_ok=True)
            return
        fs, p = self._fs(path)
        fs.mkdirs(p)

    def delete(self, path: str, recursive: bool = True) -> None:
        """Remove ``path`` (a file, or a folder with what it holds); nothing there is fine."""
        if is_local(path):
            import shutil
            target = local(path)
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target) if recursive else os.rmdir(target)
            elif os.path.lexists(target):
                os.unlink(target)
            return
        fs, p = self._fs(path)
        fs.delete(p, recursive)

    def read_bytes(self, path: str) -> bytes:
        if is_local(path):
            with open(local(path), "rb") as fh:
                return fh.read()
        fs, p = self._fs(path)
        if not fs.exists(p):
            raise FileNotFoundError(f"no file at {path!r}")
        return self._copy_out(fs, p)

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` all at once: readers see the old file or the new one."""
        if is_local(path):
            target = local(path)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            tmp = f"{target}.tmp-{os.getpid()}"
            try:
                with open(tmp, "wb") as fh:
                    fh.write(data)
                os.replace(tmp, target)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            return
        jvm, conf = self._jvm()
        fs, p = self._fs(path)
        if scheme(path) in ("s3a", "s3", "gs", "wasb", "wasbs"):  # one PUT: already all-or-nothing
            self._put(fs, p, data, overwrite=True)
            return
        tmp = jvm.org.apache.hadoop.fs.Path(f"{path}.tmp-{os.getpid()}-{time.time_ns()}")
        self._put(fs, tmp, data, overwrite=True)
        try:
            context = jvm.org.apache.hadoop.fs.FileContext.getFileContext(p.toUri(), conf)
            options = self._context()._gateway.new_array(jvm.org.apache.hadoop.fs.Options.Rename, 1)
            options[0] = jvm.org.apache.hadoop.fs.Options.Rename.OVERWRITE
            context.rename(tmp, p, options)
        except Exception:
            fs.delete(tmp, False)
            raise

    @staticmethod
    def _put(fs, p, data: bytes, overwrite: bool) -> None:
        out = fs.create(p, overwrite)
        try:
            out.write(bytearray(data))
        finally:
            out.close()

    # -- checksummed files (a saved model's own files) ----------------------------------
    def write_checked(self, path: str, data: bytes) -> None:
        """Write through Hadoop's FileSystem even for a local path, so a ``.crc`` side file
        is written beside the bytes and :meth:`read_checked` can tell a changed file."""
        fs, p = self._fs(path)
        self._put(fs, p, data, overwrite=True)

    def read_checked(self, path: str) -> bytes:
        """The whole file at ``path``, its ``.crc`` side file verified where there is one.

        Raises FileNotFoundError (nothing at ``path``) or :class:`ChecksumError` (the bytes
        do not match the side file: changed or corrupted after they were written)."""
        fs, p = self._fs(path)
        if not fs.exists(p):
            raise FileNotFoundError(f"no file at {path!r}")
        try:
            return self._copy_out(fs, p)
        except Exception as exc:  # Py4JJavaError wrapping org.apache.hadoop.fs.ChecksumException
            if "ChecksumException" not in str(exc):
                raise
            raise ChecksumError(f"{path}: checksum failure (the file does not match its Hadoop .crc side "
                                "file: it was changed or corrupted after it was written)") from None

    def local_path(self, path: str) -> str | None:
        """``path`` on the local file system (a relative path resolved as Hadoop does), or
        None when it lives elsewhere (HDFS, S3...)."""
        fs, p = self._fs(path)
        uri = fs.makeQualified(p).toUri()
        return str(uri.getPath()) if uri.getScheme() == "file" else None

    def _copy_out(self, fs, p) -> bytes:
        stream = fs.open(p)
        try:
            jvm, _ = self._jvm()
            out = jvm.java.io.ByteArrayOutputStream()
            jvm.org.apache.hadoop.io.IOUtils.copyBytes(stream, out, 1 << 16, False)
            return bytes(out.toByteArray())
        finally:
            stream.close()

    def read_json(self, path: str):
        return json.loads(self.read_bytes(path).decode("utf-8"))

    def write_json(self, path: str, data) -> str:
        self.write_bytes(path, json.dumps(data, indent=2, sort_keys=True, default=str).encode("utf-8"))
        return path

    # -- the output lock ---------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, path: str, owner: str, break_after_s: float | None = None):
        """Hold the lock file ``path`` while the block runs, or raise :class:`LockHeldError`
        naming the holder. ``break_after_s``: take over a lock older than that (a holder
        killed before it could release; local locks die with their process anyway)."""
        if is_local(path):
            import fcntl
            target = local(path)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            fh = open(target, "a+")
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.seek(0)
                held = fh.read().strip()
                fh.close()
                raise LockHeldError(f"{path} is held by {held or 'another process'}") from None
            try:
                fh.seek(0)
                fh.truncate()
                fh.write(json.dumps(self._owner(owner)))
                fh.flush()
                yield
            finally:
                fh.truncate(0)  # a reader racing the next holder never sees this one's name
                fcntl.flock(fh, fcntl.LOCK_UN)
                fh.close()
            return
        fs, p = self._fs(path)
        body = json.dumps(self._owner(owner)).encode()
        if not self._create(fs, p, body):
            try:
                age = time.time() - self.modified(path)
                held = self.read_bytes(path).decode("utf-8", "replace")
            except Exception:  # noqa: BLE001 - released between the two calls: try once more
                if not self._create(fs, p, body):
                    raise LockHeldError(f"{path} is held by another process (it changed hands just now)") from None
            else:
                here = _holder_here(held)
                gone = here is False
                if here is True:
                    raise LockHeldError(f"{path} is held by {held}, a process alive on this host: not taken "
                                        "over whatever break_after_s says") from None
                if not gone and (break_after_s is None or age < break_after_s):
                    raise LockHeldError(f"{path} is held by {held} (for {age:.0f} s); if that process is gone, "
                                        "delete the file or pass break_after_s") from None
                self._take_over(fs, p, path, held, body)
                why = "its process is gone" if gone else f"held {age:.0f} s, past break_after_s"
                log.info("[lock] took over %s from %s (%s)", path, held, why)
        try:
            yield
        finally:
            fs.delete(p, False)

    def _create(self, fs, p, body: bytes) -> bool:
        """Create the file only if absent: True when this call created it."""
        try:
            self._put(fs, p, body, overwrite=False)
            return True
        except Exception as exc:  # FileAlreadyExistsException through Py4J
            # AlreadyBeingCreatedException: another creator (in this process: the same HDFS
            # client) is writing it right now, and the file may not be visible yet: lost too.
            if not any(k in str(exc) for k in ("AlreadyExists", "AlreadyBeingCreated")) and not fs.exists(p):
                raise
            return False

    def _take_over(self, fs, p, path: str, held: str, body: bytes) -> None:
        """Replace the stale lock ``held`` by ours. Takers-over exclude each other with a
        second create-if-absent file, ``<lock>.break``, and delete the lock only while it still
        holds what they judged stale: two of them never both win, nor does one delete the
        lock another has just taken."""
        jvm, _ = self._jvm()
        breaker = jvm.org.apache.hadoop.fs.Path(f"{path}.break")
        if not self._create(fs, breaker, body):
            try:
                if time.time() - fs.getFileStatus(breaker).getModificationTime() / 1000.0 > 60:
                    fs.delete(breaker, False)  # a taker-over that died mid-way (it takes milliseconds)
            except Exception:  # noqa: BLE001 - gone meanwhile
                pass
            raise LockHeldError(f"{path}: another process is taking over this stale lock now") from None
        try:
            try:
                current = self.read_bytes(path).decode("utf-8", "replace")
            except FileNotFoundError:
                current = None
            if current is not None and current != held:
                raise LockHeldError(f"{path} is held by {current}")
            if current is not None:
                fs.delete(p, False)
            if not self._create(fs, p, body):
                raise LockHeldError(f"{path} was taken by another process just now")
        finally:
            fs.delete(breaker, False)

    @staticmethod
    def _owner(owner: str) -> dict:
        return {"owner": owner, "host": socket.gethostname(), "pid": os.getpid(),
                "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _holder_here(held: str) -> bool | None:
    """For a lock file's holder on this host: True when its process is alive, False when it
    is gone (a run killed before it could release); None for another host or unreadable."""
    try:
        info = json.loads(held)
        if info.get("host") != socket.gethostname():
            return None
        os.kill(int(info["pid"]), 0)
    except ProcessLookupError:
        return False
    except (ValueError, KeyError, TypeError, AttributeError, OSError):
        return None
    return True
