"""A backend process's stdout, read by compare from the process's start to its end.

A pipe nobody reads fills up (64 KiB) and blocks the process that writes it, so every process
compare starts with its stdout on a pipe has a reader for its whole life. A describe step that goes
on to make its side's run (compare/runs/prepare.py) is read the same: what it prints while
describing is dropped, its `described` line (common/protocol.py) tells compare the step is done, and
once compare hands it a run, its lines go to the run's stdout.log and its progress lines to the live
display, as a backend started for the run would.
"""

from __future__ import annotations

import threading

from common.protocol import DESCRIBED, read_progress


class BackendOutput:
    """The reader of one process's stdout: a daemon thread, to the pipe's end."""

    def __init__(self, stream, log=None, on_progress=None):
        """`log` (and `on_progress`): a run's, attached before the first line is read (a backend
        started for its run); None: a describe step's, whose run is attached later, if ever."""
        self.described = threading.Event()
        # (log, on_progress) once a run is attached
        self._sink = (log, on_progress) if log is not None else None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def attach(self, log, on_progress=None) -> None:
        """Every line from now on to `log` (flushed), the progress lines to `on_progress(step, loss,
        ms)`."""
        with self._lock:
            self._sink = (log, on_progress)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout=timeout)

    def _read(self, stream) -> None:
        for line in stream:
            with self._lock:
                sink = self._sink
            if sink is None:
                if line.rstrip("\n") == DESCRIBED:
                    self.described.set()
                continue
            log, on_progress = sink
            log.write(line)
            log.flush()
            progress = read_progress(line) if on_progress else None
            if progress:
                on_progress(*progress)
