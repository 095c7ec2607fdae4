"""The HTTP scorer (issue 27): a real uvicorn server on 127.0.0.1 per task, talked to with
the standard library. Its predictions equal ``load_export(...).predict`` on the same rows;
every malformed request is a 4xx naming the field; concurrent clients batched together
each get their own rows back; a shutdown finishes the request in flight.

The exports are test_export's pipelines (seeded random networks, fitted feature stages),
made once for the module.
"""
from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from pyspark.sql import types as T

from sparkdeep.jobs import serve as serve_job
from sparkdeep.pipelines import export
from sparkdeep.pipelines.scoring import RowChecker, Scorer, ServeOptions
from sparkdeep.pipelines.serve import create_app
from tests.test_export import CLASSES, REPO, random_network

SETTINGS = ("binary", "multiclass", "regression")
RAW = T.StructType([T.StructField("id", T.LongType()), T.StructField("colour", T.StringType()),
                    T.StructField("member", T.BooleanType()), T.StructField("x.a", T.DoubleType()),
                    T.StructField("price (USD)", T.DoubleType()), T.StructField("x3", T.DoubleType()),
                    T.StructField("label", T.DoubleType())])

TOL = 1e-6
#: The module's servers: small limits, so the 413s are cheap to reach.
OPTIONS = ServeOptions(max_batch_rows=64, max_wait_ms=10, max_body_bytes=64 * 1024, max_request_rows=500)


class Running:
    """A uvicorn server in a thread of this process, on a free port of 127.0.0.1."""

    def __init__(self, app):
        import uvicorn
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.time() + 120
        while not self.server.started:
            if not self.thread.is_alive() or time.time() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.05)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(60)
        self.sock.close()


