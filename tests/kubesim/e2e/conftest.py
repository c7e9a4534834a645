"""End-to-end fixtures: a simulator with every controller, served on loopback, and a lightkube client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from lightkube.generic_resource import create_namespaced_resource

from kubesim import Simulator

TrainJob = create_namespaced_resource("trainer.kubeflow.org", "v1alpha1", "TrainJob", "trainjobs")
JobSet = create_namespaced_resource("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets")
Workload = create_namespaced_resource("kueue.x-k8s.io", "v1beta2", "Workload", "workloads")


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    async with Simulator(bookmark_interval=0.05) as s:
        yield s
