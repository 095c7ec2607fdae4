"""Per-epoch checkpoints: rank 0 hands each epoch's files to the driver
(:func:`send_checkpoint`; with split tables every rank its share, :func:`send_part`, and the
driver puts the whole files together), which stores them (:class:`CheckpointStore`) under the run's
folder; a later fit with the same ``runId`` reads them back (:func:`read_checkpoint`) if
they were made for the same training (:func:`checkpoint_signature`)."""
from __future__ import annotations

import json
import re
from typing import Callable

from .network import keras_to_bytes


def send_checkpoint(model, optimizer, state: dict, best_weights=None) -> None:
    """Rank 0 hands the epoch's checkpoint to the driver, which stores it under the run's
    checkpoint folder, local or not (:class:`CheckpointStore`):
    the model and optimizer files of the epoch (and early stopping's best weights so far)
    first, then ``state.json`` naming them. ``optimizer`` is the optimizer or its variables'
    values in order (a rank with split tables passes them whole)."""
    import io

    import numpy as np

    from sparkdeep.channel import put
    epoch_folder = f"epoch-{int(state['completed_epochs']):04d}"
    buffer = io.BytesIO()
    values = optimizer if isinstance(optimizer, list) else optimizer.variables
    np.savez(buffer, **{f"v{i}": np.asarray(v) for i, v in enumerate(values)})
    put(f"{epoch_folder}/model.keras", keras_to_bytes(model))
    put(f"{epoch_folder}/optimizer.npz", buffer.getvalue())
    if best_weights is not None:
        best = io.BytesIO()
        np.savez(best, **{f"w{i}": np.asarray(w) for i, w in enumerate(best_weights)})
        put(f"{epoch_folder}/best.npz", best.getvalue())
    send_state(state)


def send_part(completed: int, rank: int, data: bytes) -> None:
    """A rank with split tables hands its share of the epoch's checkpoint
    (:meth:`.sharding.RankShards.checkpoint_part`) to the driver, which puts the whole files
    together once rank 0 sends the epoch's state (:func:`send_state`)."""
    from sparkdeep.channel import put
    put(f"epoch-{int(completed):04d}/part-{int(rank):04d}.npz", data)


def send_state(state: dict) -> None:
    """Rank 0 names the epoch's checkpoint complete: its ``state.json``, sent last."""
    from sparkdeep.channel import put
    put("state.json", json.dumps({**state, "files": f"epoch-{int(state['completed_epochs']):04d}"}).encode())

def load_optimizer_state(optimizer, data: bytes) -> None:
    """Put a checkpoint's ``optimizer.npz`` (written by :func:`send_checkpoint`) back into
    ``optimizer``'s variables, in order."""
    for var, value in zip(optimizer.variables, optimizer_arrays(data, len(optimizer.variables))):
        var.assign(value)


def optimizer_arrays(data: bytes, count: int) -> list:
    """The first ``count`` arrays of a checkpoint's ``optimizer.npz``, in order."""
    import io

    import numpy as np
    with np.load(io.BytesIO(data), allow_pickle=False) as saved:
        return [saved[f"v{i}"] for i in range(int(count))]


def best_weights_from(data: bytes | None):
    """Weights saved by :func:`_checkpoint` as ``best.npz``, in order (None without any)."""
    if not data:
        return None
    import io

    import numpy as np
    with np.load(io.BytesIO(data), allow_pickle=False) as saved:
        return [saved[f"w{i}"] for i in range(len(saved.files))]


