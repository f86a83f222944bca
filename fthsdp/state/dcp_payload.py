"""The training state as `torch.distributed.checkpoint` (DCP) sees it, and a DCP reader that
cannot be made to run code.

    tensors, rest = payload(model, optimizer)   # DCP saves `tensors`; `rest` goes in a side file
    load_into(path, model, optimizer, rest, process_group)

`tensors` uses the standard layout other PyTorch tools read: `model.<fqn>` and
`optimizer.state.<fqn>.<key>` (the fully qualified names of
`torch.distributed.checkpoint.state_dict`), DTensors for sharded (FSDP2) state, so DCP
writes each rank's shards and can reshard on load. Everything that is not a tensor (the
optimizer's param_groups and per-parameter scalars) goes into `rest`, because DCP would
pickle it and load it with `weights_only=False`. DCP's own `.metadata` file is a pickle too:
`SafeReader` unpickles it allowing only DCP's metadata classes and torch's dtypes and sizes,
so a checkpoint directory written by someone else cannot run code in the trainer (it can
still hold wrong numbers: the store's checksums and optional HMAC cover that).
"""

from __future__ import annotations

import contextlib
import pickle
import warnings
from typing import Any, Iterator

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

Tree = dict[str, Any]

_ALLOWED = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "ChunkStorageMetadata", "TensorStorageMetadata",
                                              "TensorProperties", "MetadataIndex", "StorageMeta",
                                              "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "Path"},
    "collections": {"OrderedDict"},
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"checkpoint metadata refers to {module}.{name}, which a DCP checkpoint "
                                     f"of this runtime never holds")


class SafeReader(FileSystemReader):
    """A FileSystemReader whose metadata unpickling admits DCP's metadata types only."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        if not isinstance(metadata, Metadata):
            raise pickle.UnpicklingError(f"checkpoint metadata holds a {type(metadata).__name__}, not DCP Metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _split(tree: Tree) -> tuple[Tree, Tree]:
    """Nested dicts into (the same nesting holding only tensors, holding only the rest)."""
    tensors: Tree = {}
    rest: Tree = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            t, r = _split(value)
            if t:
                tensors[key] = t
            if r or not t:  # an empty dict stays (a plain SGD's optimizer "state": {}; torch reads
                rest[key] = r  # an optimizer state_dict without "state" as a flattened one)
        elif isinstance(value, torch.Tensor):
            tensors[key] = value
        else:
            rest[key] = value
    return tensors, rest


def _merge(tensors: Tree, rest: Tree) -> Tree:
    out = dict(rest)
    for key, value in tensors.items():
        out[key] = _merge(value, out.get(key, {})) if isinstance(value, dict) else value
    return out


def payload(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Tree, Tree]:
    """(tensors for DCP, everything else) of model + optimizer; the tensors are the live ones."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return _split({"model": dict(model_sd), "optimizer": dict(optim_sd)})


def save(tensors: Tree, path: str, process_group: dist.ProcessGroup | None) -> None:
    """Collective over `process_group` (every rank writes its shards); alone when None."""
    with _alone_is_meant(process_group):
        dcp.save(tensors, storage_writer=dcp.FileSystemWriter(path, sync_files=True), process_group=process_group,
                 no_dist=process_group is None)


@contextlib.contextmanager
def _alone_is_meant(process_group: dist.ProcessGroup | None) -> Iterator[None]:
    """DCP warns on every single-process save and load; without a group alone is what is asked for."""
    with warnings.catch_warnings():
        if process_group is None:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def read_whole(path: str) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint written by `save`, whole (shards joined), by its flat name
    (`model.<fqn>`, `optimizer.state.<fqn>.<key>`); read alone, without a process group."""
    metadata = SafeReader(path).read_metadata()
    tensors = {name: torch.empty(tuple(m.size), dtype=m.properties.dtype)
               for name, m in metadata.state_dict_metadata.items() if isinstance(m, TensorStorageMetadata)}
    with _alone_is_meant(None):
        dcp.load(tensors, storage_reader=SafeReader(path), no_dist=True)
    return tensors


def load_into(path: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, rest: Tree,
              process_group: dist.ProcessGroup | None) -> None:
    """Load a checkpoint written by `save` (+ its `rest`) into the live model and optimizer."""
    tensors, _ = payload(model, optimizer)  # the live tensors, shaped like this rank's shards
    with _alone_is_meant(process_group):
        dcp.load(tensors, storage_reader=SafeReader(path), process_group=process_group,
                 no_dist=process_group is None)
    state = _merge(tensors, rest)
    set_state_dict(model, optimizer, model_state_dict=state.get("model", {}), optim_state_dict=state["optimizer"])
