"""Stage 5, the store: the run directory, append-only records and events, the typed manifest."""
