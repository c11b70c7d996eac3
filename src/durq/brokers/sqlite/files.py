"""The modes of the database's files: the database, its ``-wal``, ``-shm`` and ``-journal``.

They hold every payload and result, so durq creates the database ``0600`` (``file_mode``),
whatever the umask; SQLite then gives the files it makes next to it (``-wal``, ``-shm``,
``-journal``) the database's own mode. An existing database keeps its mode: one more open
than ``file_mode`` is logged, not changed (other users' processes may share it on purpose).
"""

from __future__ import annotations

import logging
import os
import stat

from durq.errors import ConfigurationError

log = logging.getLogger("durq.sqlite")

#: Owner read and write only: no other local user reads the tasks.
DEFAULT_FILE_MODE = 0o600
# Databases warned about already: once per process is enough.
_warned: set[str] = set()


def check_file_mode(mode: int) -> int:
    """``mode`` if it is a database file mode durq accepts, else :class:`ConfigurationError`:
    the owner reads and writes (SQLite needs both), group and others at most read and write,
    nothing else (no execute, setuid or sticky bits)."""
    if (
        isinstance(mode, bool)
        or not isinstance(mode, int)
        or mode & ~0o666
        or mode & 0o600 != 0o600
    ):
        shown = f"{mode:04o}" if isinstance(mode, int) else repr(mode)
        raise ConfigurationError(
            f"invalid SQLite file_mode {shown}: use octal read/write bits from 0600 (owner "
            "only, the default) to 0666, e.g. 0640 to let the file's group read it"
        )
    return mode


def parse_file_mode(text: str) -> int:
    """An octal mode from a URL option (``0640``, ``640`` or ``0o640``), checked."""
    try:
        mode = int(text, 8)
    except ValueError:
        raise ConfigurationError(
            f"invalid SQLite file_mode {text!r}: octal permission bits such as 0600 or 0640"
        ) from None
    return check_file_mode(mode)


def create(path: str, mode: int) -> None:
    """Create the database file, empty, with exactly ``mode`` if nothing is at ``path``:
    SQLite would create it ``0644`` less the umask, and copies that to the files it makes
    next to it. Anything else (it exists, a missing directory) is left to SQLite's open,
    which reports it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, mode)
    except OSError:
        return
    try:
        if hasattr(os, "fchmod"):  # not on Windows, where modes mean little
            os.fchmod(fd, mode)  # the umask may have taken bits off the mode asked for
    finally:
        os.close(fd)


def warn_if_open(path: str, mode: int) -> None:
    """Log a warning if the database at ``path`` grants more than ``mode`` (made by an older
    durq, by SQLite, or by hand): it is not changed, the warning says how to."""
    try:
        current = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return
    if current & ~mode and path not in _warned:
        _warned.add(path)
        log.warning(
            "SQLite database %s has mode %04o, more open than file_mode %04o: other local "
            "users may read its tasks. Run `chmod %o %s %s-wal %s-shm` (SQLite gives the "
            "files it makes again the database's mode), or set file_mode to the mode meant",
            path,
            current,
            mode,
            mode,
            path,
            path,
            path,
        )