class CheckpointStore:
    """The driver's side of rank 0's per-epoch checkpoints (``on_put`` of the launch).

    Layout under the run's folder (local or any Hadoop URI, through :mod:`sparkdeep.storage`):
    ``epoch-NNNN/model.keras`` and ``epoch-NNNN/optimizer.npz``, then ``state.json``
    (completed epochs, history, and which ``epoch-NNNN`` holds the files), written
    atomically last. A run killed mid-checkpoint leaves ``state.json`` naming the previous
    complete epoch; older epoch folders are removed once a newer ``state.json`` is written.
    """

    _NAME = re.compile(r"^(state\.json|epoch-\d{4,}/(model\.keras|optimizer\.npz|best\.npz))$")
    _PART = re.compile(r"^(epoch-\d{4,})/part-(\d{4,})\.npz$")

    def __init__(self, folder: str, signature: dict | None = None, *, network: bytes | None = None,
                 size: int = 1, assemble: Callable | None = None):
        self.folder = folder
        self.signature = signature
        # Split tables: every rank's share of an epoch, spilled to the driver's disk until
        # rank 0's state.json, then put together on the architecture of ``network`` by
        # ``assemble(network, shares)`` (:func:`.sharding.assemble_checkpoint`: it yields
        # each whole file's name and bytes); :meth:`close` removes what is left.
        self.network, self.size, self._assemble = network, int(size), assemble
        if network is not None and assemble is None:
            raise ValueError("CheckpointStore: a network to put shares together on needs its assemble")
        self._parts: dict[str, dict[int, str]] = {}
        self._spill: str | None = None

    def __call__(self, rank: int, name: str, data: bytes) -> None:
        from sparkdeep import storage
        part = self._PART.match(name)
        if part and self.network is not None and int(part.group(2)) == rank < self.size:
            self._keep(part.group(1), rank, data)
            return
        if rank != 0 or not self._NAME.match(name):
            raise ValueError(f"checkpoint file {name!r} from rank {rank}: not part of a checkpoint")
        st = storage.Storage()
        if name == "state.json" and self.network is not None:
            self._write_parts(json.loads(data)["files"])
        if name == "state.json" and self.signature is not None:
            # What the checkpoint was made for, so a later fit with other data or another
            # network under the same runId is refused rather than resumed.
            data = json.dumps({**json.loads(data), "signature": self.signature}).encode()
        st.write_bytes(storage.join(self.folder, name), data)
        if name == "state.json":
            keep = json.loads(data)["files"]
            for entry in st.listdir(self.folder):
                if entry.startswith("epoch-") and entry != keep:
                    st.delete(storage.join(self.folder, entry))

    def _keep(self, epoch: str, rank: int, data: bytes) -> None:
        import os
        import tempfile
        if self._spill is None:
            self._spill = tempfile.mkdtemp(prefix="sparkdeep-checkpoint-parts-")
        for older in [e for e in self._parts if e < epoch]:  # an epoch that never completed
            self._drop(older)
        path = os.path.join(self._spill, f"{epoch}-part-{rank:04d}.npz")
        with open(path, "wb") as fh:
            fh.write(data)
        self._parts.setdefault(epoch, {})[rank] = path

    def _drop(self, epoch: str) -> None:
        import os
        for path in self._parts.pop(epoch, {}).values():
            os.remove(path)

    def _write_parts(self, epoch: str) -> None:
        """The whole files of an epoch whose every rank sent its share.

        Raises
        ------
        ValueError
            A rank's share is missing (the epoch is not named complete).
        """
        from sparkdeep import storage
        parts = self._parts.get(epoch, {})
        if sorted(parts) != list(range(self.size)):
            raise ValueError(f"checkpoint {epoch}: shares came from ranks {sorted(parts)}, not all {self.size}: "
                             "the epoch is not named complete")
        st = storage.Storage()
        try:
            for name, data in self._assemble(self.network, [parts[r] for r in range(self.size)]):
                st.write_bytes(storage.join(self.folder, epoch, name), data)
        finally:
            self._drop(epoch)

    def close(self) -> None:
        """Remove the shares of any epoch that never completed (the driver's disk only)."""
        import shutil
        if self._spill is not None:
            shutil.rmtree(self._spill, ignore_errors=True)
            self._spill, self._parts = None, {}


def read_checkpoint(folder: str) -> dict | None:
    """The last completed epoch's checkpoint of a run, or None."""
    from sparkdeep import storage
    from sparkdeep.paths import read_json
    state = read_json(storage.join(folder, "state.json"))
    if state is None:
        return None
    # Checkpoints written before the epoch folders kept their files beside state.json.
    files = storage.join(folder, state["files"]) if state.get("files") else folder
    st = storage.Storage()
    best = storage.join(files, "best.npz")
    return {"completed_epochs": int(state["completed_epochs"]), "history": state["history"],
            "finished": bool(state.get("finished", False)), "stopping": state.get("stopping"),
            "signature": state.get("signature"),
            "model_bytes": st.read_bytes(storage.join(files, "model.keras")),
            "optimizer_bytes": st.read_bytes(storage.join(files, "optimizer.npz")),
            "best_bytes": st.read_bytes(best) if st.exists(best) else None}

def checkpoint_signature(**parts) -> dict:
    """What a checkpoint is valid for; JSON-clean (tuples become lists, as after a round trip)."""
    return json.loads(json.dumps(parts, sort_keys=True, default=str))

def check_signature(folder: str, run_id: str, saved: dict | None, now: dict) -> None:
    """Refuse to resume a checkpoint made for other training.

    ``saved`` is the signature recorded with the checkpoint (``None``: none was recorded,
    nothing to compare), ``now`` this fit's (:func:`checkpoint_signature`).

    Raises
    ------
    ValueError
        The two differ; the message names each key that does, then and now.
    """
    if saved is None:  # written before signatures were recorded
        return
    changed = [k for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)]
    if changed:
        what = "; ".join(f"{k}: {_short(saved.get(k))} then, {_short(now.get(k))} now" for k in changed)
        raise ValueError(f"runId {run_id!r}: the checkpoint at {folder} was made for other training ({what}); "
                         "use a new runId for this data and network, or delete that folder to start over")

def _short(value) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."
