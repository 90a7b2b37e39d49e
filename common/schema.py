"""Shared pydantic bases: frozen configuration models and versioned result files.

Scenario files are validated once and then never mutated: every model is frozen and rejects
unknown keys, so a typo in a YAML file is an error rather than a silently ignored setting.
"""

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, Self, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from .errors import RunDirError
from .jsonfile import JsonProblem, parse_json
from .packed import packed_file, read_stored_bytes


def first_problem(error: ValidationError, *, prefix: Sequence[str | int] = (), whole: str = "") -> str:
    """``field.path: message`` of a validation error's first problem, for a one-line error naming the field.

    ``prefix``: where the validated document sits in its file; ``whole``: the name used when the
    problem is the document itself (no field path).
    """
    first = error.errors()[0]
    where = ".".join(map(str, (*prefix, *first["loc"]))) or whole
    return f"{where}: {first['msg']}"


Number = TypeVar("Number", int, float)


def sorted_unique(values: list[Number], what: str) -> list[Number]:
    """A list field's values in increasing order; ValueError ``{what} must be unique, got [...]`` on a repeat."""
    if len(set(values)) != len(values):
        raise ValueError(f"{what} must be unique, got {values}")
    return sorted(values)


def figures_or_reason(measured: bool, reason: str | None, what: str) -> None:
    """A measurement's check: its figures (``measured``) or the ``reason`` there are none, exactly one of them;
    ValueError ``{what}, exactly one of them`` otherwise."""
    if measured == (reason is not None):
        raise ValueError(f"{what}, exactly one of them")


class StrictModel(BaseModel):
    """Frozen, ``extra="forbid"``, strict-number base model.

    One number policy for every configuration file: ``strict`` refuses a boolean or a string where a
    number belongs (``repetitions: true``, ``conversations: "3"``; an integer still fills a float
    field) and ``allow_inf_nan=False`` refuses ``.inf`` and ``.nan``, each with the field named.
    A field that takes a YAML list as a tuple says ``Field(strict=False)``: sequences are not numbers.
    """

    # defer_build: a model's validator is built when it first validates, not at import. A kvbench process imports
    # about 130 models and validates with a few; building them all took 0.2 s of each process's start (a third).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False, defer_build=True)


class VersionedFile(BaseModel):
    """A result file: a frozen model that knows its file name and schema version.

    ``save`` writes atomically (a temporary file in the same directory, then ``replace``), so a
    killed writer leaves the previous file or the new one, never half of one; ``load`` refuses a
    file whose ``schema_version`` this kvbench does not read, naming the file and both versions.
    Subclasses set ``FILE_NAME`` and declare ``schema_version: Literal[N] = N``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    FILE_NAME: ClassVar[str]
    REBUILD_HINT: ClassVar[str] = "rebuild it with `kvbench report --rewrite RUN_DIR`"

    @classmethod
    def schema_version_read(cls) -> int:
        default = cls.model_fields["schema_version"].default
        if not isinstance(default, int):
            raise TypeError(f"{cls.__name__}.schema_version needs an integer default")
        return default

    def file_text(self) -> str:
        """The file's text exactly as :meth:`write_file` writes it."""
        return self.model_dump_json(indent=2) + "\n"

    def write_file(self, path: Path) -> Path:
        """Write to ``path`` (a file, or a directory to write ``FILE_NAME`` into); return the file."""
        target = path / self.FILE_NAME if path.is_dir() else path
        tmp = target.with_name(target.name + ".tmp")
        try:
            tmp.write_text(self.file_text(), encoding="utf-8")
            tmp.replace(target)
            # a kept run's packed copy holds the previous content: readers take the plain file first, but two
            # versions side by side would leave a reader of the folder to guess which one holds
            packed_file(target).unlink(missing_ok=True)
        except OSError as error:  # a full or read-only disk: one line, and the previous file stays
            raise RunDirError(f"{target}: cannot write: {error.strerror or error}") from None
        finally:
            tmp.unlink(missing_ok=True)
        return target

    @classmethod
    def read_file(cls, path: Path) -> Self:
        """Read ``path`` (a file, or the directory holding ``FILE_NAME``; a kept run's ``NAME.xz`` when the plain
        file is absent)."""
        target = path / cls.FILE_NAME if path.is_dir() else path
        try:
            data = read_stored_bytes(target)
            if data is None:
                raise RunDirError(f"{target}: missing ({cls.REBUILD_HINT.replace('RUN_DIR', str(target.parent))})")
            raw = data.decode("utf-8")
        except OSError as error:
            raise RunDirError(f"{target}: cannot read: {error.strerror or error}") from None
        except UnicodeDecodeError as error:
            raise RunDirError(f"{target}: not UTF-8 text: {error}") from None
        try:
            document = parse_json(raw)
        except JsonProblem as error:
            raise RunDirError(f"{target}: not a JSON object: {error}") from None
        if not isinstance(document, dict):
            raise RunDirError(f"{target}: not a JSON object: got {type(document).__name__}")
        version = document.get("schema_version")
        expected = cls.schema_version_read()
        if version != expected:
            raise RunDirError(f"{target}: schema_version {version!r}; this kvbench reads {expected}")
        try:
            return cls.model_validate_json(raw)
        except ValidationError as error:
            raise RunDirError(f"{target}: not a valid {cls.__name__}: {first_problem(error)}") from None
