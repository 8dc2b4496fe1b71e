"""A ``torch.distributed.checkpoint`` writer whose save is all or nothing: a save killed part-way (a rank SIGKILLed,
the machine lost) leaves the checkpoint that was at its path whole and loadable.

PyTorch's ``FileSystemWriter`` writes every rank's data file (``__<rank>_<n>.distcp``) in place into the checkpoint's
folder and only the ``.metadata`` file atomically (temporary file, rename), last. Saving again into the same folder
therefore overwrites the previous checkpoint's data files while its old ``.metadata`` still describes them: a save
that dies after a rank has written its file leaves a folder that loads, silently, part old and part new values.

:class:`AtomicFileSystemWriter` keeps the checkpoint's path a symbolic link to the folder of its current version.
Every rank writes into a new folder beside it (``<path>.v-<save id>``, named by the coordinator and sent to the ranks
with their plans); once all have written, the coordinator writes the metadata there, syncs the folder, and points the
link at it by one atomic ``os.replace``; only then are earlier versions (and folders of saves that died) removed.
Loading is unchanged: ``dcp.load(..., checkpoint_id=path)`` reads through the link.

This module imports ``torch.distributed.checkpoint`` (about a second): import it where you save.

Example::

    from lazyxla.parallel.atomic_checkpoint import AtomicFileSystemWriter

    dcp.save(state, storage_writer=AtomicFileSystemWriter("ckpt/latest"))
    dcp.load(state, checkpoint_id="ckpt/latest")
"""

from __future__ import annotations

import dataclasses
import glob
import os
import shutil
from pathlib import Path

from torch.distributed.checkpoint import FileSystemWriter


@dataclasses.dataclass(frozen=True)
class StagedPrefix:
    """A rank's part of the save plan: the prefix of its data files (``prefix``, which ``FileSystemWriter.write_data``
    reads) and the folder of the version being written (a name beside the checkpoint's path)."""

    prefix: str
    folder: str


class AtomicFileSystemWriter(FileSystemWriter):
    """``FileSystemWriter`` that writes each save into a new folder and makes it the checkpoint at ``path`` atomically
    (``path`` is a symbolic link to the current version's folder). Takes ``FileSystemWriter``'s arguments.

    Example::

        writer = AtomicFileSystemWriter("ckpt/latest")
        dcp.save({"model": model_sd, "optim": optim_sd}, storage_writer=writer)
    """

    def __init__(self, path: str | os.PathLike, *args, **kwargs) -> None:
        super().__init__(path, *args, **kwargs)
        self._target = Path(self.path)

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        super().reset(checkpoint_id)
        if checkpoint_id:
            self._target = Path(self.path)
        self.path = self._target  # (write_data pointed it at the previous save's folder)

    @property
    def checkpoint_id(self) -> str | os.PathLike:
        return self._target

    def prepare_local_plan(self, plan):
        if self.rank is not None and not self.use_collectives:
            raise NotImplementedError(
                "AtomicFileSystemWriter needs the ranks to agree on the new version's folder: save with "
                "use_collectives=True (the default)"
            )
        target = self._target
        if target.exists() and not target.is_symlink():
            raise ValueError(
                f"AtomicFileSystemWriter: {str(target)!r} is a folder, not the link this writer keeps to the "
                "checkpoint's current version (a checkpoint written in place, by FileSystemWriter?). Save to a new "
                "path, or move that folder away first"
            )
        return plan

    def prepare_global_plan(self, plans):
        # the coordinator names the new version's folder; each rank gets it with its plan
        folder = f"{self._target.name}.v-{self.save_id}"
        return [dataclasses.replace(p, storage_data=StagedPrefix(f"__{i}_", folder)) for i, p in enumerate(plans)]

    def write_data(self, plan, planner):
        self.path = self._target.parent / plan.storage_data.folder
        self.fs.mkdir(self.path)
        return super().write_data(plan, planner)

    def finish(self, metadata, results) -> None:
        staged = Path(self.path)  # this save's folder (the coordinator wrote its own data there too)
        super().finish(metadata, results)  # .metadata, written to a temporary file and renamed, synced
        target = self._target
        _fsync_folder(staged)
        link = target.parent / f".{target.name}.link-{self.save_id}"
        os.symlink(staged.name, link)
        os.replace(link, target)  # the one atomic step: the checkpoint is now this version
        _fsync_folder(target.parent)
        # earlier versions, and the folders of saves that died before their link, are no checkpoint any more
        for old in target.parent.glob(f"{glob.escape(target.name)}.v-*"):
            if old.name != staged.name:
                shutil.rmtree(old, ignore_errors=True)
        self.path = target


def _fsync_folder(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
