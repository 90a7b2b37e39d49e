"""Stage 4, the client: the streaming OpenAI client, its process pool, the SSE parser, /metrics scraping."""
