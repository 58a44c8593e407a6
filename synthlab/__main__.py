"""`python -m synthlab ...` runs the command line (what `torchrun ... -m synthlab train ...` starts)."""

from synthlab.cli import app

if __name__ == "__main__":
    app(prog_name="synthlab")
