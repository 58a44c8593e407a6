"""The one exception type for user-facing problems (bad input, bad config, missing data).

The CLI turns a SynthlabError into one readable line and a non-zero exit, never a traceback.
Library code raises it for anything a user can fix; programming errors stay ordinary exceptions.

The class is defined in the generators (`synthlab_generators.common`), the bottom floor that
imports nothing from synthlab, and re-exported here: there is exactly one SynthlabError.
"""

from synthlab_generators.common import SynthlabError

__all__ = ["SynthlabError"]
