"""``--prompt-file`` read with its size bounded (docs/security.md): at most the bytes the
model's context can hold (:func:`adaptrack.limits.prompt_byte_limit`) and a slack of
:data:`~adaptrack.limits.SLACK_BYTES`, plus one, so that a larger file, a pipe or
``/dev/zero`` is refused at once instead of read whole and tokenized; with
``--truncate-prompt`` only its end is kept (that many bytes).

The file is opened before the model loads (a wrong path fails fast) and read after (the
bound depends on the model).

>>> import io
>>> read_prompt(io.BytesIO(b"hello"), "-", 100, slack=100)
'hello'
>>> read_prompt(io.BytesIO(b"x" * 201), "-", 100, slack=100)  # doctest: +ELLIPSIS
Traceback (most recent call last):
adaptrack.cli.common.UsageError: --prompt-file -: stdin has more than 200 bytes: ...
>>> text = read_prompt(io.BytesIO(("é" * 200 + "!").encode()), "-", 100, truncate=True,
...                    slack=100)
>>> len(text), text[-2:]          # the last 200 bytes, less the half character they cut
(100, 'é!')
"""

from __future__ import annotations

import io
import os
import stat
import sys
from typing import BinaryIO, cast

from ..limits import SLACK_BYTES
from .common import UsageError

#: The most a stream (stdin, a pipe, a device) is read when its end is kept.
MAX_STREAM_BYTES = 1 << 30
#: The bound for a model whose context length is unknown.
UNKNOWN_CONTEXT_BYTES = 256 << 20


def open_prompt(path: str) -> BinaryIO:
    """The prompt file (``-``: stdin), opened; a ``UsageError`` when it cannot be."""
    if path == "-":
        raw = getattr(sys.stdin, "buffer", None)
        return raw if raw is not None else cast(BinaryIO, _TextStdin())
    try:
        return open(path, "rb")  # closed by read_prompt
    except OSError as err:
        raise UsageError(f"cannot read prompt file {path!r}: {err.strerror or err}") from None


class _TextStdin(io.RawIOBase):
    """A stdin without bytes (replaced by a text stream, as tests do), read as UTF-8."""

    def read(self, size: int = -1) -> bytes:
        return sys.stdin.read(size).encode("utf-8", "surrogatepass")

    def close(self) -> None:
        """Leave stdin open (only its reader is dropped)."""


def _regular_size(f: BinaryIO) -> int | None:
    try:
        info = os.fstat(f.fileno())
    except (OSError, ValueError, AttributeError):  # a file object without a descriptor
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


def _tail(f: BinaryIO, head: bytes, keep: int, where: str) -> bytes:
    """The last ``keep`` bytes of a stream whose first bytes were ``head``."""
    buf, total = bytearray(head), len(head)
    while chunk := f.read(1 << 20):
        total += len(chunk)
        if total > MAX_STREAM_BYTES:
            raise UsageError(f"--prompt-file: {where} has more than {MAX_STREAM_BYTES >> 20} "
                             "MiB; --truncate-prompt reads a stream up to that (give a "
                             "regular file, whose end is read directly)")
        buf += chunk
        if len(buf) > 2 * keep:
            del buf[:len(buf) - keep]
    return bytes(buf[-keep:])


def read_prompt(f: BinaryIO, path: str, limit: int | None, truncate: bool = False,
                slack: int = SLACK_BYTES) -> str:
    """The UTF-8 text of ``f`` (opened by :func:`open_prompt`), where ``limit`` is the most
    bytes that fit the model's context (None: :data:`UNKNOWN_CONTEXT_BYTES`): at most
    ``slack`` more are read, more is a ``UsageError`` saying so, or with ``truncate`` the
    last that many bytes (cut at a character); a text within the slack is tokenized, and its
    tokens say how far over it is (:func:`adaptrack.limits.prompt_text`)."""
    limit = UNKNOWN_CONTEXT_BYTES if limit is None else limit
    bound = limit + slack
    where = "stdin" if path == "-" else f"prompt file {path!r}"
    try:
        size = _regular_size(f)
        cut = False
        if size is not None and size > bound:
            if not truncate:
                raise _too_big(path, where, str(size), limit)
            f.seek(size - bound)
            data, cut = f.read(bound), True
        else:
            data = f.read(bound + 1)
            if len(data) > bound:
                if not truncate:
                    raise _too_big(path, where, f"more than {bound}", limit)
                data, cut = _tail(f, data, bound, where), True
    except OSError as err:
        raise UsageError(f"cannot read {where}: {err.strerror or err}") from None
    finally:
        if path != "-":
            f.close()
    if cut:  # the cut may fall inside a character: drop its continuation bytes
        data = data[next((i for i, b in enumerate(data[:4]) if b & 0xC0 != 0x80), 0):]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(f"--prompt-file {path}: {where} is not UTF-8 text: {err.reason} at "
                         f"byte {err.start}") from None
    return text


def _too_big(path: str, where: str, size: str, limit: int) -> UsageError:
    return UsageError(f"--prompt-file {path}: {where} has {size} bytes: the model's context "
                      f"holds at most {limit} with --max-new-tokens (as many tokens of the "
                      "vocabulary's longest); shorten it, lower --max-new-tokens or pass "
                      "--truncate-prompt")
