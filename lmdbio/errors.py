"""The exceptions lmdbio raises.

Every error that comes from bad input names the file (and where it applies the page, key or
config path) and what was expected, so that a user can act on it without a debugger.
"""

from __future__ import annotations


class LmdbioError(Exception):
    """Base class of every error lmdbio raises on purpose."""


class LmdbFormatError(LmdbioError):
    """An LMDB file is not what its own headers promise (corrupt, truncated, unsupported)."""

    def __init__(self, path: object, what: str, page: int | None = None) -> None:
        self.path = str(path)
        self.page = page
        self.what = what
        where = f"{self.path}" if page is None else f"{self.path}, page {page}"
        super().__init__(f"{where}: {what}")


class CodecError(LmdbioError):
    """A compressed payload or an encoded record could not be decoded."""


class CodecTypeError(CodecError, TypeError):
    """A codec was handed a buffer of a type it cannot take (an object array): a
    :class:`TypeError` too, as numcodecs' codecs raise and its test helpers expect."""


class ConfigError(LmdbioError):
    """A job configuration names an unknown key, has a wrong type or an impossible value."""


class RecordError(LmdbioError):
    """One record failed to decode; carries the key so the policy (raise/skip/substitute)
    can report it."""

    def __init__(self, key: bytes, what: str) -> None:
        self.key = key
        self.what = what
        super().__init__(f"record {key!r}: {what}")


class JobError(LmdbioError):
    """A failure every rank of a job agreed on (:class:`lmdbio.mpiutil.fail_together`).

    The message is what rank 0 reports; ``quiet`` is set on the other ranks, which exit
    with the same ``exit_code`` without printing it again.
    """

    def __init__(self, message: str, *, exit_code: int = 2, quiet: bool = False) -> None:
        super().__init__(message)
        self.exit_code = int(exit_code)
        self.quiet = bool(quiet)
