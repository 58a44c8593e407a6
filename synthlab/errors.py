"""The one exception type for user-facing problems (bad input, bad config, missing data).

The CLI turns a SynthlabError into one readable line and a non-zero exit, never a traceback.
Library code raises it for anything a user can fix; programming errors stay ordinary exceptions.
"""


class SynthlabError(Exception):
    """A problem the user can fix; its message is one line that names the culprit."""
