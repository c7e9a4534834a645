"""The options every command takes (``--config``, ``-o``, ``--quiet``, ...): :class:`Options`, which opens
the configured cluster (or fleet of clusters), and the click parameters that declare them once."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import click
from msgspec import Struct

from dispatch.cli import devcluster
from dispatch.cli.config import ClusterFile, check_settings, open_cluster, read_token
from dispatch.cli.embedded import OfflineBackend
from dispatch.cli.fleetconfig import FleetConfig, open_configured_fleet
from dispatch.cli.fleetconfig import load as load_config
from dispatch.cli.render import Renderer, probe_progress
from dispatch.cluster import Cluster
from dispatch.errors import InvalidError, ReadOnlyError, UnavailableError, UnsupportedError
from dispatch.logs import structured as structured_logs
from dispatch.registry import describe as describe_adapter

if TYPE_CHECKING:
    from dispatch.fleet import Fleet

__all__ = [
    "COMMON",
    "OUTPUTS",
    "Options",
    "common_options",
    "options_from",
    "parse_duration",
    "settings_refused",
]

F = TypeVar("F", bound=Callable[..., Any])


OUTPUTS = ("text", "json", "yaml", "wide", "name")
"""``-o``: people's text (tables), JSON, YAML, a table with more columns, or only the job ids."""


class Options(Struct):
    """The options every command takes."""

    config: str | None
    token_file: str | None
    output: str = "text"
    no_headers: bool = False
    quiet: bool = False
    epoch_times: bool = False
    clusters: tuple[str, ...] = ()
    namespace: str | None = None
    context: str | None = None
    _cf: ClusterFile | FleetConfig | None = None

    @property
    def as_json(self) -> bool:
        return self.output == "json"

    @property
    def out(self) -> Renderer:
        return Renderer(output=self.output, no_headers=self.no_headers, epoch_times=self.epoch_times)

    def cluster_file(self) -> ClusterFile | FleetConfig:
        """The configured cluster (a profile of a file naming several, with ``--cluster``), or fleet."""
        if self._cf is None:
            if len(self.clusters) > 1 and not self._names_fleet():
                raise InvalidError(
                    f"{','.join(self.clusters)}: a config names one cluster, or profiles of which a "
                    "command uses one; several clusters at once are a fleet's (`placement:`, docs/fleet.md)",
                    path="--cluster",
                )
            cf = load_config(self.config, cluster=self.clusters[0] if self.clusters else None)
            if isinstance(cf, FleetConfig):
                for name in self.clusters:
                    cf.member(name)  # a name the fleet does not have is refused, naming those it has
                for flag, given in (("-n/--namespace", self.namespace), ("--context", self.context)):
                    if given is not None:
                        raise InvalidError(
                            f"{flag}: each cluster of the fleet {cf.source} has its own settings; set it there",
                            path=flag.split("/")[-1],
                        )
                self._cf = cf
            else:
                self._cf = with_overrides(cf, {"namespace": self.namespace, "context": self.context})
        return self._cf

    def _names_fleet(self) -> bool:
        """Whether the config is a fleet (read without deciding anything else)."""
        return isinstance(load_config(self.config), FleetConfig)

    @property
    def fleet_clusters(self) -> tuple[str, ...]:
        """In a fleet, the clusters ``--cluster`` names (what ``run``/``submit`` may place a job on,
        ``list``/``clusters``/``supervise`` look at); empty: all of them, or not a fleet."""
        return self.clusters if isinstance(self.cluster_file(), FleetConfig) else ()

    async def open(
        self, *, read_only: bool = False, refresh: bool = False, start_dev: bool = True
    ) -> Cluster | Fleet:
        """Open the configured cluster, or fleet; ``read_only`` forces read-only mode (no probe, no
        write).

        With no config (the embedded default) a write command starts the dev cluster when it is not
        running, and says so; a read command does not, and sees the records as last known. Without
        ``start_dev`` (a daemon reconnecting: the user may have stopped it on purpose) that is an
        ``UnavailableError``."""
        cf = self.cluster_file()
        token = read_token(self.token_file)  # a bad token file is reported before anything starts
        if isinstance(cf, FleetConfig):
            with self.opening(cf):
                return await open_configured_fleet(cf, token=token, read_only=read_only, refresh=refresh)
        if read_only:
            cf = cf.replace(read_only=True)
        if cf.embedded:
            dev = devcluster.running()
            if dev is None and read_only:
                return self.offline()
            if dev is None and not start_dev:
                raise UnavailableError(
                    "the dev cluster is not running (`dispatch dev-cluster start` starts it)"
                )
            if dev is None:
                dev, started = devcluster.start()
                if started:
                    self.say(
                        f"started the dev cluster (kubesim, pid {dev.pid}) in the background at {dev.url}; "
                        "it keeps your jobs between commands. `dispatch dev-cluster stop` stops it."
                    )
        if read_only and not refresh:  # no probe to show: the adapter opens when a call needs it
            return await open_cluster(cf, token=token, lazy=True)
        with self.opening(cf), settings_refused(cf):
            return await open_cluster(cf, token=token, refresh=refresh)

    def again(self, *words: str) -> str:
        """A command line for a hint a person pastes: ``dispatch``, the options that chose this cluster
        (``--config``, ``--cluster``, ``-n``, ``--context``, ``--token-file``), then ``words``."""
        import shlex

        # In a fleet --cluster names where new jobs go, not what a command on a job opens: left out.
        profile = None if isinstance(self._cf, FleetConfig) or not self.clusters else self.clusters[0]
        chosen = (
            ("--config", self.config),
            ("--cluster", profile),
            ("-n", self.namespace),
            ("--context", self.context),
            ("--token-file", self.token_file),
        )
        return " ".join(["dispatch", *(f"{flag} {shlex.quote(v)}" for flag, v in chosen if v), *words])

    def offline(self) -> Cluster:
        """The records of the embedded default with no dev cluster running (or of any config, for a
        shell's completion): shown as last known."""
        cf = self.cluster_file()
        adapter = cf.adapter if isinstance(cf, ClusterFile) else "fleet"
        return Cluster(OfflineBackend(adapter), cf.store.open(), policy=cf.policy)

    def say(self, text: str) -> None:
        """A note for people, on stderr (stdout stays the command's result); a log line with JSON logs;
        none with ``--quiet``."""
        if self.quiet:
            return
        if structured_logs():
            logging.getLogger("dispatch.cli").info("%s", text)
        else:
            click.echo(text, err=True)

    def opening(self, cf: ClusterFile | FleetConfig) -> AbstractContextManager[Any]:
        """Nothing waits silently: while the adapter opens, what it waits for (its probe) is shown — a
        spinner on a terminal, lines on stderr otherwise (never with ``--json`` or ``--quiet``)."""
        if isinstance(cf, FleetConfig):
            where = f"the fleet {', '.join(cf.names)} ({cf.source})"
        else:
            where = "the dev cluster" if cf.embedded else f"the {cf.adapter} cluster ({cf.source})"
        # With JSON logs the probe's lines are already log lines: no plain copy on stderr.
        quiet = self.output != "text" or self.quiet or structured_logs()
        return probe_progress(self.out, f"opening {where}", quiet)


