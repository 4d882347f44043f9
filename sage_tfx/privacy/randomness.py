"""The randomness of every DP release: a ChaCha20 keystream (``SecureRNG``), and ``SamplerError``.

numpy, the standard library and ``cryptography``'s ChaCha20 (the privacy core imports without TensorFlow).

``SecureRNG``, a ChaCha20 keystream keyed by SHA-256(key || stream name, length-prefixed),
reproducible from its key and unpredictable without it. ``secure_rng(seed, stream)``
is how every release gets one: seed=None takes a 256-bit key
from ``secrets`` (production without a grant), an int seed (a grant's private seed from the ledger, or
a test seed) and a stream name give reproducible noise, and distinct stream names give independent
streams (distinct ChaCha20 keys). ``as_secure_rng`` also accepts a numpy Generator (the validators'
historical ``rng=`` argument): its key is 32 bytes drawn from it, so a seeded Generator stays
reproducible; trusted code should pass a ``SecureRNG`` built from the grant's seed directly.

The exact samplers and grid releases that draw from it are ``samplers.py``'s.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import TYPE_CHECKING, Any

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from .checks import integer
from .errors import SageError

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["SamplerError", "SecureRNG", "secure_rng", "as_secure_rng", "BAD_ARGUMENT"]

_U64 = np.uint64
# a bad sampler argument: "{what} must be {rule}, got {value!r}" (the messages these functions always gave)
BAD_ARGUMENT = "{what} must be {rule}, got {value!r}"


class SamplerError(SageError, ValueError):
    """A sampler argument is invalid (a scale, a seed, a cell count, a generator); the message names it.

    Raised before any randomness is drawn. Never carries a data value: ``grid release: values must be
    finite`` names no value (the values may be records read under a grant).
    """


class SecureRNG:
    """A ChaCha20 keystream keyed by SHA-256(len(key) key len(stream) stream): a cryptographically secure generator.

    Reproducible from (key, stream); without the key its output is indistinguishable from uniform (ChaCha20 as
    a pseudo-random function, RFC 8439; ``cryptography``'s implementation). Distinct stream names give distinct
    ChaCha20 keys (the length-prefixed encoding is injective), hence independent streams; the keystream is read
    once, front to back, so no output is ever reused.
    """

    _REFILL = 1 << 16  # keystream bytes per refill (more when one request asks for more)

    def __init__(self, key: bytes, stream: str = "") -> None:

        if not isinstance(key, (bytes, bytearray)) or len(key) < 16:
            raise SamplerError("SecureRNG: key must be at least 16 bytes")
        name = stream.encode("utf-8")
        prefix = len(key).to_bytes(4, "big") + bytes(key) + len(name).to_bytes(4, "big") + name
        chacha_key = hashlib.sha256(b"sage-tfx/secure-rng/v2|" + prefix).digest()
        self._keystream = Cipher(algorithms.ChaCha20(chacha_key, bytes(16)), mode=None).encryptor()
        self._buffer = b""
        self._pos = 0

    def random_bytes(self, n: int) -> bytes:
        """The next n bytes of the stream."""
        if self._pos + n > len(self._buffer):
            fresh = self._keystream.update(bytes(max(self._REFILL, n)))
            self._buffer = self._buffer[self._pos :] + fresh
            self._pos = 0
        out = self._buffer[self._pos : self._pos + n]
        self._pos += n
        return out

    def words(self, n: int, bits: int = 64) -> np.ndarray:
        """n uniform unsigned integers of 64 (uint64) or 32 (uint32) bits."""
        dtype = np.uint64 if bits == 64 else np.uint32
        return np.frombuffer(self.random_bytes(n * (bits // 8)), dtype=dtype).copy()

    def uniform_below(self, m: npt.ArrayLike) -> np.ndarray:
        """Uniform integers in [0, m) for each entry of the int array m (1 <= m < 2^63), exactly.

        Rejection on the bit length: a word masked to the bits of m - 1 is kept iff it is below m (each round
        keeps every entry with probability > 1/2); 32-bit words when every m <= 2^32, else 64-bit words.
        """
        m = np.asarray(m, dtype=np.int64)
        out = np.empty(m.shape, dtype=np.int64)
        if m.size == 0:
            return out
        if int(m.min()) < 1:
            raise SamplerError("uniform_below: bounds must be >= 1")
        top = int(m.max())
        small = top <= (1 << 32)
        dtype = np.uint32 if small else np.uint64
        bits = 32 if small else 64
        flat = m.reshape(-1)
        res = out.reshape(-1)
        mask: Any  # a scalar for one bound, an array for many
        if top == int(m.min()):  # one bound for all (the common case): scalar mask and limit, one draw
            width = 1 << (top - 1).bit_length()
            mask, limit = dtype(width - 1), dtype(top - 1)
            filled = 0
            while filled < flat.size:  # oversample by the rejection rate, keep accepted words in order
                need = flat.size - filled
                r = self.words(int(need * width / top * 1.1) + 16, bits) & mask
                r = r[r <= limit][:need]
                res[filled : filled + r.size] = r
                filled += r.size
            return out
        mask = (flat - 1).astype(np.uint64)  # smear the top bit down: mask = 2^bitlength(m - 1) - 1
        for shift in (1, 2, 4, 8, 16, 32):
            mask |= mask >> _U64(shift)
        mask = mask.astype(dtype)
        mu = (flat - 1).astype(dtype)  # compare r <= m - 1 (m = 2^32 itself does not fit a uint32)
        pending = np.arange(flat.size)
        while pending.size:
            r = self.words(pending.size, bits) & mask[pending]
            ok = r <= mu[pending]
            res[pending[ok]] = r[ok].astype(np.int64)
            pending = pending[~ok]
        return out

    def randbelow(self, m: int) -> int:
        """One uniform integer in [0, m) (Python int m >= 1), exactly: rejection on the bit length of m - 1."""
        if m <= 1:
            return 0
        nbits = (m - 1).bit_length()
        nbytes = (nbits + 7) // 8
        mask = (1 << nbits) - 1
        while True:
            r = int.from_bytes(self.random_bytes(nbytes), "big") & mask
            if r < m:
                return r

    def bits(self, n: int) -> np.ndarray:
        """n fair bits (0/1 int8)."""
        raw = np.frombuffer(self.random_bytes((n + 7) // 8), dtype=np.uint8)
        return np.unpackbits(raw)[:n].astype(np.int8)


def _key_from_seed(seed: int) -> bytes:
    seed = integer(seed, "seed", low=0, error=SamplerError, message=BAD_ARGUMENT)
    raw = seed.to_bytes(max(1, (seed.bit_length() + 7) // 8), "big")
    return hashlib.sha256(b"sage-tfx/noise-key/v1|" + raw).digest()


def secure_rng(seed: int | None = None, stream: str = "") -> SecureRNG:
    """The generator of one noise draw: seed=None -> a 256-bit key from ``secrets``; an int -> its key.

    The same (seed, stream) always gives the same noise; distinct stream names give independent noise.
    A seed known to whoever sees the release lets them subtract the noise: production passes either
    None or a seed only trusted code can derive (the ledger's per-grant private seed).
    """
    if seed is None:
        return SecureRNG(secrets.token_bytes(32), stream)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise SamplerError(f"seed must be None or an integer >= 0, got {seed!r}")
    return SecureRNG(_key_from_seed(int(seed)), stream)


# What a mechanism's ``rng`` may be (``as_secure_rng``): None, a SecureRNG, an int seed or a numpy Generator.
RngLike = SecureRNG | np.random.Generator | int | None


def as_secure_rng(rng: RngLike, stream: str = "") -> SecureRNG:
    """A SecureRNG from None (fresh key), a SecureRNG (itself), an int seed, or a numpy Generator.

    A numpy Generator gives its next 32 bytes as the key: reproducible for a seeded Generator, and as
    unpredictable as the Generator's seed (trusted code passes a SecureRNG or the seed instead).
    """
    if rng is None or isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        return secure_rng(rng, stream)
    if isinstance(rng, SecureRNG):
        return rng
    if isinstance(rng, np.random.Generator):
        return SecureRNG(rng.bytes(32), stream)
    raise SamplerError(f"rng {rng!r} must be None, an int seed, a SecureRNG or a numpy Generator")
