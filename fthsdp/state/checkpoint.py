"""Durable checkpoints: one `torch.distributed.checkpoint` (DCP) directory per step, committed atomically.

Layout:
    <dir>/step-0000000042/              the state at the start of step 42 (after committing 41)
        .metadata, __<rank>_0.distcp    DCP: model + optimizer tensors, each rank's shards
        fthsdp.pt                       step, data ledger, registered state, the optimizer's non-tensors
        COMPLETE                        the marker: step, SHA-256 of every file above (+ HMAC)
    <dir>/ledgers/step-0000000042.<replica>.json   each replica's own ledger entry (with its hash)

One replica writes the state: every rank of it saves its shards into
`.step-0000000042.tmp` (a collective over the replica's process group when the model is
sharded; rank 0 alone when it is replicated), then rank 0 writes fthsdp.pt and the marker,
flushes them and renames the folder into place: a crash leaves no `step-*` folder, or a
complete one. A `step-*` folder counts only when its marker names the folder's own step,
every file matches its hash, and (with a key, e.g. the job secret) the marker's HMAC is
right; fthsdp.pt must name the same step, or the checkpoint is refused with both steps named.
Nothing loaded can run code: fthsdp.pt is read with `torch.load(weights_only=True)` and the
DCP metadata with an unpickler that admits DCP's own types (fthsdp/state/dcp_payload.py).
After a commit the writer removes all but the newest `keep_last` checkpoints.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist


from fthsdp.errors import CheckpointError

FORMAT = "fthsdp-dcp-1"
MARKER = "COMPLETE"
SIDE_FILE = "fthsdp.pt"
STEP_DIR = re.compile(r"^step-(\d{10})$")
MAX_MARKER_BYTES = 1 << 20
MAX_FILES = 1 << 16


@dataclass(frozen=True)
class Restored:
    step: int                 # the next step to train
    ledger_json: str
    user_states: dict[str, Any]
    path: Path


def _sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointStore:
    def __init__(self, directory: str | os.PathLike[str], key: bytes | None = None, keep_last: int = 0) -> None:
        self.directory = Path(directory)
        self.key, self.keep_last = key, keep_last
        self._verified: dict[int, str] = {}  # step -> the marker text whose files were hashed

    def step_dir(self, step: int) -> Path:
        return self.directory / f"step-{step:010d}"

    def _tmp_dir(self, step: int) -> Path:
        return self.directory / f".step-{step:010d}.tmp"

    def _publish(self, tmp: Path, final: Path) -> None:
        """Make a fully written and flushed temporary file or folder visible under its final name."""
        os.rename(tmp, final)
        _fsync_dir(final.parent)

    def _atomic_write(self, final: Path, write: Callable[[Any], object]) -> None:
        tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            self._publish(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    # ------------------------------------------------------------------ writing

    def save_state(self, step: int, ledger_json: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                   user_states: dict[str, Any] | None = None, *, process_group: dist.ProcessGroup | None = None,
                   rank: int = 0) -> Path:
        """Write the state as of the start of `step`. With a process group every rank of the
        writing replica calls this (DCP is collective); rank 0 commits the folder."""
        dcp_payload, CheckpointException = _dcp()
        tmp, final = self._tmp_dir(step), self.step_dir(step)
        try:
            if rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)  # an earlier attempt's leftovers
                tmp.mkdir(parents=True)
            tensors, rest = dcp_payload.payload(model, optimizer)
            dcp_payload.save(tensors, str(tmp), process_group)  # rank 0 made tmp before any rank writes
            if rank != 0:
                return final
            side = {"format": FORMAT, "step": step, "ledger": ledger_json, "user": dict(user_states or {}),
                    "rest": rest}
            self._atomic_write(tmp / SIDE_FILE, lambda f: torch.save(side, f))
            files = {p.name: _sha256_of(p) for p in sorted(tmp.iterdir()) if p.is_file()}
            body = {"format": FORMAT, "step": step, "files": files}
            marker = {**body, "hmac": self._mac(body)} if self.key else body
            self._atomic_write(tmp / MARKER, lambda f: f.write(json.dumps(marker, sort_keys=True).encode()))
            if final.exists():
                raise CheckpointError(f"checkpoint {final} exists already; not replaced")
            self._publish(tmp, final)
        except (OSError, CheckpointException, RuntimeError, ValueError) as exc:  # DCP's: a failure on any rank
            raise CheckpointError(f"cannot write checkpoint of step {step} to {tmp}: {exc}") from exc
        self.prune()
        return final

    def save_ledger_entry(self, step: int, replica_id: str, position: int) -> Path:
        folder = self.directory / "ledgers"
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", replica_id)
        body = json.dumps({"replica_id": replica_id, "position": position, "step": step}, sort_keys=True)
        text = json.dumps({"entry": body, "sha256": hashlib.sha256(body.encode()).hexdigest()})
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"step-{step:010d}.{safe}.json"
            self._atomic_write(path, lambda f: f.write(text.encode()))
            return path
        except OSError as exc:
            raise CheckpointError(f"cannot write ledger entry of step {step} to {folder}: {exc}") from exc

    def prune(self) -> list[int]:
        """Remove all but the newest keep_last complete checkpoints (and what belongs to them)."""
        if not self.keep_last:
            return []
        complete = [s for s in self.steps() if self.is_complete(s)]
        if len(complete) <= self.keep_last:
            return []
        doomed, oldest_kept = complete[:-self.keep_last], complete[-self.keep_last]
        for step in doomed:
            shutil.rmtree(self.step_dir(step), ignore_errors=True)
            self._verified.pop(step, None)
        for p in [*self.directory.glob(".step-*.tmp"), *(self.directory / "ledgers").glob("step-*.json")]:
            m = re.match(r"^\.?step-(\d{10})", p.name)
            if m and int(m.group(1)) < oldest_kept:
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        return doomed

    # ------------------------------------------------------------------ reading

    def steps(self) -> list[int]:
        if not self.directory.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.directory.iterdir() if (m := STEP_DIR.match(p.name)))

    def is_complete(self, step: int) -> bool:
        try:
            self._verify(step)
            return True
        except CheckpointError:
            return False

    def latest_complete(self) -> int | None:
        for step in reversed(self.steps()):
            if self.is_complete(step):
                return step
        return None

    def _mac(self, body: dict[str, Any]) -> str:
        assert self.key is not None
        return hmac.new(self.key, json.dumps(body, sort_keys=True).encode(), hashlib.sha256).hexdigest()

    def _verify(self, step: int) -> None:
        """The marker is ours, names this folder's step, and every file matches its hash."""
        folder = self.step_dir(step)
        try:
            with open(folder / MARKER, "rb") as f:
                text = f.read(MAX_MARKER_BYTES + 1).decode()
            if len(text) > MAX_MARKER_BYTES:
                raise CheckpointError(f"checkpoint marker {folder / MARKER} is larger than {MAX_MARKER_BYTES} bytes")
            if self._verified.get(step) == text:
                return
            marker = json.loads(text)
            body = {k: marker[k] for k in ("format", "step", "files")}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"checkpoint {folder} has no readable marker: {exc}") from None
        if body["format"] != FORMAT or not isinstance(body["files"], dict) or len(body["files"]) > MAX_FILES:
            raise CheckpointError(f"checkpoint {folder} has a marker of format {body['format']!r}, not {FORMAT!r}")
        if body["step"] != step:
            raise CheckpointError(f"checkpoint {folder} is marked as the state of step {body['step']!r}, not of "
                                  f"step {step}: refused")
        if self.key is not None and not hmac.compare_digest(str(marker.get("hmac", "")), self._mac(body)):
            raise CheckpointError(f"checkpoint {folder} is not signed with this job's key: refused")
        present = {p.name for p in folder.iterdir() if p.is_file() and p.name != MARKER}
        if present != set(body["files"]):
            raise CheckpointError(f"checkpoint {folder} holds files {sorted(present)}, its marker lists "
                                  f"{sorted(body['files'])}")
        for name, digest in body["files"].items():
            if _sha256_of(folder / name) != digest:
                raise CheckpointError(f"checkpoint file {folder / name} fails its checksum")
        self._verified[step] = text

    def load(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             process_group: dist.ProcessGroup | None = None) -> Restored:
        """Load the checkpoint of `step` into the live model and optimizer (collective over
        `process_group` for a sharded model; each rank reads its own shards)."""
        dcp_payload, CheckpointException = _dcp()
        self._verify(step)
        folder = self.step_dir(step)
        try:
            side = torch.load(io.BytesIO((folder / SIDE_FILE).read_bytes()), map_location="cpu", weights_only=True)
            if not isinstance(side, dict) or side.get("format") != FORMAT:
                raise ValueError(f"{SIDE_FILE} is not an {FORMAT} side file")
            payload_step, ledger, user = side.get("step"), str(side["ledger"]), dict(side.get("user", {}))
        except Exception as exc:  # noqa: BLE001 - any load failure: a bad checkpoint, named
            raise CheckpointError(f"checkpoint {folder} does not load: {exc}") from None
        if payload_step != step:
            raise CheckpointError(f"checkpoint {folder} holds the state of step {payload_step!r} in its payload, "
                                  f"not of step {step} (its folder's): refused")
        try:
            dcp_payload.load_into(str(folder), model, optimizer, side.get("rest", {}), process_group)
        except (Exception, CheckpointException) as exc:  # noqa: BLE001 - DCP raises many kinds (one not an Exception)
            raise CheckpointError(f"checkpoint {folder} does not load into this model and optimizer: {exc}") from None
        return Restored(step, ledger, user, folder)

    def ledger_entries(self, step: int) -> dict[str, int]:
        """Each replica's own ledger entry of that step (entries failing their hash are skipped)."""
        out: dict[str, int] = {}
        for p in sorted((self.directory / "ledgers").glob(f"step-{step:010d}.*.json")):
            try:
                raw = json.loads(p.read_text())
                if hashlib.sha256(raw["entry"].encode()).hexdigest() == raw["sha256"]:
                    entry = json.loads(raw["entry"])
                    out[entry["replica_id"]] = int(entry["position"])
            except (OSError, ValueError, KeyError):
                continue
        return out


def _dcp():
    """`torch.distributed.checkpoint`, imported when a checkpoint is first written or read: it is
    about 40% of a trainer's import time, and a trainer that never checkpoints (or that is
    restarting to catch up from a peer) should not wait for it."""
    from torch.distributed.checkpoint.api import CheckpointException

    from fthsdp.state import dcp_payload

    return dcp_payload, CheckpointException
