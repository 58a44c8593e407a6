"""Progress of long work (training, generation, sweeps), shown the way the output is read.

`Progress(total, ...)` is a live tqdm bar on a terminal. Off a terminal (a pipe, a file, CI, a
Ray worker) tqdm's carriage-return refreshes would pile up in one line, so this is where plain
periodic lines belong (issue: quiet logs off a terminal).
"""

from __future__ import annotations

from tqdm import tqdm


class Progress:
    """A progress display with tqdm's update / set_postfix / close."""

    def __init__(self, total: int, *, initial: int = 0, enabled: bool = True, desc: str = "", unit: str = "it"):
        self._bar = tqdm(total=total, initial=initial, disable=not enabled, desc=desc, unit=unit, dynamic_ncols=True)

    def update(self, n: int = 1) -> None:
        self._bar.update(n)

    def set_postfix(self, **values: str) -> None:
        self._bar.set_postfix(**values)

    def close(self) -> None:
        self._bar.close()
