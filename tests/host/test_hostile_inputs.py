"""Hostile documents through every decoder of user input: explicit YAML tags, aliases, huge and
out-of-range numbers, deep nesting, odd whitespace, surrogates and YAML 1.1 forms. Each is either a
value or an ``InvalidError`` naming where, never another exception; the property tests at the end
generate inputs large and deep enough to reach every limit."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatch import InvalidError, JobSpec, Plan, Policy, Rule
from dispatch.cli.config import parse_config
from dispatch.memory.settings import parse_settings as memory_settings
from dispatch.model import Action, PlanAction, load_json, load_yaml
from dispatch.model._decode import MAX_DEPTH, load_toml
from dispatch_kubeflow.settings import parse_settings as kubeflow_settings


def refused(fn: Callable[[], object]) -> InvalidError:
    with pytest.raises(InvalidError) as info:
        fn()
    assert str(info.value)
    return info.value


def spec_yaml(text: str) -> JobSpec:
    return JobSpec.loads(text, format="yaml")


# ---------------------------------------------------------------------- YAML tags


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("nodes: !!bool 9", "'9' is not a value of the tag !!bool"),
        ("nodes: !!int ''", "'' is not a value of the tag !!int"),
        ("nodes: !!int x", "'x' is not a value of the tag !!int"),
        ("nodes: !!float x", "!!float"),
        ("nodes: !!null 1", "!!null"),
        ("when: !!timestamp 1", "the YAML tag !!timestamp is not supported"),
        ("data: !!binary aGk=", "!!binary"),
        ("s: !!set {a}", "!!set"),
        ("o: !!omap [a: 1]", "!!omap"),
        ("x: !!python/object:os.system x", "!!python/object:os.system"),
        ("x: !local 1", "the YAML tag !local is not supported"),
        ("!!map [command, x]", "!!map cannot tag a sequence"),
        ("command: !!seq {a: 1}", "!!seq cannot tag a mapping"),
    ],
)
def test_a_yaml_tag_that_does_not_fit_is_invalid(text: str, words: str) -> None:
    err = refused(lambda: spec_yaml(text))
    assert words in str(err) and "line 1" in str(err)


def test_the_core_tags_read_as_json_types() -> None:
    assert load_yaml(
        "a: !!str 12\nb: !!int '12'\nc: !!float 1\nd: !!bool true\ne: !!map {}\nf: !!seq []\n"
    ) == {
        "a": "12",
        "b": 12,
        "c": 1.0,
        "d": True,
        "e": {},
        "f": [],
    }
    assert spec_yaml("command: [x, !!str 3]\nnodes: !!int 2\n").command == ("x", "3")


# ---------------------------------------------------------------------- aliases


def laughs(width: int, levels: int) -> str:
    lines = ["l0: &l0 [" + ", ".join(["lol"] * width) + "]"]
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\ncommand: [x]\n"


@pytest.mark.parametrize(
    "parse",
    [
        spec_yaml,
        lambda t: parse_config("adapter: memory\nsettings:\n  " + t.replace("\n", "\n  "), source="c.yaml"),
    ],
)
def test_aliases_that_expand_without_bound_are_refused_quickly(parse: Callable[[str], object]) -> None:
    # Refused by the expansion budget before expanding (10**9 values would not fit in memory, nor
    # finish); its speed is measured in benchmarks/fuzz_decoders.py (slow inputs are counted there).
    err = refused(lambda: parse(laughs(10, 9)))  # 10**9 values from a few hundred bytes
    assert "aliases expand the document" in str(err)


def test_a_few_aliases_are_fine_and_a_recursive_one_is_refused() -> None:
    assert load_yaml("a: &a [1, 2]\nb: *a\nc: *a\n") == {"a": [1, 2], "b": [1, 2], "c": [1, 2]}
    assert "names no complete anchor" in str(refused(lambda: load_yaml("a: &a [1, *a]\n")))
    assert "names no complete anchor" in str(refused(lambda: load_yaml("a: *nowhere\n")))


def test_aliases_cannot_nest_past_the_depth_limit() -> None:
    half = "[" * 60 + "]" * 60
    err = refused(
        lambda: load_yaml(
            f"a: &a {half}\nb: [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[*a]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]\n"
        )
    )
    assert "nested too deeply" in str(err)


def test_merge_keys_are_refused() -> None:
    assert "merge keys" in str(refused(lambda: load_yaml("base: &b {a: 1}\nx:\n  <<: *b\n")))
    assert load_yaml("x: '<<'\n") == {"x": "<<"}  # a quoted one is just a string


# ---------------------------------------------------------------------- numbers

HUGE = "9" * 5000


@pytest.mark.parametrize(
    ("decode", "text"),
    [
        (lambda t: JobSpec.loads(t), f'{{"command": ["x"], "nodes": {HUGE}}}'),
        (lambda t: JobSpec.loads(t), '{"command": ["x"], "nodes": 9223372036854775808}'),
        (spec_yaml, f"command: [x]\nnodes: {HUGE}\n"),
        (spec_yaml, "command: [x]\nnodes: 0x%s\n" % ("f" * 5000)),
        (spec_yaml, "command: [x]\nnodes: 0o%s\n" % ("7" * 5000)),
        (spec_yaml, "command: [x]\nnodes: 0x10000000000000000\n"),
        (lambda t: load_toml(t), f"x = {HUGE}\n"),
        (lambda t: load_toml(t), "x = 0x%s\n" % ("f" * 5000)),
        (lambda t: memory_settings(t.encode()), f'{{"nodes": {HUGE}}}'),
        (lambda t: kubeflow_settings(t.encode()), f'{{"outputTailLines": {HUGE}}}'),
        (lambda t: parse_config(t, source="c.toml"), f'adapter = "memory"\n[settings]\nnodes = {HUGE}\n'),
    ],
)
def test_an_integer_beyond_64_bits_is_invalid(decode: Callable[[str], object], text: str) -> None:
    err = refused(lambda: decode(text))
    assert "out of range" in str(err) or "not valid TOML" in str(err)


def test_a_yaml_hex_integer_in_range_survives_dumps_and_repr() -> None:
    s = spec_yaml("command: [x]\nnodes: 0x2\ntimeLimit: 0o17\n")
    assert (s.nodes, s.time_limit) == (2, 15)
    assert JobSpec.loads(s.dumps()) == s and "JobSpec" in repr(s)


@pytest.mark.parametrize("text", ["1e400", "-1e400"])
def test_a_number_that_overflows_to_infinity_is_invalid(text: str) -> None:
    assert "out of range" in str(refused(lambda: load_json(text)))
    assert "out of range" in str(refused(lambda: load_yaml(f"x: {text}")))


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        ({"rules": {"preempted": {"action": "requeue", "backoff": 1e300, "backoffCap": 1e308}}}, "backoff"),
        ({"rules": {"preempted": {"action": "requeue", "backoffCap": 1e308}}}, "backoffCap"),
        ({"default": {"action": "requeue", "backoff": 10**18, "backoffCap": 10**18}}, "backoff"),
    ],
)
def test_huge_backoffs_are_invalid(raw: dict[str, Any], path: str) -> None:
    err = refused(lambda: Policy.from_json(load_json(json.dumps(raw))))
    assert err.path is not None and err.path.endswith(path) and "a year" in str(err)


@pytest.mark.parametrize(
    "value", [10**400, 10**5000, 1e300, float("inf")], ids=["1e400", "1e5000", "1e300", "inf"]
)
def test_rule_and_plan_refuse_huge_numbers_from_python_too(value: Any) -> None:
    refused(lambda: Rule(Action.REQUEUE, backoff=1, backoff_cap=value))
    refused(lambda: Plan(PlanAction.WAIT, not_before=value))
    assert refused(lambda: Plan.from_json({"action": "wait", "notBefore": 1e300})).path == "plan.notBefore"


# ---------------------------------------------------------------------- depth


@pytest.mark.parametrize("depth", [101, 150, 494, 600, 5000])
def test_toml_nested_too_deeply_is_refused_like_json_and_yaml(depth: int) -> None:
    arrays = "x = " + "[" * depth + "]" * depth + "\n"
    tables = "x = " + "{a = " * depth + "1" + "}" * depth + "\n"
    dotted = "[" + ".".join(["t"] * depth) + "]\nx = 1\n"
    for text in (arrays, tables, dotted):
        assert "nested too deeply" in str(refused(lambda text=text: load_toml(text)))
    assert "nested too deeply" in str(refused(lambda: load_json("[" * depth + "]" * depth)))
    assert "nested too deeply" in str(refused(lambda: load_yaml("[" * depth + "]" * depth)))


def test_json_yaml_and_toml_agree_on_the_deepest_document() -> None:
    n = MAX_DEPTH - 1  # the root table plus n arrays
    assert load_toml("x = " + "[" * n + "]" * n) == load_json('{"x": ' + "[" * n + "]" * n + "}")
    assert load_yaml("x: " + "[" * n + "]" * n) == load_json('{"x": ' + "[" * n + "]" * n + "}")
    refused(lambda: load_toml("x = " + "[" * (n + 1) + "]" * (n + 1)))
    refused(lambda: load_json('{"x": ' + "[" * (n + 1) + "]" * (n + 1) + "}"))


# ---------------------------------------------------------------------- text


@pytest.mark.parametrize("space", ["\x0b", "\x0c", "\x1c", "\x85", "\xa0", "\u2028", "\ufeff"])
def test_strict_json_allows_only_json_whitespace(space: str) -> None:
    refused(lambda: load_json(f"{space}{{}}"))
    refused(lambda: load_json(f"{{}}{space}"))
    assert load_json(" \t\r\n{}\n") == {}


@pytest.mark.parametrize("escaped", ['"\\ud800"', '"\\udfff"', '"a\\udc00b"', '{"\\ud800": 1}'])
def test_an_unpaired_surrogate_is_invalid(escaped: str) -> None:
    assert "surrogate" in str(refused(lambda: load_json(escaped)))
    yaml_err = str(refused(lambda: load_yaml(escaped)))  # libyaml refuses the escape itself
    assert "surrogate" in yaml_err or "invalid Unicode character" in yaml_err


def test_a_surrogate_pair_survives_a_round_trip() -> None:
    for text, fmt in (('{"command": ["\\ud83d\\ude00"]}', "json"), ('{"command": ["\U0001f600"]}', "yaml")):
        s = JobSpec.loads(text, format=fmt)
        assert s.command == ("\U0001f600",)
        assert JobSpec.loads(s.dumps()) == s
        assert JobSpec.loads(s.dumps().encode("utf-8")) == s
    # YAML's escaped pair: libyaml refuses the escape, PyYAML's own parser gives the pair, joined.
    try:
        s = JobSpec.loads('{"command": ["\\ud83d\\ude00"]}', format="yaml")
    except InvalidError as exc:
        assert "Unicode" in str(exc)
    else:
        assert s.command == ("\U0001f600",) and JobSpec.loads(s.dumps()) == s


# ---------------------------------------------------------------------- YAML 1.1 forms


@pytest.mark.parametrize(
    "form", ["1:30", "190:20:30", "0b101", "1_000", "yes", "no", "on", "off", "2001-12-14"]
)
def test_yaml_1_1_forms_are_strings(form: str) -> None:
    """The YAML 1.2 core schema: these are strings, so a string field takes them as written and a
    number or boolean field refuses them, showing what was read."""
    assert load_yaml(f"x: {form}") == {"x": form}
    assert spec_yaml(f"command: [echo, {form}]").command == ("echo", form)
    err = refused(lambda: spec_yaml(f"command: [x]\nnodes: {form}\n"))
    assert err.path == "nodes" and f'a string ("{form}")' in str(err)


def test_nodes_1_30_is_not_90() -> None:
    err = refused(lambda: spec_yaml("command: [x]\nnodes: 1:30\n"))
    assert str(err) == 'nodes: expected an integer, got a string ("1:30")'


# ---------------------------------------------------------------------- properties

_SCALARS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from(
        [HUGE, "1" + "0" * 4400, "0x" + "f" * 5000, "1e400", ".inf", ".nan", "1:30", "0o17", "0x1f"]
    ),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["yes", "no", "~", "null", "true", "", "<<", "\\ud800", "\\ud83d\\ude00"]),
)
_TAGS = st.sampled_from(
    ["", "!!str ", "!!int ", "!!bool ", "!!float ", "!!null ", "!!timestamp ", "!x ", "!!binary "]
)
_KEYS = st.sampled_from(["command", "nodes", "procsPerNode", "env", "timeLimit", "extensions", "adapter",
                         "settings", "store", "policy", "rules", "default", "backoff", "backoffCap", "a"])  # fmt: skip


@st.composite
def _yaml_docs(draw: st.DrawFn) -> str:
    """YAML with tags, anchors and aliases, deep nesting and every awkward scalar."""

    def scalar() -> str:
        value = draw(_SCALARS)
        text = (
            value
            if isinstance(value, str)
            else json.dumps(value)
            if not isinstance(value, float)
            else repr(value)
        )
        if isinstance(value, str) and draw(st.booleans()):
            text = json.dumps(value)
        return draw(_TAGS) + text

    lines = []
    anchors: list[str] = []
    for i in range(draw(st.integers(1, 6))):
        kind = draw(st.integers(0, 4))
        key = draw(_KEYS)
        if kind == 0:
            lines.append(f"{key}: {scalar()}")
        elif kind == 1:
            n = draw(st.sampled_from([1, 5, 99, 100, 101, 400, 2000]))
            lines.append(f"{key}: " + "[" * n + scalar() + "]" * n)
        elif kind == 2:
            items = ", ".join(scalar() for _ in range(draw(st.integers(0, 4))))
            lines.append(f"{key}: &a{i} [{items}]")
            anchors.append(f"a{i}")
        elif kind == 3 and anchors:
            refs = ", ".join(f"*{draw(st.sampled_from(anchors))}" for _ in range(draw(st.integers(1, 12))))
            lines.append(f"{key}: &a{i} [{refs}]")
            anchors.append(f"a{i}")
        else:
            lines.append(f"{key}: {{{draw(_KEYS)}: {scalar()}}}")
    return "\n".join(lines) + "\n"


@st.composite
def _json_docs(draw: st.DrawFn) -> str:
    """JSON with huge numbers, deep nesting, surrogate escapes and odd whitespace."""
    parts = []
    for _ in range(draw(st.integers(1, 5))):
        key = draw(_KEYS)
        kind = draw(st.integers(0, 3))
        if kind == 0:
            value = draw(
                st.sampled_from([HUGE, "-" + HUGE, "1e400", "9223372036854775808", "2", '"x"', "true", "1.5"])
            )
        elif kind == 1:
            n = draw(st.sampled_from([1, 99, 100, 101, 3000]))
            value = "[" * n + "]" * n
        elif kind == 2:
            value = json.dumps(draw(st.text(max_size=10))).replace("\\\\", "\\") + ""
            value = draw(st.sampled_from(['"\\ud800"', '"\\ud83d\\ude00"', '"a"', value]))
        else:
            value = '["x"]'
        parts.append(f'"{key}": {value}')
    space = draw(st.sampled_from(["", " ", "\n", "\x0b", "\xa0", "\x0c"]))
    return space + "{" + ", ".join(parts) + "}" + draw(st.sampled_from(["", " ", "\x0b"]))


@st.composite
def _toml_docs(draw: st.DrawFn) -> str:
    lines = ['adapter = "memory"']
    for _ in range(draw(st.integers(0, 4))):
        n = draw(st.sampled_from([1, 99, 100, 101, 494, 1200]))
        kind = draw(st.integers(0, 3))
        if kind == 0:
            lines.append("[" + ".".join(["settings"] + ["t"] * n) + "]\nx = 1")
        elif kind == 1:
            lines.append("[settings]\nx = " + "[" * n + "]" * n)
        elif kind == 2:
            lines.append(
                "[settings]\ny = "
                + draw(st.sampled_from([HUGE, "inf", "nan", "1979-05-27", "0x" + "f" * 5000, "2"]))
            )
        else:
            lines.append("[settings]\nz = " + "{a = " * n + "1" + "}" * n)
    return "\n".join(lines) + "\n"


PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


def _only_invalid(fn: Callable[[], object]) -> None:
    try:
        fn()
    except InvalidError as exc:
        assert str(exc)


@PROPERTY
@given(_yaml_docs())
def test_any_yaml_is_a_spec_a_config_or_invalid(text: str) -> None:
    _only_invalid(lambda: JobSpec.loads(text, format="yaml").dumps())
    _only_invalid(lambda: parse_config("adapter: memory\n" + text, source="c.yaml"))
    _only_invalid(lambda: Policy.from_json(load_yaml(text)))


@PROPERTY
@given(_json_docs())
def test_any_json_is_a_spec_settings_or_invalid(text: str) -> None:
    _only_invalid(lambda: JobSpec.loads(text).dumps())
    _only_invalid(lambda: memory_settings(text.encode("utf-8", "surrogatepass")))
    _only_invalid(lambda: kubeflow_settings(text.encode("utf-8", "surrogatepass")))
    _only_invalid(lambda: parse_config(text, source="c.json"))


@PROPERTY
@given(_toml_docs())
def test_any_toml_is_a_config_or_invalid(text: str) -> None:
    _only_invalid(lambda: parse_config(text, source="c.toml"))


@pytest.mark.parametrize("field", ["nodes", "procs_per_node", "time_limit"])
def test_a_count_beyond_64_bits_is_refused_from_python_too(field: str) -> None:
    """It could never come from a document, and a 5,000-digit int cannot even be printed (repr)."""
    for value in (2**63, 10**5000):
        err = refused(lambda value=value: JobSpec(command=["x"], **{field: value}))
        assert "out of range" in str(err)
