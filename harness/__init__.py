"""Harness: scenario model, engine lifecycle, async client, runner and run-result files."""