def with_overrides(cf: ClusterFile, given: Mapping[str, str | None]) -> ClusterFile:
    """``-n/--namespace`` and ``--context`` (kubectl's): settings of the adapter, for an adapter that has
    them (Kubernetes ones); refused, naming the adapter, for one that has not."""
    changes = {k: v for k, v in given.items() if v is not None}
    if not changes:
        return cf
    known = describe_adapter(cf.adapter).settings_schema().get("properties", {})
    for key in changes:
        if key not in known:
            flag = "-n/--namespace" if key == "namespace" else f"--{key}"
            raise InvalidError(
                f"{flag}: the {cf.adapter} adapter ({cf.source}) has no {key} setting", path=f"--{key}"
            )
    cf = cf.replace(settings={**cf.settings, **changes})
    check_settings(cf)
    return cf


COMMON = (
    "config",
    "token_file",
    "as_json",
    "output",
    "no_headers",
    "quiet",
    "epoch_times",
    "cluster",
    "namespace",
    "context",
)
"""The common options' parameter names (see :func:`common_options`)."""


def options_from(given: Mapping[str, Any], outer: Options | None = None) -> Options:
    """The common options given (to the group or a command); those of the group (``dispatch --json
    list``) are the defaults of a command's."""
    v = dict(given)
    if outer is not None:
        for key in ("config", "token_file", "namespace", "context"):
            v[key] = v[key] or getattr(outer, key)
        v["cluster"] = _names(v["cluster"]) or outer.clusters
        for key in ("no_headers", "quiet", "epoch_times"):
            v[key] = v[key] or getattr(outer, key)
        v["output"] = v["output"] or (None if outer.output == "text" else outer.output)
    return Options(
        v["config"],
        v["token_file"],
        _output(v["as_json"], v["output"]),
        v["no_headers"],
        v["quiet"],
        v["epoch_times"],
        _names(v["cluster"]),
        v["namespace"],
        v["context"],
    )


