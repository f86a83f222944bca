"""Streams read exactly once: torchdata's StatefulDataLoader at the data ledger's position.

    loader = StatefulDataLoader(stream, batch_size=32, num_workers=4)   # torchdata (pip install 'fthsdp[data]')
    stream_batches = StreamBatches(loader, settings.replica_id, state_dir="/ckpt/streams", save_every=100)
    manager = Manager(model, opt, settings, pre_init=stream_batches.start)
    for batch in manager.batches(stream_batches.batch_at):
        ...

Why not `manager.register_state("loader", loader)`: registered state is *replicated* state,
equal on every replica after a commit; a catch-up loads the source replica's copy. A
StatefulDataLoader's state is this replica's own stream position (every replica reads its
own stream, so the states differ and the digests would disagree), and it moves when a batch
is *read*, not when a step commits: a retried step would get the next batch instead of the
same one, a catch-up would take another replica's position, and a replica whose aborted step
others included would read that batch again. So `register_state` refuses DataLoaders and
samplers, and the ledger keeps the position, as for map-style data (fthsdp/data.py).

What this class does instead. Position p of a replica's stream is the p-th batch its loader
yields from its initial state (so the stream must be deterministic: seeded shuffles, a fixed
number of workers). The class keeps the loader's `state_dict()` taken *before* reading a
position -- always the initial one, the last `keep` positions in memory, and every
`save_every`-th position in `state_dir` (one file per replica and position) -- and serves
the position the ledger asks for:
- the next one: read it (the DataLoader prefetches ahead as usual);
- an earlier one (a retried step, a rollback): load the newest kept state at or before it,
  then read forward to it;
- a later one (a restart or catch-up: this replica's earlier batches were trained, by its
  previous incarnation or included while it aborted): load the newest kept state at or before
  it -- in `state_dir` after a restart -- and read forward, dropping the batches between
  unread by training (`skipped` counts them). Without a `state_dir` a restarted replica reads
  its stream again from the start up to its position: exactly once still, but slow. So is
  a stream whose IterableDataset has no state_dict()/load_state_dict(): torchdata restores
  it by reading forward itself, and refuses some of the states it took (its worker order
  check); then this class reads from the stream's start. Give streams a state_dict().
The batches read forward were trained already, once, along the committed history; none is
trained twice and none is skipped.
"""

from __future__ import annotations

import copy
import io
import os
import re
from pathlib import Path
from typing import Any, Iterator

import torch

_STATE_FILE = re.compile(r"^(\d{1,18})\.pt$")
MAX_STATE_FILE_BYTES = 64 << 20


class StreamBatches:
    """One replica's stream through a StatefulDataLoader (or anything with state_dict(),
    load_state_dict() and iteration), read at the ledger's positions (module docstring)."""

    def __init__(self, loader: Any, replica_id: str, *, state_dir: str | os.PathLike | None = None,
                 save_every: int = 0, keep: int = 4) -> None:
        for method in ("state_dict", "load_state_dict", "__iter__"):
            if not callable(getattr(loader, method, None)):
                raise TypeError(f"StreamBatches needs a loader with state_dict(), load_state_dict() and iteration "
                                f"(torchdata's StatefulDataLoader); a {type(loader).__name__} has no {method}()")
        if type(save_every) is not int or save_every < 0 or (save_every and state_dir is None):
            raise ValueError(f"save_every must be an integer >= 0, and needs a state_dir when > 0; got "
                             f"{save_every!r} with state_dir {state_dir!r}")
        if type(keep) is not int or keep < 1:
            raise ValueError(f"keep must be an integer >= 1, got {keep!r}")
        self.loader, self.replica_id = loader, replica_id
        self.save_every, self.keep = save_every, keep
        self.folder = Path(state_dir) / replica_id if state_dir is not None else None
        self._initial = copy.deepcopy(loader.state_dict())
        self._recent: dict[int, Any] = {}  # position -> the loader's state before reading it
        self._iter: Iterator[Any] | None = None
        self._next = 0  # the position the running iterator yields next
        #: batches read and dropped to reach an asked position, and how many times a kept state was loaded
        self.skipped = self.restored = 0

    def start(self) -> None:
        """Start the loader's workers at the stream's start (give it to the Manager as `pre_init`:
        they fork before the trainer's ports and threads start). Idempotent."""
        if self._iter is None:
            self._iter, self._next = iter(self.loader), 0

    def batch_at(self, replica_id: str, position: int) -> Any:
        """The batch at `position` of this replica's stream (what `Manager.batches` calls)."""
        if replica_id != self.replica_id:
            raise ValueError(f"this stream is replica {self.replica_id!r}'s, not replica {replica_id!r}'s")
        if type(position) is not int or position < 0:
            raise ValueError(f"a stream position must be an integer >= 0, got {position!r}")
        if self._iter is None or position != self._next:
            self._seek(position)
        self._remember(position)
        batch = self._read()
        self._next = position + 1
        return batch

    def _seek(self, position: int) -> None:
        if self._iter is None or position < self._next or self._newest_at_or_before(position)[0] > self._next:
            start, state = self._newest_at_or_before(position)
            try:
                self.loader.load_state_dict(state)
                self._iter, self._next = iter(self.loader), start
            except ValueError:  # torchdata's fast-forward of a dataset without state_dict() can refuse
                self.loader.load_state_dict(self._initial)  # a state it took: read from the start instead
                self._iter, self._next = iter(self.loader), 0
            self.restored += 1
        while self._next < position:  # trained already along the committed history: not served again
            self._remember(self._next)
            self._read()
            self._next += 1
            self.skipped += 1

    def _read(self) -> Any:
        assert self._iter is not None
        try:
            return next(self._iter)
        except StopIteration:  # an epoch of the stream ended: the next one goes on at the next position
            self._iter = iter(self.loader)
            try:
                return next(self._iter)
            except StopIteration:
                raise ValueError("the stream yields no batch at all") from None

    def _remember(self, position: int) -> None:
        """Keep the loader's state before reading `position` (in memory; on disk every save_every)."""
        state = copy.deepcopy(self.loader.state_dict())  # the loader may change what it returned
        self._recent[position] = state
        for old in sorted(self._recent)[:-self.keep]:
            del self._recent[old]
        if self.folder is not None and self.save_every and position % self.save_every == 0 and position > 0:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = self.folder / f".{position}.pt.tmp"
            torch.save(state, tmp)
            os.replace(tmp, self.folder / f"{position}.pt")

    def _newest_at_or_before(self, position: int) -> tuple[int, Any]:
        best, state = 0, self._initial
        for p, s in self._recent.items():
            if best < p <= position:
                best, state = p, s
        on_disk = self._saved_positions()
        if on_disk:
            newest = max((p for p in on_disk if p <= position), default=0)
            if newest > best:
                best, state = newest, self._load(newest)
        return best, state

    def _saved_positions(self) -> list[int]:
        if self.folder is None or not self.folder.is_dir():
            return []
        return [int(m.group(1)) for name in os.listdir(self.folder) if (m := _STATE_FILE.match(name))]

    def _load(self, position: int) -> Any:
        assert self.folder is not None
        path = self.folder / f"{position}.pt"
        data = path.read_bytes()
        if len(data) > MAX_STATE_FILE_BYTES:
            raise ValueError(f"{path} holds {len(data)} bytes, more than a stream state may ({MAX_STATE_FILE_BYTES})")
        try:
            return torch.load(io.BytesIO(data), weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any unpickling failure means a damaged file
            raise ValueError(f"{path} does not load as a stream state: {exc}; remove it (an older one is used)") \
                from None
