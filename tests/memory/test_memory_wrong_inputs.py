"""Wrong types through the memory adapter's Python API: ``InvalidError`` naming the argument or
setting, never a bare ``TypeError``/``AttributeError``."""

from __future__ import annotations

import math
from typing import Any

import pytest

from dispatch import Identity, InvalidError, JobSpec, ManualClock
from dispatch.memory import MemoryBackend, MemorySettings


@pytest.mark.parametrize(
    ("kwargs", "path"),
    [
        ({"nodes": "4"}, "nodes"),
        ({"nodes": 2.5}, "nodes"),
        ({"watch_history": True}, "watchHistory"),
        ({"start_delay": "1s"}, "startDelay"),
        ({"cessation_delay": math.nan}, "cessationDelay"),
        ({"image_pull_grace": math.inf}, "imagePullGrace"),
        ({"default_script": 3}, "defaultScript"),
        ({"cluster": 3}, "cluster"),
    ],
)
def test_settings_of_the_wrong_type(kwargs: dict[str, Any], path: str) -> None:
    with pytest.raises(InvalidError) as info:
        MemorySettings(**kwargs)
    assert info.value.path == path


def test_backend_settings_must_be_memory_settings() -> None:
    with pytest.raises(InvalidError) as info:
        MemoryBackend({"nodes": 2})  # type: ignore[arg-type]
    assert info.value.path == "settings"


async def test_an_identity_must_be_an_identity() -> None:
    backend = MemoryBackend(MemorySettings(nodes=2), clock=ManualClock())
    spec = JobSpec(["train"])
    with pytest.raises(InvalidError) as info:
        await backend.prepare(spec, "j")  # type: ignore[arg-type]
    assert info.value.path == "identity"
    with pytest.raises(InvalidError) as info:
        await backend.start(spec)  # type: ignore[arg-type]
    assert info.value.path == "prepared"
    with pytest.raises(InvalidError) as info:
        backend.native_name("j")  # type: ignore[arg-type]
    assert info.value.path == "identity"
    assert backend.native_name(Identity("j")).startswith("j-1-")