def _names(given: tuple[str, ...] | str | None) -> tuple[str, ...]:
    """``--cluster`` as given, repeated and comma-separated (``--cluster a,b --cluster c``): the names."""
    if not given:
        return ()
    items = [given] if isinstance(given, str) else list(given)
    names = tuple(dict.fromkeys(n.strip() for item in items for n in item.split(",")))
    if "" in names:  # read with the options, before a command's body: click's usage error (exit 2)
        raise click.UsageError(f"--cluster {','.join(items)!r}: expected cluster names, comma-separated")
    return names


def _output(as_json: bool, output: str | None) -> str:
    if as_json and output not in (None, "json"):
        raise click.UsageError(f"--json is -o json; it contradicts -o {output}")
    return "json" if as_json else output or "text"


_COMMON_PARAMS: list[click.Parameter] = [
    click.Option(
        ["--config", "config"],
        metavar="PATH",
        help="Cluster config file (YAML). Default: $DISPATCH_CONFIG, else the embedded default.",
    ),
    click.Option(
        ["--token-file"], metavar="PATH", help="File holding the bearer token (else $DISPATCH_TOKEN)."
    ),
    click.Option(["--json", "as_json"], is_flag=True, help="Machine-readable JSON output (-o json)."),
    click.Option(
        ["-o", "--output"],
        type=click.Choice(OUTPUTS),
        default=None,
        help="Output format: text (default), json, yaml, wide (more columns), name (job ids only).",
    ),
    click.Option(["--no-headers"], is_flag=True, help="Tables without their header line."),
    click.Option(["--quiet", "-q"], is_flag=True, help="No notes or progress on stderr; only results."),
    click.Option(
        ["--epoch-times"], is_flag=True, help="Times in JSON/YAML as epoch seconds, not RFC 3339 text."
    ),
    click.Option(
        ["--cluster"],
        metavar="NAME",
        multiple=True,
        help="Profiles (`clusters:`): the one to use (default: its `default`). A fleet (`placement:`): "
        "the clusters a new job may go to, and those list/clusters/supervise look at (repeatable, or a,b).",
    ),
    click.Option(["-n", "--namespace"], metavar="NS", help="Kubernetes: the namespace (settings.namespace)."),
    click.Option(
        ["--context"], metavar="NAME", help="Kubernetes: the kubeconfig context (settings.context)."
    ),
]
"""The common options, built once: every command shares these objects (click only reads them), where
a decorator per command built 230 of them at every start."""


def common_options(fn: F) -> F:
    """Add the common options to a command's function (as ``@click.option`` does, in the same order)."""
    for param in reversed(_COMMON_PARAMS):
        if isinstance(fn, click.Command):
            fn.params.append(param)
        else:
            fn.__dict__.setdefault("__click_params__", []).append(param)
    return fn


@contextmanager
def settings_refused(cf: ClusterFile) -> Iterator[None]:
    """A cluster's refusal of the config's settings (``settings.queue: ... does not exist; LocalQueues
    that exist: ...``) names the config file, as the file's own errors do."""
    try:
        yield
    except ReadOnlyError:
        raise
    except UnsupportedError as exc:
        if cf.embedded or not any(r.startswith("settings.") for r in exc.reasons):
            raise
        raise UnsupportedError(
            [f"{cf.source}: {r}" if r.startswith("settings.") else r for r in exc.reasons]
        ) from None


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str, option: str) -> float:
    """kubectl's durations (Go's): numbers with units, ``30s``, ``5m``, ``1h30m``, ``500ms``."""
    import re

    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise InvalidError(f"{text!r}: expected a duration such as 30s, 5m or 1h30m", path=option)
    seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise InvalidError(f"{text!r}: expected a duration above zero", path=option)
    return seconds
