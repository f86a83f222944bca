"""Durable checkpoints in a directory: atomic, checksummed, resumable.

Layout, one folder per committed step:
    <dir>/step-0000000042/model_optim.pt         model + optimizer + registered state + step + ledger
                                                 (one replica writes it)
    <dir>/step-0000000042/model_optim.pt.sha256  its SHA-256, written after it
    <dir>/step-0000000042/ledger.<replica>.json  each replica's own ledger entry (with its hash)
Every file is written to a temporary name, flushed to disk and renamed, so a crash
leaves either the old file or the new one. A step folder is complete when
model_optim.pt exists and matches its .sha256; `latest_complete` skips the others.
Inside a replica the model is replicated on every rank, so one rank writes it. Loading
uses `torch.load(weights_only=True)`: a checkpoint file cannot run code.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from fthsdp.errors import CheckpointError

STATE_FILE = "model_optim.pt"
STEP_DIR = re.compile(r"^step-(\d{10})$")


@dataclass(frozen=True)
class Restored:
    step: int                 # the next step to train
    ledger_json: str
    model_state: dict[str, Any]
    optimizer_state: dict[str, Any]
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
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def step_dir(self, step: int) -> Path:
        return self.directory / f"step-{step:010d}"

    def _publish(self, tmp: Path, final: Path) -> None:
        """Make a fully written and flushed temporary file visible under its final name."""
        os.replace(tmp, final)
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

    def save_state(self, step: int, ledger_json: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                   user_states: dict[str, Any] | None = None) -> Path:
        """Write model + optimizer + registered state as of the start of `step` (after
        committing step - 1)."""
        folder = self.step_dir(step)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / STATE_FILE
            payload = {"step": step, "ledger": ledger_json, "model": model.state_dict(),
                       "optimizer": optimizer.state_dict(), "user": dict(user_states or {})}
            self._atomic_write(path, lambda f: torch.save(payload, f))
            digest = _sha256_of(path)
            self._atomic_write(folder / (STATE_FILE + ".sha256"), lambda f: f.write(digest.encode()))
            return path
        except OSError as exc:
            raise CheckpointError(f"cannot write checkpoint of step {step} to {folder}: {exc}") from exc

    def save_ledger_entry(self, step: int, replica_id: str, position: int) -> Path:
        folder = self.step_dir(step)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", replica_id)
        body = json.dumps({"replica_id": replica_id, "position": position, "step": step}, sort_keys=True)
        text = json.dumps({"entry": body, "sha256": hashlib.sha256(body.encode()).hexdigest()})
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"ledger.{safe}.json"
            self._atomic_write(path, lambda f: f.write(text.encode()))
            return path
        except OSError as exc:
            raise CheckpointError(f"cannot write ledger entry of step {step} to {folder}: {exc}") from exc

    def is_complete(self, step: int) -> bool:
        folder = self.step_dir(step)
        try:
            expected = (folder / (STATE_FILE + ".sha256")).read_text().strip()
            return _sha256_of(folder / STATE_FILE) == expected
        except OSError:
            return False

    def steps(self) -> list[int]:
        if not self.directory.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.directory.iterdir() if (m := STEP_DIR.match(p.name)))

    def latest_complete(self) -> int | None:
        for step in reversed(self.steps()):
            if self.is_complete(step):
                return step
        return None

    def load(self, step: int) -> Restored:
        if not self.is_complete(step):
            raise CheckpointError(f"checkpoint {self.step_dir(step)} is incomplete or fails its checksum")
        path = self.step_dir(step) / STATE_FILE
        try:
            raw = torch.load(path, map_location="cpu", weights_only=True)
            restored = Restored(int(raw["step"]), str(raw["ledger"]), raw["model"], raw["optimizer"],
                                dict(raw.get("user", {})), path)
        except Exception as exc:  # noqa: BLE001 - any load failure: a bad checkpoint, named
            raise CheckpointError(f"checkpoint {path} does not load: {exc}") from None
        if restored.step != step:  # a folder must hold its own step: never resume at another one
            raise CheckpointError(f"checkpoint {path} holds the state of step {restored.step} in its payload, "
                                  f"not of step {step} (its folder's): refused")
        return restored

    def ledger_entries(self, step: int) -> dict[str, int]:
        """Each replica's own ledger entry in that step's folder (entries failing their hash are skipped)."""
        out: dict[str, int] = {}
        for p in sorted(self.step_dir(step).glob("ledger.*.json")):
            try:
                raw = json.loads(p.read_text())
                if hashlib.sha256(raw["entry"].encode()).hexdigest() == raw["sha256"]:
                    entry = json.loads(raw["entry"])
                    out[entry["replica_id"]] = int(entry["position"])
            except (OSError, ValueError, KeyError):
                continue
        return out
