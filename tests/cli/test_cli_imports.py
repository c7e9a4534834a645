"""What a command imports: the structure behind fast read commands (SPEC §11.1), checked on module names
in a new process (``python -X importtime``), never on time; ``benchmarks/cli_bench.py`` measures the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dispatch.cli.operating import UNMATCHED
from dispatch.supervise import UnmatchedPolicy

ADAPTER_ONLY = ("dispatch_kubeflow", "dispatch_slurm", "lightkube", "httpx2", "httpcore2", "anyio", "h11")
"""What only an adapter that talks to a cluster needs: a command that does not open one imports none."""

ONE_COMMAND_ONLY = (
    "dispatch.supervise",
    "dispatch.health",
    "http.server",
    "urllib.request",
    "yaml",
    "importlib.metadata",
)
"""What few commands need (the supervisor; the dev cluster's health check; job files; `version` and
`adapters`, which read the installed distributions): no read command imports them."""


def imported(*args: str, env: dict[str, str] | None = None) -> set[str]:
    """The modules ``python -X importtime ARGS`` imported (its stderr names each one)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    names = set()
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    assert "dispatch" in names or "dispatch_kubeflow.kube" in names  # the output was read
    return names


def roots(names: set[str], wanted: tuple[str, ...]) -> set[str]:
    return {n for n in names if any(n == w or n.startswith(w + ".") for w in wanted)}


def test_help_imports_no_adapter_and_no_supervisor() -> None:
    names = imported("-m", "dispatch.cli", "--help")
    assert "click" in names
    assert roots(names, ADAPTER_ONLY + ONE_COMMAND_ONLY) == set()


def test_a_read_command_answered_from_the_records_imports_no_adapter(tmp_path: Path) -> None:
    # No dev cluster runs in this state directory: `list` shows the (empty) records as last known.
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
    env["DISPATCH_STATE_DIR"] = str(tmp_path / "state")
    names = imported("-m", "dispatch.cli", "list", env=env)
    assert "dispatch.cluster" in names
    assert roots(names, ADAPTER_ONLY + ONE_COMMAND_ONLY) == set()


def test_the_read_path_builds_no_dataclass() -> None:
    """A dataclass compiles its generated methods at import: what a read command of a Kubernetes cluster
    loads (the CLI, the store, the adapter, its cause table) holds msgspec Structs instead
    (docs/architecture.md, "A value type on a read command's path")."""
    script = (
        "import sys\n"
        "import dispatch.cli.commands, dispatch.cli.lazy, dispatch.cli.render, dispatch.records.sqlite\n"
        "import dispatch_kubeflow.backend, dispatch_kubeflow.causes, dispatch_kubeflow.output\n"
        "assert 'dataclasses' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


HTTP_LIBRARIES = (
    "lightkube",
    "httpx2",
    "httpcore2",
    "httpx",
    "httpcore",
    "anyio",
    "h11",
    "h2",
    "trio",
    "yaml",
)
"""Third-party HTTP and Kubernetes libraries: the adapter speaks HTTP/1.1 with its own small client."""


def test_connecting_imports_no_http_library_and_yaml_only_for_a_yaml_kubeconfig(tmp_path: Path) -> None:
    """A kubeconfig written as JSON (kubesim and the dev cluster write theirs so) is read without YAML;
    one written as YAML imports it. No third-party HTTP or Kubernetes library is imported either way."""
    doc = (
        '{"apiVersion": "v1", "kind": "Config", "current-context": "c",'
        ' "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:9", "insecure-skip-tls-verify": true}}],'
        ' "users": [{"name": "u", "user": {"token": "not-a-real-token"}}],'
        ' "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}'
    )
    as_json, as_yaml = tmp_path / "kubeconfig.json", tmp_path / "kubeconfig.yaml"
    as_json.write_text(doc)
    as_yaml.write_text("# a comment makes it YAML\n" + doc)
    for path, yaml_expected in ((as_json, False), (as_yaml, True)):
        script = (
            "import sys\n"
            "from dispatch_kubeflow.kube import KubeClient\n"
            f"KubeClient.connect(kubeconfig={str(path)!r})\n"
            f"loaded = sorted({{n.split('.')[0] for n in sys.modules}} & {set(HTTP_LIBRARIES)!r})\n"
            f"assert loaded == {['yaml'] if yaml_expected else []!r}, loaded\n"
        )
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]


def test_the_unmatched_choices_are_the_supervisors() -> None:
    assert set(UNMATCHED) == {u.value for u in UnmatchedPolicy}
    assert UNMATCHED[0] == UnmatchedPolicy.IGNORE.value  # the default


def test_the_embedded_default_is_its_documented_text_decoded() -> None:
    import yaml

    from dispatch.cli.config import DEFAULT_CONFIG, DEFAULT_DOCUMENT, embedded_config, parse_config

    assert yaml.safe_load(DEFAULT_CONFIG) == DEFAULT_DOCUMENT
    parsed = parse_config(DEFAULT_CONFIG)
    embedded = embedded_config()
    assert (embedded.adapter, embedded.policy, embedded.store) == (
        parsed.adapter,
        parsed.policy,
        parsed.store,
    )


def test_the_builtin_adapters_are_the_distributions_entry_points() -> None:
    from importlib.metadata import distribution

    from dispatch.registry import BUILTIN, ENTRY_POINT_GROUP

    installed = distribution("dispatch-train").entry_points.select(group=ENTRY_POINT_GROUP)
    assert {ep.name: ep.value for ep in installed} == BUILTIN


def test_the_user_agent_names_the_installed_version() -> None:
    from importlib.metadata import version

    import dispatch
    from dispatch_kubeflow.kube import user_agent

    assert dispatch.__version__ == version("dispatch-train")
    assert user_agent() == f"dispatch/{version('dispatch-train')}"
