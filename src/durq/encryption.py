"""Payloads and results encrypted at rest with AES-GCM (the ``encryption`` extra).

``durq.App(..., encryption=durq.Encryption(keys={"k2": "<base64>", "k1": "<base64>"}))``, or
``DURQ_ENCRYPTION_KEYS="k2:<base64>,k1:<base64>"``: the first key is the newest. The client
seals a payload after it is validated and encoded (above the broker seam), the worker seals a
handler's result, and each reads back with whichever listed key sealed the value: its key id
is stored beside the ciphertext, so a key can be rotated in (new writes use it) while older
values stay readable; ``durq encryption rotate`` re-seals stored tasks with the newest key.

A sealed value is itself a JSON object, ``{"durq:encrypted": "v1:<key id>:<base64>"}``
(base64 of a 12-byte random nonce and the AES-GCM ciphertext with its tag; the version and key
id are the associated data), so every broker stores it as it stores any payload. Task id, type,
queue, headers, last error, limit keys and the uniqueness digest stay in the clear: brokers
route, order and deduplicate by them. Follow-ups, group fan-ins and webhook deliveries built
from a sealed task carry its sealed payload and result as nested sealed objects; the worker
opens every sealed object of a payload it hands a handler.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from durq import codec
from durq.brokers.params import TaskRewrite
from durq.errors import ConfigurationError, EncryptionError
from durq.states import TaskState

if TYPE_CHECKING:
    from durq.brokers.contract import Admin
    from durq.task import TaskInfo

#: Environment variable of the keys: ``"<id>:<base64 key>,<id>:<base64 key>"``, newest first.
ENV = "DURQ_ENCRYPTION_KEYS"
#: The one key of a sealed object (reserved: a payload may not use it at its top level).
MARKER = codec.SEALED_MARKER
#: How every sealed value begins (a sealed object is written by :meth:`Encryption.seal` only).
PREFIX = b'{"' + MARKER.encode() + b'":"'
_QUOTED_MARKER = b'"' + MARKER.encode() + b'"'
_VERSION = "v1"
_NONCE = 12
_TAG = 16
_KEY_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_KEY_SIZES = (16, 24, 32)


#: Whether stored bytes are a sealed value (cheap: a prefix test).
sealed = codec.is_sealed


def key_id(raw: bytes) -> str | None:
    """The id of the key that sealed ``raw``; ``None`` when it is not sealed."""
    if not sealed(raw):
        return None
    return bytes(raw[len(PREFIX) :]).split(b":", 2)[1].decode("ascii", "replace")


def max_sealed(size: int) -> int:
    """The largest sealed form of a value of ``size`` bytes (base64 of nonce, text and tag)."""
    return len(PREFIX) + len(_VERSION) + 66 + 4 * ((_NONCE + size + _TAG + 2) // 3) + 2


class Encryption:
    """AES-GCM keys by id, the first the newest: new values are sealed with it, and a value
    sealed with any listed key can be read. A key is 16, 24 or 32 bytes (AES-128/192/256),
    given as bytes or as base64 text; :meth:`new_key` makes one. ConfigurationError for a
    malformed id or key, or when the ``cryptography`` package is missing."""

    def __init__(self, keys: Mapping[str, str | bytes]) -> None:
        try:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError as exc:  # pragma: no cover - the encryption extra
            raise ConfigurationError(
                "encryption needs the cryptography package: pip install 'durq[encryption]'"
            ) from exc
        if not keys:
            raise ConfigurationError("encryption needs at least one key")
        self._ciphers: dict[str, Any] = {}
        for kid, key in keys.items():
            if not isinstance(kid, str) or not _KEY_ID.match(kid):
                raise ConfigurationError(
                    f"encryption key ids are 1-64 letters, digits, '_', '.' or '-', got {kid!r:.70}"
                )
            self._ciphers[kid] = AESGCM(_key_bytes(kid, key))
        from cryptography.exceptions import InvalidTag

        self._invalid_tag = InvalidTag
        #: The id of the key new values are sealed with.
        self.newest: str = next(iter(self._ciphers))

    @property
    def key_ids(self) -> tuple[str, ...]:
        """Every key id, newest first."""
        return tuple(self._ciphers)

    def __repr__(self) -> str:  # never the keys
        return f"Encryption(key_ids={list(self._ciphers)!r})"

    @staticmethod
    def new_key() -> str:
        """A fresh random 256-bit key, as base64 text."""
        return base64.b64encode(os.urandom(32)).decode("ascii")

    @classmethod
    def from_env(cls, value: str | None = None) -> Encryption | None:
        """The keys of :data:`ENV` (or of ``value``); ``None`` when it is unset or empty."""
        text = os.environ.get(ENV, "") if value is None else value
        if not text.strip():
            return None
        keys: dict[str, str] = {}
        for item in text.split(","):
            kid, sep, key = item.strip().partition(":")
            if not sep or not key:
                raise ConfigurationError(f"{ENV} holds '<id>:<base64 key>' items, got {kid!r:.70}")
            if kid in keys:
                raise ConfigurationError(f"{ENV} names key {kid!r} twice")
            keys[kid] = key
        return cls(keys)

    def seal(self, plain: bytes, key: str | None = None) -> bytes:
        """``plain`` sealed with the newest key (or ``key``): a JSON object's bytes."""
        kid = self.newest if key is None else key
        nonce = os.urandom(_NONCE)
        body = self._ciphers[kid].encrypt(nonce, plain, _aad(kid))
        text = base64.b64encode(nonce + body)
        return PREFIX + f"{_VERSION}:{kid}:".encode() + text + b'"}'

    def open(self, raw: bytes) -> bytes:
        """The plain bytes of a sealed value; EncryptionError when its key is not listed or
        it was altered, ValueError when ``raw`` is not sealed."""
        if not sealed(raw):
            raise ValueError("not an encrypted value")
        return self._open_text(_sealed_text(raw))

    def _open_text(self, text: Any) -> bytes:
        version, kid, data = str(text).split(":", 2) if str(text).count(":") >= 2 else ("", "", "")
        if version != _VERSION:
            raise EncryptionError(f"unknown encryption format {version or text!r:.40}")
        cipher = self._ciphers.get(kid)
        if cipher is None:
            raise EncryptionError(
                f"encrypted with key {kid!r:.70}, which is not among the configured keys "
                f"{list(self._ciphers)}"
            )
        try:
            blob = base64.b64decode(data.encode("ascii"), validate=True)
            return bytes(cipher.decrypt(blob[:_NONCE], blob[_NONCE:], _aad(kid)))
        except (self._invalid_tag, binascii.Error, UnicodeEncodeError, ValueError):
            raise EncryptionError(
                f"encrypted value does not open with key {kid!r:.70} (altered or wrong key)"
            ) from None

    def decode(self, raw: bytes) -> Any:
        """Stored JSON with every sealed object in it opened (a sealed payload, or a
        follow-up's payload holding its parent's sealed payload and result)."""

        if sealed(raw):  # the common case: a whole sealed payload or result
            return codec.decode(self._open_text(_sealed_text(raw)))

        def hook(obj: dict[str, Any]) -> Any:
            if len(obj) == 1 and isinstance(obj.get(MARKER), str):
                return codec.decode(self._open_text(obj[MARKER]))
            return obj

        return codec.decode(raw, object_hook=hook)


