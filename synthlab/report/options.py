"""How a report of sweeps is written, as a typed dataclass: `synthlab report`'s flags and their help
come from its fields (`synthlab.cli.flags`), and `write_report` takes the same values as keywords.

Light on purpose (no pandas): the CLI builds its flags from it when it starts.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from synthlab.serialize import option


@dataclasses.dataclass(frozen=True)
class ReportOptions:
    """Where `synthlab report DIR...` writes, and what: copies of the results, readings beside the
    verdicts, the heading, one file or an index with a page per sweep."""

    out: Path = option(Path("report.md"), "Markdown file to write; figures go beside it.", short="-o")
    copy_results: bool = option(
        False,
        "Copy each results.csv (and the per-prompt outcomes its verdicts read) beside the report (for results/).",
        flag="--copy/--no-copy",
    )
    notes: Path | None = option(
        None,
        "TOML file: experiment name (or, with --index, a sweep's page folder) -> a reading (Markdown) beside its "
        "verdicts; key 'preamble' -> text under the heading.",
    )
    title: str = option("synthlab results", "The report's heading.")
    index: bool = option(
        False,
        "Write OUT as an index (claims table with each verdict's scale, a line per sweep) and each sweep's section "
        "as a page beside it: README.md in the sweep's folder where it lies inside OUT's, else EXPERIMENT/README.md.",
        flag="--index/--one-file",
    )
