"""Stage 3, runs: one spine (engine, client, warm-up, reset, scrape, records) for run, sweep and soak."""
