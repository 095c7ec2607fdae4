"""How the ranks find each other, per launch backend (``backend=`` of :func:`sparkdeep.distributed.run_on_ranks`).

- ``horovod``: the driver runs Horovod's Gloo rendezvous server (:func:`rendezvous_for`),
  initialised with the host plan (:func:`host_plan`); each rank gets the ``HOROVOD_*``
  variables (local and cross ranks from the task hosts) and ``HOROVOD_GLOO_TIMEOUT_SECONDS``;
- ``tensorflow`` (and ``tensorflow_ps``): no Horovod import anywhere; each rank gets
  ``TF_CONFIG`` naming every task's host and port (a worker cluster for
  ``MultiWorkerMirroredStrategy``; with ``_ps``, also a parameter server on rank 0's host).

Both get ``SPARKDEEP_COLLECTIVE_TIMEOUT`` (:data:`TIMEOUT_ENV`, read by the ranks' collective
strategies): twice the stall timeout (:func:`collective_timeout`), so that a frozen rank is
found by its missing heartbeat (and named) before a peer's collective gives up on it.
Used by the launcher (``sparkdeep.distributed``) on the driver and in each barrier task;
imports Horovod only inside :func:`rendezvous_for`, for the ``horovod`` backend.
"""
from __future__ import annotations

import json
import math

BACKENDS = ("horovod", "tensorflow", "tensorflow_ps")
TIMEOUT_ENV = "SPARKDEEP_COLLECTIVE_TIMEOUT"  # seconds a collective may wait for a peer


def host_plan(hosts: list[str]) -> list[dict]:
    """Horovod's slot plan for tasks on ``hosts`` (rank = task index): local rank and size
    among the tasks of one host, cross rank and size among the hosts with that local rank."""
    plan = []
    for rank, host in enumerate(hosts):
        local = [r for r, h in enumerate(hosts) if h == host]
        plan.append({"hostname": host, "rank": rank, "size": len(hosts), "local_rank": local.index(rank),
                     "local_size": len(local)})
    for slot in plan:
        peers = [p for p in plan if p["local_rank"] == slot["local_rank"]]
        slot["cross_rank"] = [p["rank"] for p in peers].index(slot["rank"])
        slot["cross_size"] = len(peers)
    return plan


def _free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on this host now (the rank's TensorFlow servers bind
    them moments later); all held open at once, so no two are the same."""
    import socket
    from contextlib import ExitStack
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(n)]
        for s in socks:
            s.bind(("", 0))
        return [int(s.getsockname()[1]) for s in socks]


def _free_port() -> int:
    return _free_ports(1)[0]


def tf_config(hosts: list[str], ports: list, rank: int, ps: bool = False) -> str:
    """``TF_CONFIG`` for rank ``rank``: a worker cluster of every task's ``host:port``; with
    ``ps``, also one parameter server on rank 0's host (its second port)."""
    cluster = {"worker": [f"{h}:{p[0]}" for h, p in zip(hosts, ports)]}
    if ps:
        cluster["ps"] = [f"{hosts[0]}:{ports[0][1]}"]
    return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": rank}})


def backend_env(backend: str, conf: dict, plan: list[dict], ports: list[int], rank: int) -> dict:
    """The variables by which rank ``rank`` finds its peers under ``backend``."""
    slot = plan[rank]
    if backend.startswith("tensorflow"):
        return {"TF_CONFIG": tf_config([p["hostname"] for p in plan], ports, rank, ps=backend == "tensorflow_ps")}
    rendezvous_host, rendezvous_port = conf["rendezvous"]
    env = {"HOROVOD_HOSTNAME": slot["hostname"], "HOROVOD_RANK": str(rank),
           "HOROVOD_SIZE": str(slot["size"]), "HOROVOD_LOCAL_RANK": str(slot["local_rank"]),
           "HOROVOD_LOCAL_SIZE": str(slot["local_size"]), "HOROVOD_CROSS_RANK": str(slot["cross_rank"]),
           "HOROVOD_CROSS_SIZE": str(slot["cross_size"]),
           "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous_host, "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rendezvous_port),
           "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
           "HOROVOD_GLOO_TIMEOUT_SECONDS": str(int(math.ceil(conf["collective_timeout"])))}
    iface = _interface_for(rendezvous_host)
    if iface:
        env["HOROVOD_GLOO_IFACE"] = iface
    return env


def collective_timeout(stall_timeout: float) -> float:
    """How long a collective may wait for a peer: twice the stall timeout (the heartbeat
    watchdog fires first and names a frozen rank); 30 minutes without a watchdog."""
    return 2.0 * stall_timeout if stall_timeout else 1800.0


def _interface_for(address: str) -> str | None:
    """The network interface this host uses to reach ``address`` (Gloo binds to it)."""
    import socket

    import psutil
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((address, 9))
            local = s.getsockname()[0]
    except OSError:
        return None
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == local for a in addrs):
            return name
    return None


def rendezvous_for(backend: str):
    """The driver's rendezvous for ``backend`` (Horovod's Gloo server, or None) and what to
    do with the host plan task 0 sends."""
    if backend != "horovod":
        return None, lambda plan: None
    from horovod.runner.common.util.hosts import SlotInfo
    from horovod.runner.http.http_server import RendezvousServer
    rendezvous = RendezvousServer(verbose=0)

    def on_plan(plan: list) -> None:
        rendezvous.init([SlotInfo(hostname=p["hostname"], rank=p["rank"], local_rank=p["local_rank"],
                                  cross_rank=p["cross_rank"], size=p["size"], local_size=p["local_size"],
                                  cross_size=p["cross_size"]) for p in plan])
    return rendezvous, on_plan