def _sealed_text(raw: bytes) -> str:
    """The marker's value in a sealed value's bytes: ``v1:<key id>:<base64>``, which
    :meth:`Encryption.seal` writes without JSON escapes (anything else is read as JSON)."""
    if raw.endswith(b'"}') and b"\\" not in raw:
        return bytes(raw[len(PREFIX) : -2]).decode("ascii", "replace")
    return str(codec.decode(raw)[MARKER])


def _aad(kid: str) -> bytes:
    return f"durq:{_VERSION}:{kid}".encode()


def _key_bytes(kid: str, key: str | bytes) -> bytes:
    if isinstance(key, bytes) and len(key) in _KEY_SIZES:
        return key
    try:
        raw = base64.b64decode(key, validate=True)
    except (binascii.Error, ValueError, TypeError):
        try:
            raw = base64.urlsafe_b64decode(key)
        except (binascii.Error, ValueError, TypeError):
            raw = b""
    if len(raw) not in _KEY_SIZES:
        raise ConfigurationError(
            f"encryption key {kid!r} must be 16, 24 or 32 bytes in base64 (32 for AES-256)"
        )
    return raw


def has_sealed(raw: bytes | None) -> bool:
    """Whether stored JSON holds a sealed object anywhere (a follow-up of a sealed task)."""
    return raw is not None and _QUOTED_MARKER in raw


def _no_keys(raw: bytes) -> EncryptionError:
    kid = key_id(raw)
    which = f" with key {kid!r:.70}" if kid is not None else ""
    return EncryptionError(f"encrypted{which}, and no keys are configured ({ENV})")


def decode(raw: bytes | None, encryption: Encryption | None) -> Any:
    """Stored JSON (payload or result) as plain data, sealed parts opened. EncryptionError
    when it holds sealed parts and ``encryption`` is ``None`` or lacks their key."""
    if raw is None:
        return None
    if not has_sealed(raw):
        return codec.decode(raw)
    if encryption is None:
        raise _no_keys(raw)
    return encryption.decode(raw)


