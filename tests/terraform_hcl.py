"""Reading infra/terraform without terraform: python-hcl2 parsing, a small evaluator of the HCL
references its policies use, and a renderer of Terraform's template language (for tests)."""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hcl2
from hcl2 import SerializationOptions

REPO = Path(__file__).resolve().parent.parent
TF = REPO / "infra" / "terraform"
MODULES = TF / "modules"
EXAMPLE = TF / "examples" / "four-regions"
TEMPLATES = MODULES / "gpu-pool" / "templates"
EXPECTED_MODULES = [
    "modules/aws-region-bucket",
    "modules/gcs-region-bucket",
    "modules/iam-roles/aws",
    "modules/iam-roles/gcp",
    "modules/redis",
    "modules/gpu-pool/aws",
    "modules/gpu-pool/gcp",
    "examples/four-regions",
]
CHECKOV_SPEC = "checkov==3.3.30"
"""checkov pins boto3/botocore far below what aiobotocore (s3fs) needs, so it lives in a venv of its own."""


# --- parsing ----------------------------------------------------------------------------------

_OPTIONS = SerializationOptions(
    strip_string_quotes=True, with_comments=False, explicit_blocks=False, preserve_heredocs=False
)


@functools.cache
def parse(path: Path) -> dict[str, Any]:
    result: dict[str, Any] = hcl2.loads(path.read_text(encoding="utf-8"), serialization_options=_OPTIONS)
    return result


def tf_files() -> list[Path]:
    return sorted(TF.rglob("*.tf"))


def module_dirs() -> list[Path]:
    return sorted({p.parent for p in tf_files()})


