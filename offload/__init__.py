"""Offload profiles (engine-neutral KV-cache tier descriptions) and their renderings."""
