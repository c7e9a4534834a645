"""Value types of dispatch: immutable, with a strict JSON form.

This package imports nothing from ``dispatch`` but :mod:`dispatch.errors` (a leaf), so any part of the
host or an adapter can depend on it.
"""

from dispatch.model._decode import load_json, load_yaml
from dispatch.model.capabilities import Capabilities, Limits, Mode
from dispatch.model.extensions import (
    Extension,
    Extensions,
    Image,
    OpaqueExtension,
    SharedCheckpoint,
    extension_types,
    register_extension,
)
from dispatch.model.identity import (
    ENV_PREFIX,
    EPOCH_BOUND,
    Epoch,
    Handle,
    Identity,
    check_job_id,
    check_nonce,
    new_job_id,
)
from dispatch.model.observation import Absent, Change, Compute, Observation, Reading, Unreachable
from dispatch.model.outcome import TERMINAL_STATES, Cause, Evidence, Outcome, State
from dispatch.model.policy import DEFAULT_POLICY, Action, Plan, PlanAction, Policy, Rule
from dispatch.model.record import Actor, JobRecord, Lease, Transition
from dispatch.model.share import BUCKETS, Share, bucket
from dispatch.model.spec import JobSpec

__all__ = [
    "BUCKETS",
    "DEFAULT_POLICY",
    "ENV_PREFIX",
    "EPOCH_BOUND",
    "TERMINAL_STATES",
    "Absent",
    "Action",
    "Actor",
    "Capabilities",
    "Cause",
    "Change",
    "Compute",
    "Epoch",
    "Evidence",
    "Extension",
    "Extensions",
    "Handle",
    "Identity",
    "Image",
    "JobRecord",
    "JobSpec",
    "Lease",
    "Limits",
    "Mode",
    "Observation",
    "OpaqueExtension",
    "Outcome",
    "Plan",
    "PlanAction",
    "Policy",
    "Reading",
    "Rule",
    "Share",
    "SharedCheckpoint",
    "State",
    "Transition",
    "Unreachable",
    "bucket",
    "check_job_id",
    "check_nonce",
    "extension_types",
    "load_json",
    "load_yaml",
    "new_job_id",
    "register_extension",
]
