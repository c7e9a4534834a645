"""kubesim's simulated controllers: Trainer, JobSet, Job, scheduler, kubelet, node lifecycle, Kueue, namespace
defaults, persistent volumes, the garbage collector, and the machines' own recovery (a reboot or an autoscaler's replacement).

``default_controllers()`` returns a fresh instance of each, in the order a settle round runs them.
"""

from __future__ import annotations

from kubesim.controllers.actions import Actions
from kubesim.controllers.base import BaseController
from kubesim.controllers.garbagecollector import GarbageCollectorController
from kubesim.controllers.job import JobController
from kubesim.controllers.jobset import JobSetController
from kubesim.controllers.kubelet import KubeletController
from kubesim.controllers.kueue import KueueController
from kubesim.controllers.namespaces import NamespaceDefaultsController
from kubesim.controllers.nodelifecycle import NodeLifecycleController
from kubesim.controllers.noderecovery import NodeRecoveryController
from kubesim.controllers.scheduler import SchedulerController
from kubesim.controllers.trainer import TrainerController
from kubesim.controllers.volumes import PersistentVolumeController

__all__ = [
    "Actions",
    "BaseController",
    "GarbageCollectorController",
    "JobController",
    "JobSetController",
    "KubeletController",
    "KueueController",
    "NamespaceDefaultsController",
    "NodeLifecycleController",
    "NodeRecoveryController",
    "PersistentVolumeController",
    "SchedulerController",
    "TrainerController",
    "default_controllers",
]


def default_controllers() -> list[BaseController]:
    """Every simulated controller (Kueue's stays idle when the simulator has ``kueue=False``)."""
    return [
        TrainerController(),
        KueueController(),
        JobSetController(),
        JobController(),
        PersistentVolumeController(),
        SchedulerController(),
        KubeletController(),
        NodeLifecycleController(),
        NodeRecoveryController(),
        NamespaceDefaultsController(),
        GarbageCollectorController(),
    ]