def decode_payload(raw: bytes, encryption: Encryption | None) -> dict[str, Any]:
    """:func:`decode` of a payload, which must be a JSON object."""
    # The worker's path for every task: one scan for a sealed part, then the plain decode.
    # The scan stays when no keys are configured: it is what turns a sealed part, even one
    # nested in a follow-up's payload, into a clear error instead of ciphertext for a handler.
    # find, not ``in``: bytes' ``in`` first tries its operand as an integer, and the
    # TypeError it makes and drops costs more than the scan.
    if raw.find(_QUOTED_MARKER) < 0:
        value = codec.decode(raw)
    elif encryption is None:
        raise _no_keys(raw)
    else:
        value = encryption.decode(raw)
    if not isinstance(value, dict):
        raise ValueError(f"payload is a JSON {type(value).__name__}, not an object")
    return value


def plain(raw: bytes | None, encryption: Encryption | None) -> bytes | None:
    """Stored bytes with a sealed value opened; unsealed bytes as they are. EncryptionError
    for a sealed value and no keys (or not its key)."""
    if not sealed(raw):
        return raw
    assert raw is not None
    if encryption is None:
        raise _no_keys(raw)
    return encryption.open(raw)


#: States whose tasks ``rotate`` rewrites: every one but active (a worker holds the task; its
#: result is sealed with that worker's newest key, and a later run rewrites its payload).
ROTATED_STATES = (
    TaskState.PENDING,
    TaskState.SCHEDULED,
    TaskState.RETRY,
    TaskState.ARCHIVED,
    TaskState.COMPLETED,
    TaskState.WAITING,
)
#: Tasks read and rewritten per batch.
ROTATE_BATCH = 200


@dataclass
class RotateReport:
    """What :func:`rotate` found: tasks ``examined``; ``rewritten`` (or, on a dry run, to
    rewrite) with the newest key; ``current`` already were; ``moved``: changed state or were
    rewritten meanwhile (left as they are: run it again); ``unreadable``: sealed with a key
    that is not configured, or not JSON where a sealed part was expected; ``active``: held
    by workers, not touched."""

    newest: str
    queues: list[str] = field(default_factory=list)
    examined: int = 0
    rewritten: int = 0
    current: int = 0
    moved: int = 0
    unreadable: int = 0
    active: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def reseal(raw: bytes | None, encryption: Encryption) -> bytes | None:
    """``raw`` sealed with the newest key; ``raw`` itself when it already is (or is
    ``None``). A value stored in the clear is sealed too; one holding sealed parts (a
    follow-up's payload) is opened first, so no older key is needed to read it afterwards.
    EncryptionError / ValueError when it cannot be read."""
    if raw is None:
        return None
    if sealed(raw):
        if key_id(raw) == encryption.newest:
            return raw
        return encryption.seal(encryption.open(raw))
    if has_sealed(raw):
        raw = codec.canonical(encryption.decode(raw))
    return encryption.seal(raw)


async def rotate(
    admin: Admin,
    encryption: Encryption,
    queues: Sequence[str],
    *,
    dry_run: bool = False,
    batch: int = ROTATE_BATCH,
) -> RotateReport:
    """Re-seal the payloads and results of the tasks of ``queues`` with the newest key,
    ``batch`` tasks at a time, each write fenced by :class:`TaskRewrite` (its state and its
    bytes), in the states of :data:`ROTATED_STATES`."""
    report = RotateReport(encryption.newest, list(queues))
    for queue in queues:
        stats = await admin.queue_stats(queue)
        report.active += stats.sizes.get(TaskState.ACTIVE, 0)
        for state in ROTATED_STATES:
            offset = 0
            while page := await admin.list_tasks(queue, state, limit=batch, offset=offset):
                offset += len(page)
                for task in page:
                    await _rotate_one(admin, encryption, task, report, dry_run)
    return report


async def _rotate_one(
    admin: Admin, encryption: Encryption, task: TaskInfo, report: RotateReport, dry_run: bool
) -> None:
    report.examined += 1
    try:
        payload = reseal(task.raw_payload, encryption)
        result = reseal(task.raw_result, encryption)
    except (EncryptionError, ValueError):
        report.unreadable += 1
        return
    assert payload is not None
    if payload == task.raw_payload and result == task.raw_result:
        report.current += 1
        return
    if dry_run:
        report.rewritten += 1
        return
    change = TaskRewrite(
        task.queue, task.id, task.state, task.raw_payload, task.raw_result, payload, result
    )
    if await admin.rewrite_task(change):
        report.rewritten += 1
    else:
        report.moved += 1


__all__ = [
    "ENV",
    "Encryption",
    "RotateReport",
    "decode",
    "decode_payload",
    "key_id",
    "rotate",
    "sealed",
]