def call(port: int, method: str, path: str, body=None, headers=None, timeout: float = 60):
    """(status, parsed JSON body) of one request; ``body``: bytes, or a value sent as JSON."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        raw = body is None or isinstance(body, bytes) or hasattr(body, "__next__")  # an iterator: chunks
        data = body if raw else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})},
                     encode_chunked=bool(headers and headers.get("Transfer-Encoding") == "chunked"))
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


def pipeline(spark, task: str):
    """A small fitted scoring pipeline under source names: a renamer (a boolean categorical
    source among them), string indices, imputed numbers, a seeded random network."""
    from pyspark.ml import PipelineModel
    from pyspark.ml.feature import Imputer, IndexToString, StringIndexer, VectorAssembler

    from sparkdeep.transformers.columns import ColumnRenamer
    numbers = ["x_a", "price_USD_", "x3"]
    fit_rows = spark.createDataFrame([("red", "true", 1.0, 50.0, 0.0), ("green", "false", 2.0, None, 1.0),
                                      ("blue", None, None, 70.0, float("nan")), ("red", "true", 0.5, 60.0, 2.0)],
                                     ["colour", "member", *numbers])
    stages = [ColumnRenamer(originals=["x.a", "price (USD)"], internals=["x_a", "price_USD_"], stringCols=["member"]),
              StringIndexer(inputCols=["colour", "member"], outputCols=["c_i", "m_i"], handleInvalid="keep")
              .fit(fit_rows),
              Imputer(inputCols=numbers, outputCols=[f"{c}_imp" for c in numbers]).fit(fit_rows),
              VectorAssembler(inputCols=["c_i", "m_i", *(f"{c}_imp" for c in numbers)], outputCol="features"),
              random_network(task, None, 5)]
    if task == "multiclass":
        stages.append(IndexToString(inputCol="prediction", outputCol="predicted_class", labels=CLASSES))
    return PipelineModel(stages)


def probe(seed: int = 9) -> list[dict]:
    """Rows as a client sends them: ordinary ones, then unseen, null and empty categories,
    null numbers, numbers far outside the training range."""
    rng = np.random.default_rng(seed)
    base = {"id": 0, "colour": "red", "member": True, "x.a": 0.1, "price (USD)": 55.0, "x3": -0.2, "label": 0.0}
    out = [{**base, "colour": str(rng.choice(["red", "green", "blue"])), "member": bool(rng.integers(2)),
            "x.a": rng.normal(), "price (USD)": 50 + 10 * rng.normal(), "x3": rng.normal()} for _ in range(12)]
    out += [{**base, "colour": "purple"}, {**base, "colour": None}, {**base, "colour": ""}, {**base, "member": None},
            {**base, "x.a": None, "price (USD)": None, "x3": None}, {**base, "x.a": 1e6, "price (USD)": -1e6},
            {**base, "x.a": -0.0, "x3": 0.0}]
    return [{**r, "id": i} for i, r in enumerate(out)]


@pytest.fixture(scope="module")
def served(spark, tmp_path_factory):
    """{task: {"dir", "rows", "model", "port"}}: one export and one running server per task."""
    tmp = tmp_path_factory.mktemp("serve")
    out, servers = {}, []
    try:
        for task in SETTINGS:
            folder = export.export_pipeline(pipeline(spark, task), str(tmp / task), raw_schema=RAW)["out_dir"]
            running = Running(create_app(folder, OPTIONS))
            servers.append(running)
            out[task] = {"dir": folder, "rows": probe(), "model": export.load_export(folder), "port": running.port}
        yield out
    finally:
        for s in servers:
            s.stop()


@pytest.mark.slow  # its module fixture fits and exports a pipeline: left to make test
@pytest.mark.parametrize("task", list(SETTINGS))
def test_predictions_equal_the_exported_model_on_the_same_rows(served, task):
    s = served[task]
    status, got = call(s["port"], "POST", "/predict", {"rows": s["rows"]})
    assert status == 200, got
    preds = got["predictions"]
    assert len(preds) == len(s["rows"])
    want = s["model"].predict(s["rows"])
    if task == "binary":
        p = np.array([r["probability"] for r in preds])
        np.testing.assert_allclose(p, want, rtol=TOL, atol=TOL)
        assert [r["prediction"] for r in preds] == [int(x >= 0.5) for x in p]
        assert all(set(r) == {"probability", "prediction"} for r in preds)
    elif task == "multiclass":
        np.testing.assert_allclose(np.array([r["probability"] for r in preds]), want, rtol=TOL, atol=TOL)
        assert [r["prediction"] for r in preds] == np.argmax(want, axis=1).tolist()
        assert [r["predicted_class"] for r in preds] == list(s["model"].predict_class(s["rows"]))
    else:
        np.testing.assert_allclose(np.array([r["prediction"] for r in preds]), want, rtol=TOL, atol=TOL)
        assert all(set(r) == {"prediction"} for r in preds)
    # One row alone, as an object, and a bare list of rows: the same answers.
    status, one = call(s["port"], "POST", "/predict", s["rows"][3])
    assert status == 200 and same(one["predictions"], preds[3:4])
    status, listed = call(s["port"], "POST", "/predict", s["rows"][:2])
    assert status == 200 and same(listed["predictions"], preds[:2])


def same(got: list[dict], want: list[dict]) -> bool:
    """The same predictions, scores within TOL: the network runs in float32, whose last
    digits change with the rows it is batched with."""
    if [sorted(g) for g in got] != [sorted(w) for w in want]:
        return False
    for g, w in zip(got, want):
        for k, v in g.items():
            if isinstance(v, str) or k == "prediction" and isinstance(v, int):
                if v != w[k]:
                    return False
            elif not np.allclose(v, w[k], rtol=TOL, atol=TOL):
                return False
    return True


@pytest.mark.slow  # its module fixture fits and exports a pipeline: left to make test
@pytest.mark.parametrize("task", list(SETTINGS))
def test_the_traced_graph_scores_as_the_eager_model(served, task):
    model, rows = served[task]["model"], served[task]["rows"]
    traced, eager = Scorer(model).score(rows), Scorer(model, traced=False).score(rows)
    assert same(traced, eager)
    assert all(set(p) == set(preds) for p, preds in zip(traced, eager))


@pytest.mark.slow  # its module fixture fits and exports a pipeline: left to make test
def test_health_and_schema(served):
    s = served["multiclass"]
    status, health = call(s["port"], "GET", "/health")
    assert status == 200 and health["status"] == "ok" and health["task"] == "multiclass"
    status, schema = call(s["port"], "GET", "/schema")
    with open(os.path.join(s["dir"], "schema.json")) as fh:
        assert status == 200 and schema == json.load(fh)
    status, got = call(s["port"], "GET", "/predict")
    assert status == 405 and "GET /predict" in got["error"]
    assert call(s["port"], "GET", "/nowhere")[0] == 404


GOOD = {"colour": "red", "member": False, "x.a": 0.1, "price (USD)": 55.0, "x3": -0.2}

BAD = {
    "empty body": (b"", 400, "body"),
    "not JSON": (b"{\"rows\": [", 400, "body"),
    "NaN is not JSON": (json.dumps({**GOOD, "x.a": float("nan")}).encode(), 400, "body"),
    "a number": (b"42", 400, "body"),
    "a string": (b"\"rows\"", 400, "body"),
    "rows empty": ({"rows": []}, 400, "rows"),
    "rows not a list": ({"rows": {"colour": "red"}}, 400, "rows"),
    "a row not an object": ({"rows": [GOOD, 7]}, 400, "rows"),
    "a missing column": ({"rows": [GOOD, {k: v for k, v in GOOD.items() if k != "price (USD)"}]}, 422, "price (USD)"),
    "an unknown column": ({**GOOD, "colur": "red"}, 422, "colur"),
    "a string for a number": ({**GOOD, "x.a": "1.5"}, 422, "x.a"),
    "a boolean for a number": ({**GOOD, "x3": True}, 422, "x3"),
    "a list for a number": ({**GOOD, "x3": [1]}, 422, "x3"),
    "a number out of range": (json.dumps({**GOOD, "x.a": 1.5}).replace("1.5", "1e400").encode(), 422, "x.a"),
    "a number for a string category": ({**GOOD, "colour": 3}, 422, "colour"),
    "a boolean for a string category": ({**GOOD, "colour": False}, 422, "colour"),
    "a string for a boolean category": ({**GOOD, "member": "true"}, 422, "member"),
    "too many rows": ({"rows": [GOOD] * 501}, 413, "rows"),
    "a body too large": ({"rows": [{**GOOD, "colour": "x" * 70_000}]}, 413, "body"),
}


@pytest.mark.slow  # its module fixture fits and exports a pipeline: left to make test
@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_request_is_a_4xx_naming_the_field(served, case):
    body, status, field = BAD[case]
    got_status, got = call(served["binary"]["port"], "POST", "/predict", body)
    assert got_status == status, got
    assert got["field"] == field and "error" in got, got
    if status == 422:
        assert field in got["error"] and "row" in got


@pytest.mark.slow  # its module fixture fits and exports a pipeline: left to make test
def test_a_chunked_body_too_large_is_refused_while_read(served):
    chunks = iter([b"{\"rows\": [" + b" " * 40_000, b" " * 40_000, b"]}"])
    status, got = call(served["binary"]["port"], "POST", "/predict", chunks, headers={"Transfer-Encoding": "chunked"})
    assert status == 413 and got["field"] == "body"


@pytest.mark.slow  # its module fixture fits and exports a pipeline: left to make test
def test_nulls_score_where_the_schema_allows_them_and_are_refused_where_not(served):
    s = served["binary"]
    row = {"colour": None, "member": None, "x.a": None, "price (USD)": None, "x3": None, "id": 5, "label": 1.0}
    status, got = call(s["port"], "POST", "/predict", {"rows": [row]})
    assert status == 200
    assert abs(got["predictions"][0]["probability"] - s["model"].predict([row])[0]) < TOL
    with open(os.path.join(s["dir"], "schema.json")) as fh:
        schema = json.load(fh)
    for e in schema["inputs"]:
        e["nullable"] = e["name"] != "x3"
    checker = RowChecker(schema, ServeOptions())
    with pytest.raises(ValueError, match="'x3': null, but the column is not nullable") as err:
        checker.check([GOOD, {**GOOD, "x3": None}])
    assert err.value.status == 422 and err.value.row == 1
    assert RowChecker(schema, ServeOptions(ignore_unknown=True)).check([{**GOOD, "extra": 1}]) == [GOOD]


@pytest.mark.slow  # its module fixture fits and exports a pipeline: left to make test
def test_concurrent_clients_batched_together_each_get_their_own_rows(served):
    s = served["regression"]
    clients, rounds = 16, 4
    base = s["rows"][0]
    # Distinct rows per client and round, 1 to 4 of them: any mix-up shows in the values.
    asked = {(c, r): [{**base, "x.a": c + 0.01 * r + 0.001 * k} for k in range(1 + (c + r) % 4)]
             for c in range(clients) for r in range(rounds)}
    got, errors = {}, []
    start = threading.Barrier(clients)
    _, before = call(s["port"], "GET", "/health")

    def client(c):
        try:
            start.wait()
            for r in range(rounds):
                status, body = call(s["port"], "POST", "/predict", {"rows": asked[(c, r)]})
                assert status == 200, body
                got[(c, r)] = [p["prediction"] for p in body["predictions"]]
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    keys = sorted(asked)
    want = s["model"].predict([row for k in keys for row in asked[k]])
    at = 0
    for k in keys:
        np.testing.assert_allclose(got[k], want[at:at + len(asked[k])], rtol=TOL, atol=TOL, err_msg=str(k))
        at += len(asked[k])
    _, after = call(s["port"], "GET", "/health")
    batches = after["batches"] - before["batches"]
    assert after["rows"] - before["rows"] == at
    assert batches < clients * rounds, "no request was batched with another"


@pytest.mark.slow  # its module fixture fits and exports a pipeline: left to make test
def test_shutdown_finishes_the_request_in_flight(served):
    s = served["binary"]
    # A long wait keeps the request queued while the server is told to stop.
    running = Running(create_app(s["dir"], ServeOptions(max_wait_ms=1500)))
    result = {}

    def client():
        result["answer"] = call(running.port, "POST", "/predict", {"rows": s["rows"][:3]})

    t = threading.Thread(target=client)
    t.start()
    time.sleep(0.4)
    t0 = time.time()
    running.stop()
    t.join(30)
    status, body = result["answer"]
    assert status == 200
    np.testing.assert_allclose([p["probability"] for p in body["predictions"]], s["model"].predict(s["rows"][:3]),
                               rtol=TOL, atol=TOL)
    assert time.time() - t0 < 30 and not running.thread.is_alive()
    with pytest.raises(OSError):
        call(running.port, "GET", "/health", timeout=5)


def test_the_job_refuses_a_path_without_an_export_in_one_line(tmp_path, capsys):
    assert serve_job.main(["--export", str(tmp_path / "nowhere")]) == 2
    assert serve_job.main(["--output-dir", str(tmp_path)]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 2 and all(ln.startswith("serve: --") for ln in err), err
    assert "holds no schema.json" in err[0] and "no export under" in err[1]


@pytest.mark.slow  # its module fixture fits and exports a pipeline: left to make test
def test_the_job_finds_the_newest_export_under_the_output_folder(served, tmp_path):
    import shutil
    for i, task in enumerate(["binary", "regression"]):
        shutil.copytree(served[task]["dir"], tmp_path / "export" / f"r{i}")
        os.utime(tmp_path / "export" / f"r{i}" / "schema.json", (1000 + i, 1000 + i))
    assert serve_job.find_export(None, str(tmp_path)) == str(tmp_path / "export" / "r1")


@pytest.mark.slow  # its module fixture fits and exports a pipeline: left to make test
def test_the_job_serves_the_promoted_models_export_not_a_newer_one(served, tmp_path, capsys):
    import json
    import shutil
    for i, name in enumerate(["promoted", "later.g2"]):
        shutil.copytree(served["binary"]["dir"], tmp_path / "export" / name)
        os.utime(tmp_path / "export" / name / "schema.json", (1000 + i, 1000 + i))
    latest = tmp_path / "models" / "latest.json"
    latest.parent.mkdir()
    latest.write_text(json.dumps({"run_id": "promoted", "models": {
        "pipeline": {"path": str(tmp_path / "models" / "runs" / "promoted" / "pipeline"), "digest": "x"}}}))
    assert serve_job.find_export(None, str(tmp_path)) == str(tmp_path / "export" / "promoted")
    # A --force generation is another model: its own export, or a refusal, never the run's first one.
    latest.write_text(json.dumps({"run_id": "promoted", "models": {
        "pipeline": {"path": str(tmp_path / "models" / "runs" / "promoted" / "3" / "pipeline"), "digest": "x"}}}))
    assert serve_job.main(["--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "the promoted model (run 'promoted') has no export" in err and "promoted.g3" in err


@pytest.mark.slow
def test_a_port_in_use_is_one_line_and_status_1(served):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "sparkdeep.jobs.serve", "--export", served["binary"]["dir"],
                               "--port", str(port)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    assert f"serve: failed: the server did not start on 127.0.0.1:{port}" in done.stderr


@pytest.mark.slow
def test_the_job_serves_in_its_own_process_and_drains_on_sigterm(served):
    s = served["regression"]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "sparkdeep.jobs.serve", "--export", s["dir"], "--port", str(port),
                             "--max-wait-ms", "1500"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.time() + 120
        while True:
            try:
                if call(port, "GET", "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() else "timeout"
            time.sleep(0.2)
        result = {}
        t = threading.Thread(target=lambda: result.update(answer=call(port, "POST", "/predict", s["rows"][:2])))
        t.start()
        time.sleep(0.4)
        proc.send_signal(signal.SIGTERM)
        t.join(30)
        assert result["answer"][0] == 200
        np.testing.assert_allclose([p["prediction"] for p in result["answer"][1]["predictions"]],
                                   s["model"].predict(s["rows"][:2]), rtol=TOL, atol=TOL)
        assert proc.wait(30) == 0
        assert f"on http://127.0.0.1:{port}" in proc.stderr.read() + proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
