#!/usr/bin/env python
"""A disk that can be made slow, for the soak bench's "slow disk for artifacts" (benches/soak.py): a FUSE
passthrough of a folder (mfusepy over libfuse, Debian's libfuse2) whose every read and write waits the
delay written in a control file (milliseconds; 0 or no file: no wait). The control plane's media root (the
artifact store) is mounted through it, so a slow spell slows exactly what a slow volume would: storing an
uploaded artifact and serving it to agents.

    .venv/bin/python benches/slowdisk.py SOURCE MOUNTPOINT --control FILE    # foreground; SIGTERM unmounts
    echo 200 > FILE    # every read and write now waits 200 ms; echo 0 > FILE: full speed

Needs /dev/fuse and the right to mount (root, or fusermount from Debian's fuse package). The wait is per
call: a large file read in 128 KiB calls waits once per call, as a disk with a long seek time would."""
from __future__ import annotations

import argparse
import errno
import os
import sys
import threading
import time
from pathlib import Path

CONTROL_POLL_S = 0.2


def _delay_watch(control: Path, state: dict) -> None:
    """Keep state["delay_s"] equal to the control file's milliseconds (polled; a missing or bad file is 0)."""
    while True:
        try:
            state["delay_s"] = max(0.0, float(control.read_text().strip() or 0)) / 1000.0
        except (OSError, ValueError):
            state["delay_s"] = 0.0
        time.sleep(CONTROL_POLL_S)


def operations_make(source: Path, state: dict):
    """The passthrough's operations over `source`, waiting state["delay_s"] in every read and write."""
    import mfusepy

    class SlowPassthrough(mfusepy.Operations):
        use_ns = True  # times in nanoseconds in getattr and utimens, as os.stat and os.utime(ns=) give them

        def _path(self, path: str) -> str:
            return os.path.join(source, path.lstrip("/"))

        def _slow(self) -> None:
            delay = state["delay_s"]
            if delay > 0:
                time.sleep(delay)

        # ------------------------------------------------------------ metadata
        def access(self, path, amode):
            if not os.access(self._path(path), amode):
                raise mfusepy.FuseOSError(errno.EACCES)

        def getattr(self, path, fh=None):
            st = os.lstat(self._path(path))
            return {"st_atime": st.st_atime_ns, "st_ctime": st.st_ctime_ns, "st_mtime": st.st_mtime_ns,
                    **{k: getattr(st, k) for k in ("st_gid", "st_mode", "st_nlink", "st_size", "st_uid")}}

        def readdir(self, path, fh):
            return [".", "..", *os.listdir(self._path(path))]

        def statfs(self, path):
            st = os.statvfs(self._path(path))
            return {k: getattr(st, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag",
                                                "f_frsize", "f_namemax")}

        def chmod(self, path, mode):
            os.chmod(self._path(path), mode)

        def chown(self, path, uid, gid):
            os.chown(self._path(path), uid, gid)

        def utimens(self, path, times=None):
            os.utime(self._path(path), ns=times) if times else os.utime(self._path(path))

        def readlink(self, path):
            return os.readlink(self._path(path))

        # ------------------------------------------------------------ the tree
        def mkdir(self, path, mode):
            os.mkdir(self._path(path), mode)

        def rmdir(self, path):
            os.rmdir(self._path(path))

        def unlink(self, path):
            os.unlink(self._path(path))

        def rename(self, old, new):
            os.rename(self._path(old), self._path(new))

        def symlink(self, target, source_path):
            os.symlink(source_path, self._path(target))

        def link(self, target, source_path):
            os.link(self._path(source_path), self._path(target))

        # ------------------------------------------------------------ contents
        def open(self, path, flags):
            return os.open(self._path(path), flags)

        def create(self, path, mode, fi=None):
            return os.open(self._path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

        def read(self, path, size, offset, fh):
            self._slow()
            return os.pread(fh, size, offset)

        def write(self, path, data, offset, fh):
            self._slow()
            return os.pwrite(fh, data, offset)

        def truncate(self, path, length, fh=None):
            if fh is not None:
                os.ftruncate(fh, length)
            else:
                os.truncate(self._path(path), length)

        def flush(self, path, fh):
            return 0

        def fsync(self, path, datasync, fh):
            self._slow()
            (os.fdatasync if datasync else os.fsync)(fh)

        def release(self, path, fh):
            os.close(fh)

    return SlowPassthrough()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("source", type=Path, help="the folder whose contents the mount shows")
    parser.add_argument("mountpoint", type=Path, help="an empty folder")
    parser.add_argument("--control", type=Path, required=True, help="a file holding the delay in ms (read every 0.2 s)")
    args = parser.parse_args(argv)
    import mfusepy

    args.source.mkdir(parents=True, exist_ok=True)
    args.mountpoint.mkdir(parents=True, exist_ok=True)
    state = {"delay_s": 0.0}
    threading.Thread(target=_delay_watch, args=(args.control, state), daemon=True).start()
    mfusepy.FUSE(operations_make(args.source.resolve(), state), str(args.mountpoint), foreground=True, nothreads=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
