"""A claim's stated rule and how it is decided: rules, per-seed statistics, intervals, verdicts over seeds, laws from saved fits (no torch)."""
