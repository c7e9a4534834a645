"""Job files: read strictly (errors name the file and the path), and a cluster's refusal of one naming it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dispatch.cli.config import read_limited
from dispatch.errors import InvalidError, ReadOnlyError, UnsupportedError
from dispatch.model import JobSpec
from dispatch.registry import load_installed

__all__ = ["load_adapter_extensions", "load_job", "load_spec", "refused_job"]


def load_spec(jobfile: str) -> JobSpec:
    """Read a job file (YAML; JSON when it ends ``.json``) strictly. Errors name the file and the path."""
    path = Path(jobfile)
    data = read_limited(path, "job file")  # a 50 MB job file would take seconds and bloat the store
    try:
        return JobSpec.loads(data, format="json" if path.suffix == ".json" else "yaml")
    except InvalidError as exc:
        err = InvalidError(exc.detail, path=exc.path)
        err.args = (f"{jobfile}: {exc}",)
        raise err from None


def load_job(jobfile: str) -> JobSpec:
    """Read a job file with every installed adapter's extension types known."""
    load_adapter_extensions()
    return load_spec(jobfile)


def load_adapter_extensions() -> None:
    """Load every installed adapter, so that its extension types decode (e.g. ``kubeflow/RuntimeRef``)."""
    load_installed()


@contextmanager
def refused_job(jobfile: str) -> Iterator[None]:
    """A cluster's refusal of a job (``UnsupportedError``: a runtime that does not exist, a queue...; an
    ``InvalidError`` naming a path in the spec: more than the adapter can carry) names the job file, as
    the file's own errors do; the reasons name the path in it and the alternatives."""
    try:
        yield
    except ReadOnlyError:
        raise
    except UnsupportedError as exc:
        raise UnsupportedError([f"{jobfile}: {r}" for r in exc.reasons]) from None
    except InvalidError as exc:
        # Only a path in the job (command[0], env["X"]): a setting's or the kubeconfig's is not the file's.
        field = re.split(r"[.\[]", exc.path or "", maxsplit=1)[0]
        if field not in JobSpec.__struct_encode_fields__ or str(exc).startswith(f"{jobfile}:"):
            raise
        err = InvalidError(exc.detail, path=exc.path)
        err.args = (f"{jobfile}: {exc}",)
        raise err from None
