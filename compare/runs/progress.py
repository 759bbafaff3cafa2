"""The live display while backends run: a rich progress bar per backend with step, loss and step
time."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class LiveProgress:
    def __init__(self, enabled: bool, steps: int):
        self.steps = steps
        self.progress = Progress(
            TextColumn("{task.description:>10}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}  {task.fields[ms]} ms/step"),
            TimeElapsedColumn(),
            console=Console(stderr=True, markup=False),
            disable=not enabled,
        )

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def task(self, name: str):
        """A callback `(step, loss, ms)` that moves this backend's bar."""
        task = self.progress.add_task(name, total=self.steps, loss="-", ms="-")

        def update(step, loss, ms):
            self.progress.update(task, completed=step + 1, loss=f"{loss:.4f}", ms=f"{ms:.2f}")

        return update
