"""rljax's test suite (a regular package, so `tests.*` never resolves to an installed package's `tests`)."""
