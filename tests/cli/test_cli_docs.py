"""docs/cli.md is checked against the code: every command and every option the CLI has is documented."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from dispatch.cli.commands import cli

DOC = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
COMMON = {
    "--config",
    "--token-file",
    "--json",
    "--output",
    "--no-headers",
    "--quiet",
    "--epoch-times",
    "--cluster",
    "--namespace",
    "--context",
    "--help",
    "-h",
}


def _commands(group: click.Group, prefix: str = "") -> list[tuple[str, click.Command]]:
    out: list[tuple[str, click.Command]] = []
    for name, cmd in sorted(group.commands.items()):
        full = f"{prefix}{name}"
        out.append((full, cmd))
        if isinstance(cmd, click.Group):
            out += _commands(cmd, f"{full} ")
    return out


@pytest.mark.parametrize(("name", "cmd"), _commands(cli), ids=lambda v: v if isinstance(v, str) else "")
def test_every_command_and_option_is_documented(name: str, cmd: click.Command) -> None:
    assert f"`{name.split()[-1]}" in DOC, f"docs/cli.md does not document `{name}`"
    for param in cmd.params:
        if isinstance(param, click.Option):
            for opt in param.opts:
                if opt.startswith("--") and opt not in COMMON:
                    assert opt in DOC, f"docs/cli.md does not document {name} {opt}"
