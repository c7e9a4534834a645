"""Fuzz every decoder of user input: nothing but ``InvalidError`` may come out, and what decodes must
survive its own JSON form.

    .venv/bin/python benchmarks/fuzz_decoders.py                    # 10**6 inputs per decoder, 2 processes
    .venv/bin/python benchmarks/fuzz_decoders.py -n 20000 -j 1      # a quick look

Decoders: job spec (JSON, YAML), cluster config (YAML, TOML, JSON), recovery policy (YAML), memory
adapter settings, kubeflow adapter settings. Inputs come from a seeded generator in pure Python: valid
seed documents, documents generated from a small grammar of JSON values (deep nesting, huge and
hex/octal/YAML 1.1 numbers, surrogates, odd whitespace), YAML-only constructs (tags, anchors and
aliases, billion-laughs shapes, merge keys, documents), TOML-only ones (dotted keys, arrays of tables,
deep inline tables, dates), and byte-level mutations and splices of all of these.

For every input the decoder either returns or raises ``InvalidError``; for a job spec that decodes,
``repr``, ``dumps`` and ``JobSpec.loads(dumps())`` must work and give the same spec; any other
exception is an *escape*, counted by type with the shortest input that caused it. Inputs that take
longer than ``--slow`` seconds are counted too (an unbounded expansion shows up there first).
Prints one line per decoder (``busy s``: seconds its inputs kept a worker busy) and a total; exits 1
when anything escaped.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import sys
import time
from collections.abc import Callable
from typing import Any

TARGETS = [
    "spec-json",
    "spec-yaml",
    "config-yaml",
    "config-toml",
    "config-json",
    "policy-yaml",
    "memory-settings",
    "kubeflow-settings",
]

# ---------------------------------------------------------------------- decoders under test


def decoder(name: str) -> Callable[[bytes | str], object]:
    from dispatch.cli.config import parse_config
    from dispatch.memory.settings import parse_settings as memory_settings
    from dispatch.model import JobSpec, Policy, load_yaml
    from dispatch_kubeflow.settings import parse_settings as kubeflow_settings

    def spec(fmt: str) -> Callable[[bytes | str], object]:
        def run(data: bytes | str) -> object:
            s = JobSpec.loads(data, format=fmt)
            repr(s)
            again = JobSpec.loads(s.dumps())
            if again != s or again.dumps() != s.dumps():
                raise AssertionError("the spec does not survive its JSON form")
            return s

        return run

    table: dict[str, Callable[[bytes | str], object]] = {
        "spec-json": spec("json"),
        "spec-yaml": spec("yaml"),
        "config-yaml": lambda d: parse_config(d, source="c.yaml"),
        "config-toml": lambda d: parse_config(d, source="c.toml"),
        "config-json": lambda d: parse_config(d, source="c.json"),
        "policy-yaml": lambda d: Policy.from_json(load_yaml(d, what="policy")),
        "memory-settings": memory_settings,
        "kubeflow-settings": kubeflow_settings,
    }
    return table[name]


# ---------------------------------------------------------------------- seeds

SEEDS: dict[str, list[str]] = {
    "spec": [
        '{"command": ["python", "-m", "train"], "nodes": 2, "env": {"A": "b"}}',
        '{"command": ["x"], "procsPerNode": 8, "timeLimit": 3600, "extensions": '
        '{"dispatch/Image": {"ref": "img:1"}, "acme/Thing": {"a": [1, 2.5, true, "s"]}}}',
        "command: [python, -m, train]\nnodes: 2\nenv:\n  KUBESIM_SCRIPT: 'sleep 1; exit 0'\n"
        "extensions:\n  dispatch/Image: {ref: 'pytorch:2'}\n",
        "command:\n- sh\n- -c\n- echo hi\ntimeLimit: 60\n",
    ],
    "config": [
        "adapter: memory\nsettings: {nodes: 4, startDelay: 0.5}\nstore: {memory: {}}\n"
        "policy: {rules: {preempted: {action: requeue, max: 3, backoff: 1}}, default: fail}\nreadOnly: false\n",
        '{"adapter": "kubeflow", "settings": {"namespace": "default"}, "store": {"sqlite": "jobs.db"}}',
        'adapter = "memory"\nreadOnly = true\n[settings]\nnodes = 4\n[store.memory]\n'
        '[policy.rules.preempted]\naction = "requeue"\nbackoff = 2.5\n',
    ],
    "policy": [
        "rules: {preempted: {action: requeue, max: 5, backoff: 30, backoffCap: 600}, out_of_memory: fail}\n"
        "default: hold\n",
        '{"rules": {"node_lost": "requeue"}, "default": {"action": "fail"}}',
    ],
    "memory": [
        '{"nodes": 4, "startDelay": 1, "cessationDelay": 2, "imagePullGrace": 10, '
        '"defaultScript": "sleep 5; exit 0", "watchHistory": 100, "cluster": "c1"}',
        '{"defaultScript": "print hi {rank}; slow-stop 3; oom-at 2"}',
    ],
    "kubeflow": [
        '{"namespace": "team-a", "probeRuntime": {"kind": "ClusterTrainingRuntime", "name": "torch"}, '
        '"queue": "q", "labels": {"a.b/c": "d"}, "tolerations": [{"key": "a", "effect": "NoExecute", '
        '"tolerationSeconds": 30}], "outputTailLines": 50}',
        '{"checkpointVolume": {"claimName": "c", "mountPath": "/ckpt"}, "nodeSelector": {"k": "v"}}',
    ],
}

TREES: dict[str, list[Any]] = {
    "spec": [
        {
            "command": ["python", "-m", "train"],
            "nodes": 2,
            "procsPerNode": 8,
            "timeLimit": 3600,
            "env": {"A": "b", "KUBESIM_SCRIPT": "sleep 1; exit 0"},
            "extensions": {"dispatch/Image": {"ref": "img:1"}, "acme/Thing": {"a": [1, 2.5, True, "s"]}},
        },
    ],
    "config": [
        {
            "adapter": "memory",
            "settings": {"nodes": 4, "startDelay": 0.5, "defaultScript": "sleep 1"},
            "store": {"memory": {}},
            "readOnly": False,
            "policy": {
                "rules": {
                    "preempted": {"action": "requeue", "max": 3, "backoff": 1, "backoffCap": 60},
                    "out_of_memory": "fail",
                },
                "default": "hold",
            },
        },
        {"adapter": "kubeflow", "settings": {"namespace": "default"}, "store": {"sqlite": "jobs.db"}},
    ],
    "policy": [
        {
            "rules": {
                "preempted": {"action": "requeue", "max": 5, "backoff": 30, "backoffCap": 600},
                "node_lost": "requeue",
                "out_of_memory": "fail",
            },
            "default": {"action": "hold"},
        },
    ],
    "memory": [
        {
            "nodes": 4,
            "startDelay": 1,
            "cessationDelay": 2,
            "imagePullGrace": 10,
            "defaultScript": "print hi {rank}; sleep 5; slow-stop 3; exit 0",
            "watchHistory": 100,
            "cluster": "c1",
        },
    ],
    "kubeflow": [
        {
            "namespace": "team-a",
            "probeRuntime": {"kind": "ClusterTrainingRuntime", "name": "torch"},
            "probeWindow": 30,
            "queue": "q",
            "priorityClass": "high",
            "labels": {"a.b/c": "d"},
            "annotations": {"x": "y"},
            "nodeSelector": {"k": "v"},
            "serviceAccountName": "sa",
            "tolerations": [
                {
                    "key": "a",
                    "operator": "Equal",
                    "value": "v",
                    "effect": "NoExecute",
                    "tolerationSeconds": 30,
                }
            ],
            "checkpointVolume": {"claimName": "c", "mountPath": "/ckpt"},
            "outputTailLines": 50,
        },
    ],
}


def _leaf_mutant(tree: Any, rng: random.Random, keys: list[str]) -> Any:
    """A copy of ``tree`` with one value replaced (or one key added or dropped): mostly valid
    documents, so that the checks after decoding are reached too."""
    tree = json.loads(json.dumps(tree))
    node: Any = tree
    for _ in range(rng.randrange(4)):
        inner = [v for v in (node.values() if isinstance(node, dict) else node) if isinstance(v, dict | list)]
        if not inner:
            break
        node = rng.choice(inner)
    op = rng.random()
    if isinstance(node, dict) and node:
        key = rng.choice(list(node))
        if op < 0.75:
            node[key] = _value(rng, keys, 5)
        elif op < 0.9:
            node[rng.choice(keys + STRINGS)] = _value(rng, keys, 5)
        else:
            del node[key]
    elif isinstance(node, list) and node:
        node[rng.randrange(len(node))] = _value(rng, keys, 5)
    return tree


KEYS = {
    "spec": ["command", "nodes", "procsPerNode", "env", "timeLimit", "extensions", "dispatch/Image", "ref"],
    "config": ["adapter", "settings", "store", "policy", "readOnly", "sqlite", "memory", "rules", "default"],
    "policy": ["rules", "default", "action", "max", "backoff", "backoffCap", "preempted", "requeue"],
    "memory": ["nodes", "startDelay", "cessationDelay", "imagePullGrace", "defaultScript", "watchHistory"],
    "kubeflow": ["namespace", "probeRuntime", "queue", "labels", "tolerations", "outputTailLines", "kind"],
}

NUMBERS = [
    "0",
    "-0",
    "1",
    "-1",
    "2",
    "1e400",
    "-1e400",
    "1e308",
    "4.9e-324",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "1" + "0" * 4400,
    "9" * 5000,
    "0x" + "f" * 5000,
    "0xffffffffffffffffff",
    "0o777",
    "0777",
    "0b101",
    "1_000",
    "1:30",
    "190:20:30",
    ".inf",
    "-.inf",
    ".nan",
    "NaN",
    "Infinity",
    "+12",
    "1.",
    ".5",
    "1e5",
    "12e",
    "0x",
    "1" + "0" * 300 + ".5",
]
STRINGS = [
    "",
    "x",
    "yes",
    "no",
    "on",
    "off",
    "y",
    "~",
    "null",
    "true",
    "2001-12-14",
    "2001-12-14t21:59:43.10-05:00",
    "\\ud800",
    "\\udfff",
    "\\ud83d\\ude00",
    "\\u0000",
    "é",
    "\U0001f600",
    "a b",
    "<<",
    "!",
    "&a",
    "*a",
    "%",
]
WHITESPACE = [" ", "\t", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x85", "\xa0", "\u2028", "\ufeff", "\x00"]
YAML_BITS = [
    "!!bool 9",
    "!!int ''",
    "!!timestamp 1",
    "!!map [1]",
    "!!seq {a: 1}",
    "!!int x",
    "!!float x",
    "!!null 1",
    "!!str 1",
    "!!binary aGk=",
    "!!set {a}",
    "!!omap [a: 1]",
    "!!python/object:os.system x",
    "!foo 1",
    "! 1",
    "&a [1, 2]",
    "*a",
    "*b",
    "&a [*a]",
    "{<<: *a}",
    "<<: {a: 1}",
    "? [a]\n: 1",
    "--- 1\n--- 2",
    "...",
    "%YAML 1.1\n---",
    "%TAG !e! tag:e,2000:\n---",
    "|\n  x",
    ">-\n  y",
    "'q''t'",
    '"\\x41\\u00e9"',
    "{",
    "[",
]
TOML_BITS = [
    "a.b.c = 1",
    "[[t]]\nx = 1",
    "[t]\n[t]",
    "d = 1979-05-27T07:32:00Z",
    "t = 07:32:00",
    "inf = inf",
    "n = nan",
    "x = 0x" + "f" * 5000,
    "y = " + "9" * 5000,
    "s = '''multi'''",
    'u = "\\U0001F600"',
    "k = {}",
    "z = 1_000",
    "o = 0o777",
    "b = 0b101",
]


def _number(rng: random.Random) -> str:
    return rng.choice(NUMBERS) if rng.random() < 0.7 else str(rng.randint(-(2**70), 2**70))


def _value(rng: random.Random, keys: list[str], depth: int) -> Any:
    """A random JSON-ish value (a tree), occasionally very deep."""
    r = rng.random()
    if depth > 6 or r < 0.35:
        kind = rng.randrange(6)
        if kind == 0:
            return ("num", _number(rng))
        if kind == 1:
            return ("str", rng.choice(STRINGS + keys))
        if kind == 2:
            return rng.choice([True, False])
        if kind == 3:
            return ("raw", rng.choice(STRINGS + NUMBERS))
        if kind == 4:
            return rng.randint(-5, 100)
        return None
    if r < 0.42:  # deep nesting, beyond every limit sometimes
        n = rng.choice([50, 99, 100, 101, 150, 300, 500, 1000, 3000])
        return ("deep", n, rng.random() < 0.5)
    if r < 0.7:
        return [_value(rng, keys, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(keys + STRINGS): _value(rng, keys, depth + 1) for _ in range(rng.randrange(5))}


def _json(v: Any, rng: random.Random) -> str:
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float | str):
        return json.dumps(v)
    if isinstance(v, tuple):
        if v[0] == "num":
            return v[1]
        if v[0] == "str":
            return '"' + v[1].replace('"', "") + '"'
        if v[0] == "raw":
            return v[1]
        n, lists = v[1], v[2]
        return ("[" * n + "]" * n) if lists else ('{"a":' * n + "1" + "}" * n)
    if isinstance(v, list):
        return "[" + ", ".join(_json(x, rng) for x in v) + "]"
    return "{" + ", ".join(f'"{k}": {_json(x, rng)}' for k, x in v.items()) + "}"


def _yaml(v: Any, rng: random.Random, indent: str = "") -> str:
    if isinstance(v, dict) and v and rng.random() < 0.6:  # block style
        lines = []
        for k, x in v.items():
            inner = _yaml(x, rng, indent + "  ")
            sep = "\n" + indent + "  " if isinstance(x, dict) and x and inner.startswith(" ") else " "
            lines.append(f"{indent}{k}:{sep}{inner.strip() if sep == ' ' else inner.lstrip()}")
        return "\n".join(lines)
    if isinstance(v, tuple) and v[0] == "deep":
        n, lists = v[1], v[2]
        return ("[" * n + "]" * n) if lists else ("{a: " * n + "1" + "}" * n)
    if isinstance(v, tuple) and v[0] == "str" and rng.random() < 0.5:
        return v[1] if v[1] else "''"
    if isinstance(v, tuple) and v[0] == "raw" and rng.random() < 0.3:
        return rng.choice(YAML_BITS)
    return _json(v, rng)


def _toml_scalar(v: Any, rng: random.Random) -> str:
    if isinstance(v, tuple) and v[0] == "deep":
        n = v[1]
        return ("[" * n + "]" * n) if v[2] else ("{a = " * n + "1" + " }" * n)
    if isinstance(v, dict):
        return "{" + ", ".join(f'"{k}" = {_toml_scalar(x, rng)}' for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_toml_scalar(x, rng) for x in v) + "]"
    if v is None:
        return rng.choice(TOML_BITS)
    return _json(v, rng)


def _toml(v: Any, rng: random.Random) -> str:
    if not isinstance(v, dict):
        return "x = " + _toml_scalar(v, rng)
    out = []
    for k, x in v.items():
        if rng.random() < 0.2:
            out.append(f"[{'.'.join(['t'] * rng.choice([1, 5, 150, 600]))}]")
        out.append(f'"{k}" = {_toml_scalar(x, rng)}')
    if rng.random() < 0.3:
        out.append(rng.choice(TOML_BITS))
    return "\n".join(out)


def _billion_laughs(rng: random.Random) -> str:
    width, levels = rng.choice([(9, 9), (10, 6), (4, 20), (2, 40)])
    lines = ['a: &a ["lol"]']
    for i in range(1, levels):
        prev, cur = f"a{i - 1}" if i > 1 else "a", f"a{i}"
        lines.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * width) + "]")
    return "\n".join(lines) + "\n"


def _mutate(data: bytes, rng: random.Random, pool: list[bytes]) -> bytes:
    b = bytearray(data)
    for _ in range(rng.choice([1, 1, 2, 3, 8])):
        op = rng.randrange(7)
        pos = rng.randrange(len(b) + 1)
        if op == 0 and b:
            b[min(pos, len(b) - 1)] = rng.randrange(256)
        elif op == 1:
            b[pos:pos] = rng.choice(pool)
        elif op == 2 and b:
            del b[pos : pos + rng.randrange(1, 8)]
        elif op == 3:
            b[pos:pos] = rng.choice(WHITESPACE).encode("utf-8", "surrogatepass")
        elif op == 4:
            other = rng.choice(pool)
            cut = rng.randrange(len(other) + 1)
            b = b[:pos] + bytearray(other[cut:])
        elif op == 5:
            b[pos:pos] = rng.choice(["\ud800", "\udfff", "\ud83d\ude00"]).encode("utf-8", "surrogatepass")
        else:
            b[pos:pos] = _number(rng).encode()
    return bytes(b)


def _family(target: str) -> str:
    return {"spec": "spec", "conf": "config", "poli": "policy", "memo": "memory", "kube": "kubeflow"}[
        target[:4]
    ]


def generate(target: str, rng: random.Random, pool: list[bytes]) -> bytes:
    fam = _family(target)
    keys = KEYS[fam]
    fmt = "json" if target.endswith(("json", "settings")) else ("toml" if target.endswith("toml") else "yaml")
    r = rng.random()
    if r < 0.6 or not pool:
        if r < 0.4:
            tree = _leaf_mutant(rng.choice(TREES[fam]), rng, keys)
        else:
            tree = {rng.choice(keys): _value(rng, keys, 1) for _ in range(rng.randrange(1, 5))}
        if rng.random() < 0.05:
            tree = _value(rng, keys, 0)
        if fmt == "json":
            text = _json(tree, rng)
        elif fmt == "toml":
            text = _toml(tree, rng)
        else:
            text = _yaml(tree, rng)
            if rng.random() < 0.05:
                text = _billion_laughs(rng) + text
        data = text.encode("utf-8", "surrogatepass")
        if len(data) < 2000:
            pool.append(data)
            if len(pool) > 400:
                del pool[rng.randrange(len(pool))]
        return data
    return _mutate(rng.choice(pool), rng, pool)


# ---------------------------------------------------------------------- running


class Hang(Exception):
    """An input that took longer than ``--timeout`` (an escape too: the CLI would hang on it)."""


def _alarm(signum: int, frame: object) -> None:
    raise Hang()


def run(target: str, count: int, seed: int, slow: float, timeout: float = 10.0) -> dict[str, Any]:
    import signal

    from dispatch.errors import InvalidError

    signal.signal(signal.SIGALRM, _alarm)

    decode = decoder(target)
    rng = random.Random(seed)
    fam = _family(target)
    pool = [s.encode() for s in SEEDS[fam]]
    pool += [b.encode("utf-8", "surrogatepass") for b in YAML_BITS + TOML_BITS]
    escapes: dict[str, tuple[int, bytes]] = {}
    ok = invalid = slow_count = 0
    slowest = 0.0
    started = time.perf_counter()
    for _ in range(count):
        data = generate(target, rng, pool)
        # One input in four arrives as text, as from Python callers: bytes that are not UTF-8 become
        # lone surrogates ("\udcff"), which no encoder will take back.
        given: bytes | str = data.decode("utf-8", "surrogateescape") if rng.random() < 0.25 else data
        t0 = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            decode(given)
            ok += 1
        except Hang:
            key = f"Hang: more than {timeout:g}s"
            n, sample = escapes.get(key, (0, data))
            escapes[key] = (n + 1, sample if len(sample) <= len(data) else data)
        except InvalidError as exc:
            if not str(exc):
                escapes.setdefault("InvalidError without a message", (0, data))
            invalid += 1
        except Exception as exc:
            key = f"{type(exc).__name__}: {str(exc)[:80]}"
            n, sample = escapes.get(key, (0, data))
            escapes[key] = (n + 1, sample if len(sample) <= len(data) else data)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        took = time.perf_counter() - t0
        slowest = max(slowest, took)
        if took > slow:
            slow_count += 1
    return {
        "target": target,
        "inputs": count,
        "decoded": ok,
        "invalid": invalid,
        "escapes": {k: (n, v[:300].decode("utf-8", "backslashreplace")) for k, (n, v) in escapes.items()},
        "slow": slow_count,
        "slowest": slowest,
        "seconds": time.perf_counter() - started,
    }


def _work(args: tuple[str, int, int, float, float]) -> dict[str, Any]:
    return run(*args)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--count", type=int, default=1_000_000, help="inputs per decoder (default 10**6)")
    p.add_argument("-j", "--jobs", type=int, default=2, help="processes (default 2)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--slow", type=float, default=1.0, help="seconds above which an input counts as slow")
    p.add_argument("--chunk", type=int, default=50_000, help="inputs per work unit")
    p.add_argument(
        "--timeout", type=float, default=10.0, help="seconds after which an input counts as a hang"
    )
    p.add_argument(
        "targets", nargs="*", metavar="DECODER", help=f"some of: {', '.join(TARGETS)} (default: all)"
    )
    args = p.parse_args(argv)
    unknown = [t for t in args.targets if t not in TARGETS]
    if unknown:
        p.error(f"unknown decoder(s): {', '.join(unknown)}")
    args.targets = args.targets or TARGETS
    sys.setrecursionlimit(1000)  # the interpreter default: the decoders must not need more
    units = []
    for t in args.targets:
        left, i = args.count, 0
        while left > 0:
            n = min(args.chunk, left)
            units.append(
                (t, n, args.seed * 1_000_003 + TARGETS.index(t) * 10_007 + i, args.slow, args.timeout)
            )
            left -= n
            i += 1
    totals: dict[str, dict[str, Any]] = {}
    started = time.perf_counter()
    with multiprocessing.Pool(args.jobs) as pool:
        for r in pool.imap_unordered(_work, units):
            t = totals.setdefault(
                r["target"],
                {
                    "inputs": 0,
                    "decoded": 0,
                    "invalid": 0,
                    "escapes": {},
                    "slow": 0,
                    "slowest": 0.0,
                    "cpu": 0.0,
                },
            )
            for k in ("inputs", "decoded", "invalid", "slow"):
                t[k] += r[k]
            t["cpu"] += r["seconds"]
            t["slowest"] = max(t["slowest"], r["slowest"])
            for k, (n, sample) in r["escapes"].items():
                old = t["escapes"].get(k, (0, sample))
                t["escapes"][k] = (old[0] + n, min(old[1], sample, key=len))
    wall = time.perf_counter() - started
    print(
        f"{'decoder':<18} {'inputs':>9} {'decoded':>9} {'invalid':>9} {'escapes':>8} {'slow':>5} "
        f"{'slowest':>8} {'busy s':>8}"
    )
    escaped = 0
    for name in args.targets:
        t = totals[name]
        n_esc = sum(n for n, _ in t["escapes"].values())
        escaped += n_esc
        print(
            f"{name:<18} {t['inputs']:>9} {t['decoded']:>9} {t['invalid']:>9} {n_esc:>8} {t['slow']:>5} "
            f"{t['slowest']:>7.3f}s {t['cpu']:>8.1f}"
        )
        for k, (n, sample) in sorted(t["escapes"].items(), key=lambda kv: -kv[1][0]):
            print(f"    {n:>7} x {k}\n            e.g. {json.dumps(sample)[:240]}")
    total = sum(t["inputs"] for t in totals.values())
    print(
        f"total: {total} inputs, {escaped} escaping exceptions, {wall:.0f} s wall with {args.jobs} process(es)"
    )
    return 1 if escaped else 0


if __name__ == "__main__":
    sys.exit(main())
