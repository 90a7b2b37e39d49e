"""Workload generators: turn a scenario's workload section into conversations and requests."""