def blocks(directory: Path, kind: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(name, body) of every `variable`/`output`/`module` block of a module."""
    for path in sorted(directory.glob("*.tf")):
        for entry in parse(path).get(kind, []):
            yield from entry.items()


def labelled(directory: Path, kind: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(type, name, body) of every `resource`/`data` block of a module."""
    for path in sorted(directory.glob("*.tf")):
        for entry in parse(path).get(kind, []):
            for type_, named in entry.items():
                for name, body in named.items():
                    yield type_, name, body


def locals_of(directory: Path) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for path in sorted(directory.glob("*.tf")):
        for entry in parse(path).get("locals", []):
            merged.update(entry)
    return merged


def rel(path: Path) -> str:
    return str(path.relative_to(TF))


# --- a small evaluator of HCL references -------------------------------------------------------


class Opaque(Exception):
    """An expression this evaluator does not model (a function call, a conditional, a for)."""


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_INTERP = re.compile(r"\$\{([^{}]*)\}")


@dataclass
class Scope:
    """What references resolve against: a module's variables and locals, and each/iterators."""

    vars: dict[str, Any]
    locals: dict[str, Any] = field(default_factory=dict)
    names: dict[str, Any] = field(default_factory=dict)  # each, count, dynamic iterators

    def evaluate(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self.evaluate(v) for v in value]
        if isinstance(value, dict):
            return {k: self.evaluate(v) for k, v in value.items()}
        if not isinstance(value, str):
            return value
        text = value.replace("$${", "\0")
        whole = _INTERP.fullmatch(text)
        if whole:
            return self.reference(whole.group(1))
        out = _INTERP.sub(lambda m: str(self.reference(m.group(1))), text)
        if "${" in out:
            raise Opaque(value)
        return out.replace("\0", "${")

    def reference(self, expr: str) -> Any:
        expr = expr.strip()
        m = _IDENT.match(expr)
        if not m:
            raise Opaque(expr)
        root, pos = m.group(), m.end()
        path: list[Any] = []
        shown = root
        while pos < len(expr):
            if expr[pos] == ".":
                m = _IDENT.match(expr, pos + 1)
                if not m:
                    raise Opaque(expr)
                path.append(m.group())
                shown += f".{m.group()}"
                pos = m.end()
            elif expr[pos] == "[":
                depth, end = 0, pos
                for end in range(pos, len(expr)):
                    depth += {"[": 1, "]": -1}.get(expr[end], 0)
                    if depth == 0:
                        break
                inner = expr[pos + 1 : end].strip()
                if re.fullmatch(r"\d+", inner):
                    path.append(int(inner))
                elif re.fullmatch(r'"[^"]*"', inner):
                    path.append(inner[1:-1])
                else:
                    path.append(self.reference(inner))
                shown += f"[{path[-1]}]"
                pos = end + 1
            else:
                raise Opaque(expr)
        if root == "var":
            base: Any = self.vars
        elif root == "local":
            base = {path[0]: self.evaluate(self.locals[path[0]])}
        elif root in self.names:
            base = self.names[root]
        else:  # a resource, data source, module or path: a symbol carrying its evaluated indices
            return f"<{shown}>"
        return walk(base, path)


def walk(value: Any, path: list[Any]) -> Any:
    for step in path:
        value = value[step]
    return value


def instances(body: dict[str, Any], scope: Scope, fallback: dict[str, Any] | None = None) -> Iterator[Scope]:
    """A scope per instance of a block: one per for_each element, one for a count (worst case:
    the instance exists). A for_each this evaluator cannot compute takes `fallback`, a superset."""
    if "for_each" in body:
        try:
            each = scope.evaluate(body["for_each"])
        except Opaque:
            assert fallback is not None, f"for_each {body['for_each']} needs a fallback"
            each = fallback
        items = each.items() if isinstance(each, dict) else ((v, v) for v in each)
        for key, value in items:
            yield Scope(scope.vars, scope.locals, {**scope.names, "each": {"key": key, "value": value}})
    else:
        yield Scope(scope.vars, scope.locals, {**scope.names, "count": {"index": 0}})


def module_scope(directory: Path, overrides: dict[str, Any]) -> Scope:
    """The module's variables (defaults, then `overrides`), every required one given."""
    values: dict[str, Any] = {}
    for name, body in blocks(directory, "variable"):
        if "default" in body:
            values[name] = body["default"]
        else:
            assert name in overrides, f"{rel(directory)}: the test gives no sample value for required var.{name}"
    unknown = set(overrides) - {name for name, _ in blocks(directory, "variable")}
    assert not unknown, f"{rel(directory)}: sample values for undeclared variables {unknown}"
    return Scope({**values, **overrides}, locals_of(directory))


def render(template: str, values: dict[str, Any]) -> str:
    """Terraform's template language, as far as these templates use it: ${name.attr},
    %{ for x in name.attr }, %{ if name }/%{ else }/%{ endif }, the ~ strip markers (a literal is
    cut at each newline, and a marker strips the adjacent piece only), $${ and %%{ escapes."""
    parts: list[tuple[str, str]] = []  # (kind, text): lit, interp, dir
    pos = 0
    for m in re.finditer(r"(?<![$%])([$%])\{(~?)\s*(.*?)\s*(~?)\}", template, re.S):
        lit = template[pos : m.start()].replace("$${", "${").replace("%%{", "%{")
        parts += [("lit", piece) for piece in re.findall(r"[^\n]*\n|[^\n]+", lit)]
        if m.group(2) and parts and parts[-1][0] == "lit":
            parts[-1] = ("lit", parts[-1][1].rstrip())
        parts.append(("interp" if m.group(1) == "$" else "dir", m.group(3)))
        parts.append(("strip", "") if m.group(4) else ("nostrip", ""))
        pos = m.end()
    lit = template[pos:].replace("$${", "${").replace("%%{", "%{")
    parts += [("lit", piece) for piece in re.findall(r"[^\n]*\n|[^\n]+", lit)]
    tokens: list[tuple[str, str]] = []
    strip_next = False
    for kind, text in parts:
        if kind in ("strip", "nostrip"):
            strip_next = kind == "strip"
            continue
        if kind == "lit" and strip_next:
            text = text.lstrip()
        strip_next = False
        tokens.append((kind, text))

    def tree(i: int, stop: tuple[str, ...]) -> tuple[list[Any], int, str]:
        """Nodes from tokens[i:] up to a directive in `stop`: (nodes, its index, its word)."""
        nodes: list[Any] = []
        while i < len(tokens):
            kind, text = tokens[i]
            word = text.split()[0] if kind == "dir" else ""
            if kind != "dir":
                nodes.append((kind, text))
            elif word in stop:
                return nodes, i, word
            elif word == "for":
                m = re.fullmatch(r"for (\w+) in (.+)", text)
                assert m, text
                body, i, _ = tree(i + 1, ("endfor",))
                nodes.append(("for", m.group(1), m.group(2), body))
            elif word == "if":
                then, i, word = tree(i + 1, ("else", "endif"))
                other: list[Any] = []
                if word == "else":
                    other, i, _ = tree(i + 1, ("endif",))
                nodes.append(("if", text[3:].strip(), then, other))
            else:
                raise AssertionError(f"unexpected directive {text!r}")
            i += 1
        assert not stop, f"template ends before {stop}"
        return nodes, i, ""

    def value(expr: str, scope: dict[str, Any]) -> Any:
        assert re.fullmatch(r"[A-Za-z_]\w*(\.\w+)*", expr), f"not a plain reference: {expr}"
        return walk(scope, expr.split("."))

    def emit(nodes: list[Any], scope: dict[str, Any], out: list[str]) -> None:
        for node in nodes:
            if node[0] == "lit":
                out.append(node[1])
            elif node[0] == "interp":
                v = value(node[1], scope)
                out.append(str(v).lower() if isinstance(v, bool) else str(v))
            elif node[0] == "for":
                for item in value(node[2], scope):
                    emit(node[3], {**scope, node[1]: item}, out)
            else:
                emit(node[2] if value(node[1], scope) else node[3], scope, out)

    out: list[str] = []
    emit(tree(0, ())[0], values, out)
    return "".join(out)


def resources(directory: Path, type_: str) -> list[dict[str, Any]]:
    return [body for t, _, body in labelled(directory, "resource") if t == type_]


ACCOUNT = "111111111111"


def secret_arn(name: str) -> str:
    return f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:aur/exp1/{name}-AbCdEf"


@dataclass(frozen=True)
class Statement:
    sid: str
    effect: str
    actions: tuple[str, ...]
    resources: tuple[str, ...]
    conditions: tuple[tuple[str, str, tuple[str, ...]], ...]

    def grants(self, concrete: list[str]) -> list[str]:
        return [a for a in concrete for pattern in self.actions if fnmatch.fnmatchcase(a, pattern)]

    def allows(self, action: str, resource: str) -> bool:
        """Whether this Allow statement grants ``action`` on ``resource`` (IAM's ``*``/``?`` wildcards;
        conditions are not evaluated: on object ARNs these policies carry none)."""
        return (
            self.effect == "Allow"
            and bool(self.grants([action]))
            and any(fnmatch.fnmatchcase(resource, pattern) for pattern in self.resources)
        )


def allows(policy: list[Statement], action: str, resource: str) -> bool:
    """Whether any statement of ``policy`` grants ``action`` on ``resource``."""
    return any(s.allows(action, resource) for s in policy)


def statements(body: dict[str, Any], scope: Scope) -> list[Statement]:
    """A policy document's statements. A dynamic statement whose for_each this evaluator can compute
    (``var.buckets``) is one statement per element; one it cannot (a conditional) counts as present
    once, its iterator's value the word "dynamic" (the worst case)."""
    raw = [(s, scope) for s in body.get("statement", [])]
    for dynamic in body.get("dynamic", []):
        for name, spec in dynamic.items():
            assert name == "statement"
            try:
                each = scope.evaluate(spec["for_each"])
            except Opaque:
                each = None
            if isinstance(each, dict | list):
                items = list(each.items() if isinstance(each, dict) else ((v, v) for v in each))
                iterators = [{"key": k, "value": v} for k, v in items]
            else:
                iterators = [{"value": "dynamic"}]
            for content in spec["content"]:
                for it in iterators:
                    raw.append((content, Scope(scope.vars, scope.locals, {**scope.names, name: it})))
    out = []
    for s, sc in raw:
        conditions = tuple(
            (sc.evaluate(c["test"]), sc.evaluate(c["variable"]), tuple(flat(lenient(sc, c["values"]))))
            for c in s.get("condition", [])
        )
        out.append(
            Statement(
                sid=str(sc.evaluate(s.get("sid", ""))),
                effect=s.get("effect", "Allow"),
                actions=tuple(flat(sc.evaluate(s.get("actions", [])))),
                resources=tuple(flat(sc.evaluate(s.get("resources", [])))),
                conditions=conditions,
            )
        )
    return out


def lenient(scope: Scope, value: Any) -> Any:
    """A condition's values, evaluated where this evaluator can (kms:ViaService is built with split())."""
    try:
        return scope.evaluate(value)
    except Opaque:
        return value


def flat(value: Any) -> list[str]:
    if isinstance(value, list):
        return [x for v in value for x in flat(v)]
    return [str(value)]
