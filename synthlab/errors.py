"""The one exception type for user-facing problems (bad input, bad config, missing data).

The CLI turns a SynthlabError into one readable line and a non-zero exit, never a traceback.
Library code raises it for anything a user can fix; programming errors stay ordinary exceptions.

The task generators (`synthlab_generators`, the floor below, which imports nothing from the lab)
raise their own `TaskError`; SynthlabError subclasses it, and the lab turns a TaskError into a
SynthlabError where it calls into the generators (`from_tasks`), so lab code sees one type.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from synthlab_generators.common import TaskError

__all__ = ["SynthlabError", "TaskError", "from_tasks"]


class SynthlabError(TaskError):
    """A problem the user can fix; its message is one line that names the culprit."""


@contextlib.contextmanager
def from_tasks() -> Iterator[None]:
    """A TaskError raised in the block comes out as a SynthlabError with the same message."""
    try:
        yield
    except SynthlabError:
        raise
    except TaskError as err:
        raise SynthlabError(str(err)) from None
