"""A trained run scored: on its test split, per group, held-out loss, and its knowledge capacity."""
