"""synthlab: a synthetic-task science lab for looped (recurrent-depth) language models.

Importing the package is cheap on purpose (no torch): `synthlab gen` and `synthlab fit` must not
pay for torch's start-up. Heavy modules are imported where they are used.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("synthlab")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"

from synthlab.errors import SynthlabError

__all__ = ["SynthlabError", "__version__", "load_model"]


def __getattr__(name: str):
    """`synthlab.load_model(run_dir)`: the trained model of a run folder, in eval mode. Loaded on
    first use, so that `import synthlab` stays free of torch."""
    if name == "load_model":
        from synthlab.training.run_folders import load_model  # torch: on first use (see above)

        return load_model
    raise AttributeError(f"module 'synthlab' has no attribute {name!r}")
