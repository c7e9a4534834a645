"""kubesim: an in-process Kubernetes API emulator for dispatch's tests and demos.

It serves the Kubernetes REST API over HTTP(S) on loopback with faithful object semantics (see
``docs/kubesim.md``) and simulated Trainer/JobSet/Job/scheduler/kubelet/Kueue controllers. It imports
nothing from ``dispatch``.
"""

from kubesim.auth import ADMIN, READONLY, Permissions, Rule
from kubesim.clock import Clock, ManualClock, RealClock, rfc3339
from kubesim.errors import ApiError, Cause
from kubesim.logs import PodLogs
from kubesim.resources import REGISTRY, ResourceType
from kubesim.sim import ADMIN_TOKEN, Controller, SettleError, Simulator
from kubesim.store import ObjectStore, WatchEvent

__all__ = [
    "ADMIN",
    "ADMIN_TOKEN",
    "READONLY",
    "REGISTRY",
    "ApiError",
    "Cause",
    "Clock",
    "Controller",
    "ManualClock",
    "ObjectStore",
    "Permissions",
    "PodLogs",
    "RealClock",
    "ResourceType",
    "Rule",
    "SettleError",
    "Simulator",
    "WatchEvent",
    "rfc3339",
]
