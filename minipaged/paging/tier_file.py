"""One owner per tier file: the drum's file (kv_offload_path) is locked while its
KVCache lives.

Two tiers on one file would overwrite each other's frames: a second
numpy.memmap(mode="w+") truncates the first's live file, whose next tier hit reads zeros
(wrong tokens, silently) or dies of SIGBUS. The OS's lock (fcntl.flock) where there is
one, and this process's registry.
"""

from __future__ import annotations

import gc
import os
import stat
import threading

try:  # the OS's lock on a tier file (one owner per file), seen by other processes too
    import fcntl
except ImportError:  # Windows: this process's registry of tier files only
    fcntl = None

# the tier files of this process's live KVCaches (their keys)
_open_tier_files: set[str] = set()
_registry_lock = threading.RLock()  # re-entered when a collection in it releases a file

PATH_ADVICE = (
    "kv_offload_path must be a regular file path in a writable folder, e.g."
    " kv_offload_path='drum.bin'"
)


class TierFile:
    """The open, locked file behind a tier: `fd` (the lock lives on it) until
    `release()`."""

    def __init__(self, path):
        try:
            self.path = os.fsdecode(os.fspath(path))
        except TypeError:
            raise ValueError(
                f"kv_offload_path must be a file path or None, got {path!r}"
            ) from None
        check_tier_path(self.path)
        self.key = os.path.normcase(os.path.realpath(self.path))
        self.fd: int | None = None
        if self._in_use():
            # an engine deleted but still in a reference cycle gives its file back
            gc.collect()
        with _registry_lock:
            if self.key in _open_tier_files:
                raise ValueError(
                    in_use_message(
                        self.path,
                        "another KV cache of this process (an engine or "
                        "KVCache built earlier)",
                    )
                )
            try:
                self.fd = os.open(
                    self.path,
                    os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0),
                    0o644,
                )
            except OSError as error:
                raise ValueError(
                    f"kv_offload_path={self.path!r} cannot be opened for writing "
                    f"({error.strerror or error}): {PATH_ADVICE}"
                ) from None
            if fcntl is not None:
                try:
                    fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # locked already
                    os.close(self.fd)
                    self.fd = None
                    raise ValueError(
                        in_use_message(
                            self.path, "another process (it holds the file's lock)"
                        )
                    ) from None
                # a file system without flock (some network ones): this process's
                # registry only
                except OSError:
                    pass
            _open_tier_files.add(self.key)

    def _in_use(self) -> bool:
        with _registry_lock:
            return self.key in _open_tier_files

    def release(self) -> None:
        """Unlock and close the file, and let the path be used again; twice does
        nothing."""
        with _registry_lock:
            if self.fd is None:
                return
            fd, self.fd = self.fd, None
            _open_tier_files.discard(self.key)
            os.close(fd)  # closing the last descriptor of the file releases its flock


def in_use_message(path: str, who: str) -> str:
    return (
        f"kv_offload_path={path!r} is already in use by {who}: two tiers on one file"
        " overwrite each other's frames. Give this engine another kv_offload_path, or"
        " close the first one's KV cache (engine.kv.close(), or llm.engine.kv.close())"
        " or delete that engine (del engine) first"
    )


def check_tier_path(path: str) -> None:
    """A ValueError naming kv_offload_path unless `path` can be a tier file: a regular
    file (or none yet) in a folder that exists; whether it can be written is found when
    it is opened.
    """
    if not path:
        raise ValueError(f"kv_offload_path is empty: {PATH_ADVICE}")
    folder = os.path.dirname(os.path.abspath(path))
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if not os.path.isdir(folder):
            raise ValueError(
                f"kv_offload_path={path!r}: the folder {folder!r} does not exist; make"
                " it first, or give a file path in an existing, writable folder"
            ) from None
        return
    except OSError as error:
        raise ValueError(
            f"kv_offload_path={path!r} cannot be used ({error.strerror or error}): "
            f"{PATH_ADVICE}"
        ) from None
    if stat.S_ISDIR(mode):
        raise ValueError(
            f"kv_offload_path={path!r} is a folder: give a file path in it, e.g. "
            f"kv_offload_path={os.path.join(path, 'drum.bin')!r}"
        )
    if not stat.S_ISREG(mode):
        raise ValueError(
            f"kv_offload_path={path!r} is not a regular file (a device, pipe or"
            f" socket): {PATH_ADVICE}"
        )
