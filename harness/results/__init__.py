"""Stage 6, results: pure functions of stored files -> versioned result files."""
