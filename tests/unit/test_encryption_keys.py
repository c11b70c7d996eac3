"""durq.Encryption's configuration: keys from code or DURQ_ENCRYPTION_KEYS, newest first;
malformed ids and keys are a ConfigurationError naming what is wrong, never a key."""

from __future__ import annotations

import base64

import pytest

import durq
from durq import encryption as crypt
from durq.encryption import Encryption
from durq.errors import ConfigurationError, EncryptionError, PayloadError

K1, K2 = Encryption.new_key(), Encryption.new_key()


def test_env_keys_newest_first_and_old_ones_readable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(crypt.ENV, f"k1:{K1}")
    old = durq.App("memory://").encryption
    assert old is not None and old.key_ids == ("k1",)
    sealed = old.seal(b'{"a":1}')
    monkeypatch.setenv(crypt.ENV, f" k2:{K2} , k1:{K1}")
    new = durq.App("memory://").encryption
    assert new is not None and new.newest == "k2" and new.key_ids == ("k2", "k1")
    assert new.open(sealed) == b'{"a":1}'
    assert crypt.key_id(new.seal(b"{}")) == "k2"
    assert K1 not in repr(new) and K2 not in repr(new)
    monkeypatch.delenv(crypt.ENV)
    assert durq.App("memory://").encryption is None


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("k1", "'<id>:<base64 key>'"),
        (f"k1:{K1},k1:{K2}", "twice"),
        ("k1:bm90IGEga2V5", "16, 24 or 32 bytes"),
        (f"bad id:{K1}", "key ids"),
    ],
    # Names without the random keys: every xdist worker must collect the same test ids.
    ids=["no key", "a key twice", "a short key", "a bad id"],
)
def test_malformed_keys_are_a_configuration_error(value: str, said: str) -> None:
    with pytest.raises(ConfigurationError, match=said) as caught:
        Encryption.from_env(value)
    assert K1 not in str(caught.value) and K2 not in str(caught.value)


def test_raw_bytes_keys_and_altered_values() -> None:
    keys = Encryption({"raw": base64.b64decode(K1)})
    sealed = keys.seal(b'"x"')
    assert keys.open(sealed) == b'"x"'
    # A character well inside the base64: the last one before the padding also holds bits
    # the decoder ignores, and changing only those alters nothing (a test failing 1 in 4).
    at = len(sealed) - 10
    altered = sealed[:at] + (b"A" if sealed[at : at + 1] != b"A" else b"B") + sealed[at + 1 :]
    with pytest.raises(EncryptionError, match="altered or wrong key"):
        keys.open(altered)
    with pytest.raises(EncryptionError, match="not among the configured keys"):
        Encryption({"other": K2}).open(sealed)


def test_the_marker_is_a_reserved_payload_key() -> None:
    app = durq.App("memory://")
    with pytest.raises(PayloadError, match="reserved"):
        app.params(durq.EnqueueRequest(type="x:y", payload={"durq:encrypted": "v1:k:AAAA"}))
