"""Reports built only from stored run files: console, Markdown, CSV."""
