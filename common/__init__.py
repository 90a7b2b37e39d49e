"""The ground floor: what every stage of kvbench shares and that imports nothing of them.

``errors`` (the exception classes and their one-line messages), ``schema`` (``StrictModel``, ``VersionedFile``),
``redact`` (secrets out of argv, logs and records), ``yamlfile`` (a YAML mapping with one-line errors),
``markup`` (user-chosen names as data in Rich and Markdown) and ``private`` (owner-only files and directories).
See docs/architecture.md.
"""

__version__ = "0.1.0"
