"""Names the adapter writes and reads on a cluster: API groups, kinds, labels, annotations.

Everything dispatch puts on a Kubernetes object lives under one label/annotation domain, ``dispatch.dev/``
(plus the well-known ``app.kubernetes.io/managed-by``), so a site can find, select and audit it.
"""

from __future__ import annotations

from typing import Final

NAME: Final = "kubeflow"
"""The adapter's registered name."""

TRAINER_GROUP: Final = "trainer.kubeflow.org"
TRAINER_VERSION: Final = "v1alpha1"
TRAINER_API: Final = f"{TRAINER_GROUP}/{TRAINER_VERSION}"
JOBSET_GROUP: Final = "jobset.x-k8s.io"
JOBSET_VERSION: Final = "v1alpha2"
KUEUE_GROUP: Final = "kueue.x-k8s.io"
KUEUE_VERSION: Final = "v1beta2"

KIND_CLUSTER_TRAINING_RUNTIME: Final = "ClusterTrainingRuntime"
KIND_TRAINING_RUNTIME: Final = "TrainingRuntime"
RUNTIME_KINDS: Final = (KIND_CLUSTER_TRAINING_RUNTIME, KIND_TRAINING_RUNTIME)

DOMAIN: Final = "dispatch.dev"
"""dispatch's own label and annotation prefix (``dispatch.dev/...``)."""

LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "dispatch"
LABEL_JOB_HASH: Final = f"{DOMAIN}/job-hash"
"""A hash of the full job id (job ids may be longer than a label value allows)."""
LABEL_INCARNATION: Final = f"{DOMAIN}/incarnation"
"""``N`` of the epoch: together with the job hash it selects one incarnation's objects and pods."""
LABEL_NONCE: Final = f"{DOMAIN}/nonce"
"""The record's nonce (SPEC §2.4): with the job hash and ``N`` it selects one record's incarnation, so a
purged record's objects, or another store's of the same job id, are never taken for a new record's.
Absent for a record written before nonces."""
LABEL_PROBE: Final = f"{DOMAIN}/probe"
LABEL_STORE: Final = "dispatch.io/store"
"""The identity of the record store whose host created the object (SPEC §6.1): two stores sharing a
cluster never adopt, fold or delete each other's objects. Absent when the host names no store."""
ANNOTATION_JOB_ID: Final = f"{DOMAIN}/job-id"
ANNOTATION_EPOCH: Final = f"{DOMAIN}/epoch"
ANNOTATION_HOLD: Final = f"{DOMAIN}/hold"
"""dispatch's hold on a TrainJob; its value is the hold token (SPEC §9.6)."""
ADMISSION_CONTROLLER: Final = f"{DOMAIN}/admission"
"""The Kueue AdmissionCheck ``controllerName`` that ``dispatch-admission`` serves."""

PATCH_MANAGER: Final = f"{DOMAIN}/kubeflow-adapter"
"""The ``manager`` of the one runtime patch the adapter writes on every TrainJob."""
PROBE_GATE: Final = f"{DOMAIN}/probe"
"""The scheduling gate that keeps the preflight probe's pods from ever being scheduled."""

LABEL_ANCESTOR_STEP: Final = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINER_STEP: Final = "trainer"
NODE_CONTAINER: Final = "node"
LABEL_QUEUE: Final = "kueue.x-k8s.io/queue-name"
LABEL_PRIORITY: Final = "kueue.x-k8s.io/priority-class"
LABEL_JOBSET_NAME: Final = "jobset.sigs.k8s.io/jobset-name"

CHECKPOINT_VOLUME: Final = "dispatch-checkpoint"
"""The name of the volume the adapter adds for ``dispatch/SharedCheckpoint``."""

# Limits of Trainer v2.3's TrainJob CRD and webhooks.
MAX_ENV: Final = 128
MAX_COMMAND: Final = 128
MAX_COMMAND_ITEM: Final = 1_048_576
MAX_IMAGE: Final = 500
MAX_RUNTIME_PATCHES: Final = 16
MAX_NUM_NODES: Final = 2_147_483_647  # int32
MAX_ANNOTATION_BYTES: Final = 262_144
"""The API server's limit on ``metadata.annotations``: keys plus values, in UTF-8 bytes, all of them."""
OWN_ANNOTATION_BYTES: Final = len(ANNOTATION_JOB_ID) + 253 + len(ANNOTATION_EPOCH) + len("999999.999999")
"""The most dispatch's own annotations can take (the longest job id, the largest epoch): settings
``annotations`` get the rest of :data:`MAX_ANNOTATION_BYTES`."""
MAX_OBJECT_BYTES: Final = 1_500_000
"""A TrainJob larger than this would exceed etcd's default request limit (1.5 MiB)."""
