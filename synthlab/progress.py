"""Progress of long work (training, generation, sweeps), shown the way the output is read.

`Progress(total, ...)` is a live tqdm bar on a terminal. Off a terminal (a pipe, a file, CI, a
Ray worker) tqdm's carriage-return refreshes would pile up in one line, so there it writes a plain
line every `interval` seconds and one at the end:

    train bios: step 120/1500 (8%) loss=2.3456 tok_s=12,345 elapsed 0:01:02 eta 0:11:53
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from typing import TextIO

from tqdm import tqdm


def _clock(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))


class Progress:
    """A progress display with tqdm's update / set_postfix / close.

    stream: where it writes (default sys.stderr); a live bar when it is a terminal, plain lines
    (at most one per `interval` seconds, plus a last one on close) otherwise.
    """

    def __init__(
        self,
        total: int,
        *,
        initial: int = 0,
        enabled: bool = True,
        desc: str = "",
        unit: str = "it",
        interval: float = 30.0,
        stream: TextIO | None = None,
    ):
        self._stream = stream if stream is not None else sys.stderr
        self._enabled = enabled
        self._bar = None
        if enabled and self._stream.isatty():
            self._bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, file=self._stream)
        self.total, self.n, self._initial, self.desc, self.unit = total, initial, initial, desc, unit
        self.interval, self._postfix = interval, ""
        self._start = self._last = time.monotonic()
        self._printed = initial  # progress count at the last line written

    def update(self, n: int = 1) -> None:
        self.n += n
        if self._bar is not None:
            self._bar.update(n)
        elif self._enabled and time.monotonic() - self._last >= self.interval:
            self._line()

    def set_postfix(self, **values: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix(**values)
        self._postfix = " ".join(f"{k}={v}" for k, v in values.items())

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self._enabled and self.n != self._printed:
            self._line()
        self._enabled = False  # a second close writes nothing

    def _line(self) -> None:
        now = time.monotonic()
        elapsed, done = now - self._start, self.n - self._initial
        percent = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        parts = [f"{self.desc}: " if self.desc else "", f"{self.unit} {self.n}/{self.total}{percent}"]
        if self._postfix:
            parts.append(" " + self._postfix)
        parts.append(f" elapsed {_clock(elapsed)}")
        if 0 < done and self.n < self.total:
            parts.append(f" eta {_clock((self.total - self.n) * elapsed / done)}")
        self._stream.write("".join(parts) + "\n")
        self._stream.flush()
        self._last, self._printed = now, self.n
