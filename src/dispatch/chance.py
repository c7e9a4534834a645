"""Random draws from a source the caller may seed: :func:`source` and :func:`token`.

Every random draw of the host, the stores and the adapters (a supervisor's resync jitter and name, a
record's nonce, a hold token, a memory cluster's identity) comes from a :class:`random.Random` handed to
them, so the deterministic simulation replays a seed exactly. None draws from the ``random`` module's
global generator (``tests/test_layout.py`` checks it): a draw there is one the seed does not govern.
"""

from __future__ import annotations

import os
import random

__all__ = ["source", "token"]


def source(rng: random.Random | None = None) -> random.Random:
    """``rng``, or a fresh generator seeded from the operating system's entropy (a process's own)."""
    return rng if rng is not None else random.Random(int.from_bytes(os.urandom(16), "big"))


def token(rng: random.Random, nbytes: int) -> str:
    """``nbytes`` random bytes from ``rng``, as lowercase hex."""
    return rng.getrandbits(8 * nbytes).to_bytes(nbytes, "big").hex()
