"""Score rows over HTTP with an export, without Spark.

:func:`create_app` builds an ASGI app (Starlette) from an export folder
(:func:`sparkdeep.pipelines.export.export_pipeline`); ``python -m sparkdeep.jobs.serve``
runs it under uvicorn. The export is loaded once, when the server starts (the lifespan):

- ``POST /predict`` takes ``{"rows": [{column: value, ...}, ...]}``, a JSON list of rows, or
  one row object alone, under the source's column names, and answers
  ``{"predictions": [...]}``, one object per row in the request's order, with the columns
  batch scoring (``predictions_frame``) gives the task:

  - binary: ``probability`` (P(class 1)) and ``prediction`` (0 or 1, as the network's
    stage decides it: ``p >= 0.5`` for one sigmoid unit, the first argmax of two);
  - multiclass: ``probability`` (one per class, in class order), ``prediction`` (the class
    index) and ``predicted_class`` (its name, where the export names the classes);
  - regression: ``prediction``, in the target's units.
- ``GET /health``: 200 ``{"status": "ok", ...}`` once the export is loaded;
- ``GET /schema``: the export's ``schema.json``.

Why micro-batching: one forward pass over 64 rows costs about what one over 1 row does, so
concurrent requests are queued and scored together, up to ``max_batch_rows`` rows or until
the first of them has waited ``max_wait_ms``, whichever comes first. A request is never
split: one with more rows than ``max_batch_rows`` is scored alone. The model runs as one
traced graph (:class:`Scorer`) in one worker thread, so the event loop keeps reading
requests while it scores. A row's score may change in its last float32 digit (~1e-7) with
the rows it is batched with.

Which rows a request may hold, and the types each column takes: :mod:`sparkdeep.pipelines.scoring`
(each refusal is a 4xx with ``{"error": ..., "field": ..., "value": ..., "row": ...}``, never a 500).

Shutdown (SIGINT/SIGTERM under uvicorn) stops accepting connections, lets the requests
under way finish, then scores what is still queued before the worker thread stops.

Example
-------
>>> import uvicorn  # doctest: +SKIP
>>> uvicorn.run(create_app("output/export/r1", ServeOptions(max_wait_ms=2)), port=8080)  # doctest: +SKIP
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from sparkdeep.errors import error_line
from sparkdeep.pipelines import export as ex
from sparkdeep.pipelines.scoring import PREDICTIONS, BadRequest, RowChecker, Scorer, ServeOptions, reject_constant

log = logging.getLogger(__name__)


@dataclass
class _Job:
    rows: list[dict]
    future: asyncio.Future


class MicroBatcher:
    """Queues the requests' rows and scores them together in one worker thread: a batch
    closes at ``max_batch_rows`` rows or ``max_wait_ms`` after its first request."""

    def __init__(self, score, options: ServeOptions):
        self.score, self.options = score, options
        self.queue: asyncio.Queue[_Job] = asyncio.Queue()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sparkdeep-serve-model")
        self.task: asyncio.Task | None = None
        self.batches = self.rows = 0
        self._next: _Job | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run(), name="sparkdeep-serve-batcher")

    async def submit(self, rows: list[dict]) -> list:
        """The predictions of ``rows`` (scored with whatever else is queued)."""
        if self.task is None or self.task.done():
            raise RuntimeError("the batcher is not running")
        job = _Job(rows, asyncio.get_running_loop().create_future())
        await self.queue.put(job)
        return await job.future

    async def _collect(self) -> list[_Job]:
        first = self._next or await self.queue.get()
        self._next = None
        batch, n = [first], len(first.rows)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.max_wait_ms / 1000
        while n < self.options.max_batch_rows:
            try:
                job = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    job = await asyncio.wait_for(self.queue.get(), left)
                except TimeoutError:
                    break
            if n + len(job.rows) > self.options.max_batch_rows:
                self._next = job  # first in the next batch: requests are never split
                break
            batch.append(job)
            n += len(job.rows)
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect()
            rows = [r for job in batch for r in job.rows]
            try:
                scored = await loop.run_in_executor(self.executor, self.score, rows)
            except Exception as exc:  # noqa: BLE001 - every waiting request gets the failure
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(exc)
                continue
            self.batches += 1
            self.rows += len(rows)
            at = 0
            for job in batch:
                if not job.future.done():  # a client that went away leaves a cancelled future
                    job.future.set_result(scored[at:at + len(job.rows)])
                at += len(job.rows)

    async def close(self) -> None:
        """Score what is queued, then stop the worker thread."""
        while self.task is not None and not self.task.done() and (self._next is not None or not self.queue.empty()):
            await asyncio.sleep(0.005)
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        self.executor.shutdown(wait=True)


# -- the app --------------------------------------------------------------------------------

def create_app(export_dir: str, options: ServeOptions | None = None):
    """The ASGI app serving the export at ``export_dir`` (loaded at start-up).

    Parameters
    ----------
    export_dir : str
        An export folder (``model.keras`` and ``schema.json``).
    options : ServeOptions, optional
        Batching and limits (the defaults of :class:`ServeOptions`).
    """
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    options = options or ServeOptions()
    state: dict = {}

    @contextlib.asynccontextmanager
    async def lifespan(app):
        t0 = time.perf_counter()
        loop = asyncio.get_running_loop()
        model = await loop.run_in_executor(None, ex.load_export, export_dir)
        scorer = Scorer(model, traced=options.traced)
        batcher = MicroBatcher(scorer.score, options)
        with open(os.path.join(export_dir, ex.SCHEMA_FILE)) as fh:
            schema = json.load(fh)
        # One row scored in the worker thread before the first request, which would pay
        # the first call's set-up (the trace) otherwise.
        warm = {e["name"]: 0.0 if e["type"] == ex.DOUBLE else None for e in schema["inputs"]}
        await loop.run_in_executor(batcher.executor, scorer.score, [warm])
        state.update(model=model, scorer=scorer, batcher=batcher, schema=schema,
                     checker=RowChecker(schema, options), load_s=round(time.perf_counter() - t0, 3))
        batcher.start()
        log.info("[serve] the %s export at %s loaded in %ss: %s inputs; max_batch_rows=%s, max_wait_ms=%s",
                 model.task, export_dir, state['load_s'], len(schema['inputs']), options.max_batch_rows,
                 options.max_wait_ms)
        try:
            yield
        finally:
            await batcher.close()
            state.clear()
            log.info("[serve] stopped after %s batches (%s rows)", batcher.batches, batcher.rows)

    def refuse(exc: BadRequest) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    async def read_body(request) -> bytes:
        limit = options.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise BadRequest(413, f"the body is {declared} bytes, more than max_body_bytes={limit}",
                             field="body", value=int(declared))
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise BadRequest(413, f"the body is more than max_body_bytes={limit}", field="body", value=size)
            chunks.append(chunk)
        return b"".join(chunks)

    async def predict(request):
        if "batcher" not in state:
            return JSONResponse({"error": "the model is not loaded"}, status_code=503)
        try:
            raw = await read_body(request)
            if not raw.strip():
                raise BadRequest(400, "the body is empty: send {\"rows\": [{column: value, ...}]}", field="body",
                                 value="")
            try:
                body = json.loads(raw, parse_constant=reject_constant)
            except (ValueError, RecursionError) as exc:
                raise BadRequest(400, f"the body is not JSON: {exc}", field="body",
                                 value=raw[:200].decode("utf-8", "replace")) from None
            rows = state["checker"].check(state["checker"].rows_of(body))
            predictions = await state["batcher"].submit(rows)
            bad = next((i for i, p in enumerate(predictions) if p is None), None)
            if bad is not None:
                raise BadRequest(422, f"row {bad}: the model's output is not finite (values far outside the "
                                      "training range?)", field="rows", value=rows[bad], row=bad)
        except BadRequest as exc:
            return refuse(exc)
        except ClientDisconnect:
            return JSONResponse({"error": "the client went away"}, status_code=400)
        return JSONResponse({PREDICTIONS: predictions})

    async def health(request):
        if "batcher" not in state:
            return JSONResponse({"status": "loading"}, status_code=503)
        b = state["batcher"]
        return JSONResponse({"status": "ok", "task": state["model"].task, "load_s": state["load_s"],
                             "batches": b.batches, "rows": b.rows, "queued": b.queue.qsize()})

    async def schema(request):
        if "schema" not in state:
            return JSONResponse({"status": "loading"}, status_code=503)
        return JSONResponse(state["schema"])

    async def http_error(request, exc: HTTPException):
        # The router's own refusals (404, 405) in the same JSON shape as the others.
        return JSONResponse({"error": f"{exc.detail}: {request.method} {request.url.path}", "field": "path",
                             "value": request.url.path}, status_code=exc.status_code, headers=exc.headers)

    async def server_error(request, exc: Exception):
        log.exception("[serve] %s %s failed", request.method, request.url.path)
        return JSONResponse({"error": f"the server failed: {error_line(exc)}"}, status_code=500)

    return Starlette(routes=[Route("/predict", predict, methods=["POST"]), Route("/health", health, methods=["GET"]),
                             Route("/schema", schema, methods=["GET"])], lifespan=lifespan,
                     exception_handlers={HTTPException: http_error, Exception: server_error})


__all__ = ["BadRequest", "MicroBatcher", "RowChecker", "Scorer", "ServeOptions", "create_app"]
