"""Serve: score rows over HTTP with an export, no Spark.

Runs :func:`sparkdeep.pipelines.serve.create_app` under uvicorn: ``POST /predict``,
``GET /health``, ``GET /schema``. The export is an ``--export`` folder, or, under
``<output-dir>/export/`` (the export job writes ``export/<run id>/``), the promoted model's
(``models/latest.json``); with no model promoted there, the newest (by the time its
``schema.json`` was written). Ctrl-C or SIGTERM lets the requests under way
finish, then the process exits 0.

  python -m sparkdeep.jobs.serve --output-dir output --port 8080
  curl -s localhost:8080/predict -d '{"rows": [{"colour": "red", "x.a": 0.3}]}'
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from sparkdeep import logs
from sparkdeep.jobs._common import add_traceback, add_verbosity, failed, prog
from sparkdeep.paths import Paths, read_json
from sparkdeep.pipelines.export import EXPORT_DIR, SCHEMA_FILE, promoted_export_id
from sparkdeep.registry import Models
from sparkdeep.pipelines.serve import ServeOptions

# Named, not __name__: under `python -m` this module is "__main__", outside the
# sparkdeep logger and its handler.
log = logging.getLogger("sparkdeep.jobs.serve")

class BadPath(ValueError):
    """An --export or --output-dir that holds no export."""


def main(argv: list[str] | None = None) -> int:
    """``python -m sparkdeep.jobs.serve (--export DIR | --output-dir OUT) [options]``: serve
    the export over HTTP until stopped; returns the exit status (in ``--help``)."""
    defaults = ServeOptions()
    p = argparse.ArgumentParser(prog=prog("serve"), description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="exit status: 0 stopped (SIGTERM, Ctrl-C) after answering the requests under "
                                       "way, 1 the server failed, 2 bad arguments or no export at the path.")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--export", metavar="DIR", help="the export folder to serve (model.keras, schema.json)")
    where.add_argument("--output-dir", metavar="OUT", help="serve the promoted model's export under OUT/export/ (the newest when none is promoted)")
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=8080, help="the port (default: %(default)s)")
    p.add_argument("--max-batch-rows", type=int, default=defaults.max_batch_rows,
                   help="rows scored in one forward pass at most (default: %(default)s)")
    p.add_argument("--max-wait-ms", type=float, default=defaults.max_wait_ms,
                   help="how long a request waits for others to batch with (default: %(default)s)")
    p.add_argument("--max-body-bytes", type=int, default=defaults.max_body_bytes,
                   help="the largest request body (413 beyond; default: %(default)s)")
    p.add_argument("--max-request-rows", type=int, default=defaults.max_request_rows,
                   help="the most rows in one request (413 beyond; default: %(default)s)")
    p.add_argument("--ignore-unknown", action="store_true",
                   help="ignore columns the export does not know instead of refusing the request (422)")
    p.add_argument("--eager", action="store_true",
                   help="run the model eagerly, as ExportedModel.predict does, not as a traced graph (slower)")
    add_traceback(p)
    add_verbosity(p)
    args = p.parse_args(argv)
    logs.quiet_native(args.verbose)
    with logs.verbosity(args.quiet, args.verbose):
        return _serve(args)


def find_export(export: str | None, output_dir: str | None) -> str:
    """The export folder to serve: ``export`` itself; else, under ``output_dir``, the export
    of the promoted model (``models/latest.json``), or the newest export when none is promoted."""
    if export is not None:
        if not os.path.isfile(os.path.join(export, SCHEMA_FILE)):
            raise BadPath(f"--export {export!r} holds no {SCHEMA_FILE}: give a folder the export job wrote "
                          f"(<output>/{EXPORT_DIR}/<run id>)")
        return os.path.abspath(export)
    root = os.path.join(output_dir, EXPORT_DIR)
    run_export = f"`sparkdeep export --output-dir {output_dir}`"
    latest = read_json(Paths.under(output_dir).latest)
    if latest and Models.PIPELINE in latest.get("models", {}):
        folder = os.path.join(root, promoted_export_id(latest))
        if not os.path.isfile(os.path.join(folder, SCHEMA_FILE)):
            # Never an older model's export in the promoted one's place.
            raise BadPath(f"--output-dir {output_dir!r}: the promoted model (run {latest['run_id']!r}) has no "
                          f"export at {folder}: run {run_export}, or name a folder with --export")
        return os.path.abspath(folder)
    found = [os.path.join(root, d) for d in (os.listdir(root) if os.path.isdir(root) else [])
             if not d.startswith(".") and os.path.isfile(os.path.join(root, d, SCHEMA_FILE))]
    if not found:
        raise BadPath(f"--output-dir {output_dir!r} has no export under {root}: run {run_export} first")
    return os.path.abspath(max(found, key=lambda d: os.path.getmtime(os.path.join(d, SCHEMA_FILE))))


def _serve(args: argparse.Namespace) -> int:
    try:
        folder = find_export(args.export, args.output_dir)
        options = ServeOptions(max_batch_rows=args.max_batch_rows, max_wait_ms=args.max_wait_ms,
                               max_body_bytes=args.max_body_bytes, max_request_rows=args.max_request_rows,
                               ignore_unknown=args.ignore_unknown, traced=not args.eager)
        if not 0 <= args.port < 65536:
            raise BadPath(f"--port {args.port} is not a port (0-65535)")
    except ValueError as exc:
        log.error("serve: %s", exc)
        return 2
    try:
        import uvicorn

        from sparkdeep.pipelines.serve import create_app
        log.info("[serve] %s on http://%s:%s (POST /predict, GET /health, GET /schema)", folder, args.host, args.port)
        config = uvicorn.Config(create_app(folder, options), host=args.host, port=args.port,
                                log_level="info" if args.verbose else "warning", access_log=args.verbose,
                                lifespan="on")
        server = uvicorn.Server(config)
        # uvicorn drains on SIGINT/SIGTERM, then raises the signal again to the handler it
        # found: this one notes it, so a drained stop exits 0 instead of dying by the signal.
        caught: list[int] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda number, frame: caught.append(number))
        try:
            server.run()
        except SystemExit:  # uvicorn exits (status 3) when it cannot bind: a port in use, a bad host
            server.started = False
        if not server.started:
            log.error("serve: failed: the server did not start on %s:%s (see above)", args.host, args.port)
            return 1
        log.info("[serve] stopped%s: the requests under way were answered",
                 f" on {signal.Signals(caught[0]).name}" if caught else "")
    except Exception as exc:  # noqa: BLE001 - one line for schedulers, details on request
        return failed("serve", exc, args.traceback)
    return 0


if __name__ == "__main__":
    sys.exit(main())
