"""infra/terraform, checked without terraform (which cannot be installed on the build machine).

Every .tf file parses (python-hcl2); every module has its files, types and documents every
input and output, and pins its providers. The IAM policies and bucket bindings are evaluated
from the parsed HCL for sample inputs and checked role by role: actors only read their own
region, a relay writes only its region's run prefix, the trainer only the home one, only gc
deletes. Buckets are private, TLS-only, never replicated and never expire objects. cloud-init
carries no secret. checkov finds nothing. The example's aurora.toml renders (a small renderer
of the template language below) to the config schema, and `aurora config check` accepts it.
"""

from __future__ import annotations

import base64
import fnmatch
import functools
import gzip
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hcl2
import pytest
import yaml
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


# --- structure ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", tf_files(), ids=rel)
def test_every_tf_file_parses(path: Path) -> None:
    assert isinstance(parse(path), dict)


def test_tfvars_example_parses() -> None:
    example = hcl2.loads((EXAMPLE / "terraform.tfvars.example").read_text(), serialization_options=_OPTIONS)
    declared = {name for name, _ in blocks(EXAMPLE, "variable")}
    assert set(example) <= declared, f"terraform.tfvars.example sets undeclared variables {set(example) - declared}"
    required = {name for name, body in blocks(EXAMPLE, "variable") if "default" not in body}
    assert required <= set(example), f"terraform.tfvars.example misses required variables {required - set(example)}"


def test_the_expected_modules_exist_and_nothing_else_holds_tf_files() -> None:
    assert [rel(d) for d in module_dirs()] == sorted(EXPECTED_MODULES)
    for parent in ("modules/iam-roles", "modules/gpu-pool", ""):
        assert (TF / parent / "README.md").is_file(), f"{parent or 'infra/terraform'} needs a README.md"


@pytest.mark.parametrize("directory", module_dirs(), ids=rel)
def test_module_layout(directory: Path) -> None:
    for name in ("main.tf", "variables.tf", "outputs.tf", "versions.tf", "README.md"):
        assert (directory / name).is_file(), f"{rel(directory)} has no {name}"
    readme = (directory / "README.md").read_text(encoding="utf-8")
    for name, _ in [*blocks(directory, "variable"), *blocks(directory, "output")]:
        assert f"`{name}`" in readme, f"{rel(directory)}/README.md does not document `{name}`"


@pytest.mark.parametrize("directory", module_dirs(), ids=rel)
def test_every_variable_is_typed_and_described(directory: Path) -> None:
    names = [name for name, _ in blocks(directory, "variable")]
    assert len(names) == len(set(names)), f"{rel(directory)}: a variable is declared twice"
    for name, body in blocks(directory, "variable"):
        assert body.get("type"), f"{rel(directory)}: variable {name} has no type"
        assert len(str(body.get("description", "")).strip()) > 10, f"{rel(directory)}: variable {name} undocumented"
        for check in body.get("validation", []):
            assert check.get("condition") and check.get("error_message"), f"{rel(directory)}: var.{name} validation"
    for path in directory.glob("*.tf"):
        if path.name != "variables.tf":
            assert "variable" not in parse(path), f"{rel(path)}: variables belong in variables.tf"


@pytest.mark.parametrize("directory", module_dirs(), ids=rel)
def test_every_output_is_described(directory: Path) -> None:
    outputs = list(blocks(directory, "output"))
    assert outputs, f"{rel(directory)} has no outputs"
    for name, body in outputs:
        assert len(str(body.get("description", "")).strip()) > 10, f"{rel(directory)}: output {name} undocumented"
    for path in directory.glob("*.tf"):
        if path.name != "outputs.tf":
            assert "output" not in parse(path), f"{rel(path)}: outputs belong in outputs.tf"


def providers_used(directory: Path) -> set[str]:
    """Providers whose resources or data sources the module declares, or its child modules need."""
    used = {t.split("_", 1)[0] for kind in ("resource", "data") for t, _, _ in labelled(directory, kind)}
    for _, call in blocks(directory, "module"):
        used |= set(required_providers(directory / call["source"]))
    return used


def required_providers(directory: Path) -> dict[str, dict[str, str]]:
    terraform = parse(directory.resolve() / "versions.tf")["terraform"][0]
    result: dict[str, dict[str, str]] = terraform.get("required_providers", [{}])[0]
    return result


@pytest.mark.parametrize("directory", module_dirs(), ids=rel)
def test_versions_pin_terraform_and_exactly_the_providers_used(directory: Path) -> None:
    terraform = parse(directory / "versions.tf")["terraform"][0]
    assert terraform["required_version"] == ">= 1.6"
    required = required_providers(directory)
    assert set(required) == providers_used(directory), f"{rel(directory)}: required_providers != providers used"
    for name, spec in required.items():
        assert spec["source"] == f"hashicorp/{name}"
        version = spec["version"]
        if name == "aws":
            assert re.fullmatch(r">= ?([6-9]|\d{2,})\.\d+(\.\d+)?", version), f"aws {version}: want >= 6.0"
        else:  # pinned to a major version
            assert re.fullmatch(r"~> ?\d+\.\d+(\.\d+)?", version), f"{name} {version}: want ~> MAJOR.MINOR"
            if name == "google":
                assert version.replace(" ", "").startswith("~>6."), f"google {version}: want ~> 6.x"


# --- IAM on AWS ----------------------------------------------------------------------------------

ACCOUNT = "111111111111"
RUN_PREFIX = "runs/exp1"
AWS_REGIONS = ("us-east-1", "eu-west-1", "us-west-2")


def secret_arn(name: str) -> str:
    return f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:aur/exp1/{name}-AbCdEf"


AWS_IAM_SAMPLE: dict[str, Any] = {
    "name_prefix": "aur-exp1",
    "run_prefix": RUN_PREFIX,
    "buckets": {
        r: {"bucket_arn": f"arn:aws:s3:::b-{r}", "kms_key_arn": f"arn:aws:kms:{r}:{ACCOUNT}:key/k-{r}", "aws_region": r}
        for r in AWS_REGIONS
    },
    "home_region": "us-east-1",
    "relays": {"eu-west-1": {"source": "us-east-1"}, "us-west-2": {"source": "eu-west-1"}},
    "actor_regions": ["eu-west-1", "us-west-2"],
    "gcp_relays": {"europe-west4": {"source": "eu-west-1", "service_account_unique_id": "104000000000000000001"}},
    "secrets": {
        "redis_arn": secret_arn("redis-url"),
        "verify_key_arn": secret_arn("verify-key"),
        "signing_key_arn": secret_arn("signing-key"),
        "kms_key_arn": f"arn:aws:kms:us-east-1:{ACCOUNT}:key/secrets",
    },
    "trainer_can_delete": True,  # the worst case: every optional statement present
    "gc_trusted_principal_arns": [f"arn:aws:iam::{ACCOUNT}:role/operators"],
}
WRITES = [
    "s3:PutObject",
    "s3:DeleteObject",
    "s3:DeleteObjectVersion",
    "s3:AbortMultipartUpload",
    "s3:PutObjectAcl",
    "s3:PutBucketPolicy",
    "s3:PutLifecycleConfiguration",
    "s3:ReplicateObject",
    "s3:RestoreObject",
    "kms:GenerateDataKey",
    "kms:Encrypt",
    "secretsmanager:PutSecretValue",
]
DELETES = ["s3:DeleteObject", "s3:DeleteObjectVersion"]


@dataclass(frozen=True)
class Statement:
    sid: str
    effect: str
    actions: tuple[str, ...]
    resources: tuple[str, ...]
    conditions: tuple[tuple[str, str, tuple[str, ...]], ...]

    def grants(self, concrete: list[str]) -> list[str]:
        return [a for a in concrete for pattern in self.actions if fnmatch.fnmatchcase(a, pattern)]


def statements(body: dict[str, Any], scope: Scope) -> list[Statement]:
    """A policy document's statements; a dynamic statement counts as present (the worst case)."""
    raw = [(s, scope) for s in body.get("statement", [])]
    for dynamic in body.get("dynamic", []):
        for name, spec in dynamic.items():
            assert name == "statement"
            for content in spec["content"]:
                raw.append((content, Scope(scope.vars, scope.locals, {**scope.names, name: {"value": "dynamic"}})))
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


def aws_policies() -> dict[str, list[Statement]]:
    """Every role's evaluated statements: trainer, relay-REGION, actor-REGION, gcp-relay-REGION, gc-REGION."""
    directory = MODULES / "iam-roles" / "aws"
    scope = module_scope(directory, AWS_IAM_SAMPLE)
    found: dict[str, list[Statement]] = {}
    for type_, name, body in labelled(directory, "data"):
        if type_ != "aws_iam_policy_document" or name.endswith("_trust"):
            continue
        for sc in instances(body, scope):
            key = name.replace("_", "-") + (f"-{sc.names['each']['key']}" if "each" in sc.names else "")
            found[key] = statements(body, sc)
    return found


def s3_resources(statement: Statement) -> list[str]:
    return [r for r in statement.resources if r.startswith("arn:aws:s3:::")]


def test_aws_policies_exist_for_every_role() -> None:
    assert set(aws_policies()) == {
        "trainer",
        "relay-eu-west-1",
        "relay-us-west-2",
        "actor-eu-west-1",
        "actor-us-west-2",
        "gcp-relay-europe-west4",
        *(f"gc-{r}" for r in AWS_REGIONS),
    }
    # and each is attached to its role
    roles = {(t, n) for t, n, _ in labelled(MODULES / "iam-roles" / "aws", "resource")}
    for name in ("trainer", "relay", "actor", "gcp_relay", "gc"):
        assert ("aws_iam_role_policy", name) in roles and ("aws_iam_role", name) in roles


@pytest.mark.parametrize("region", ["eu-west-1", "us-west-2"])
def test_aws_actor_only_reads_its_own_region(region: str) -> None:
    policy = aws_policies()[f"actor-{region}"]
    own = f"arn:aws:s3:::b-{region}"
    for s in policy:
        assert s.effect == "Allow"
        assert not s.grants(WRITES), f"actor {region}: {s.sid} grants {s.grants(WRITES)}"
        assert set(s.actions) <= {"s3:GetObject", "s3:ListBucket", "kms:Decrypt", "secretsmanager:GetSecretValue"}
        for r in s3_resources(s):
            assert r in (own, f"{own}/{RUN_PREFIX}", f"{own}/{RUN_PREFIX}/*"), f"actor {region} reaches {r}"
        if "secretsmanager:GetSecretValue" in s.actions:
            assert set(s.resources) == {secret_arn("redis-url"), secret_arn("verify-key")}
        if "kms:Decrypt" in s.actions and s.sid != "SecretsKey":
            assert s.resources == (f"arn:aws:kms:{region}:{ACCOUNT}:key/k-{region}",)


@pytest.mark.parametrize(("region", "source"), [("eu-west-1", "us-east-1"), ("us-west-2", "eu-west-1")])
def test_aws_relay_writes_only_its_own_region_run_prefix(region: str, source: str) -> None:
    policy = aws_policies()[f"relay-{region}"]
    own, src = f"arn:aws:s3:::b-{region}", f"arn:aws:s3:::b-{source}"
    written = [s for s in policy if s.grants(WRITES)]
    assert written, "a relay must be able to write"
    for s in written:
        assert not s.grants(DELETES), f"relay {region}: {s.sid} may delete"
        if s.grants(["kms:GenerateDataKey"]):
            assert s.resources == (f"arn:aws:kms:{region}:{ACCOUNT}:key/k-{region}",)
        else:
            assert s.resources == (f"{own}/{RUN_PREFIX}/*",), f"relay {region} writes {s.resources}"
    for s in policy:
        for r in s3_resources(s):
            assert r.split("/", 1)[0] in (own, src), f"relay {region} reaches {r}"
            assert r in (own, src) or r.split("/", 1)[1] in (RUN_PREFIX, f"{RUN_PREFIX}/*")
        if "secretsmanager:GetSecretValue" in s.actions:
            assert set(s.resources) == {secret_arn("redis-url"), secret_arn("verify-key")}


def test_aws_trainer_writes_only_the_home_run_prefix() -> None:
    policy = aws_policies()["trainer"]
    home = "arn:aws:s3:::b-us-east-1"
    for s in policy:
        if s.grants(WRITES) and not s.grants(["kms:GenerateDataKey"]):
            assert s.resources == (f"{home}/{RUN_PREFIX}/*",), f"trainer writes {s.resources}"
        for r in s3_resources(s):
            assert r in (home, f"{home}/{RUN_PREFIX}", f"{home}/{RUN_PREFIX}/*"), f"trainer reaches {r}"
        if "secretsmanager:GetSecretValue" in s.actions:
            assert set(s.resources) == {secret_arn("redis-url"), secret_arn("signing-key")}
        if s.resources == ("*",):  # only the read-only rendezvous discovery
            assert all(a.split(":")[1].startswith("Describe") for a in s.actions), s


def test_aws_gcp_relay_reads_its_source_only_and_trusts_only_its_service_account() -> None:
    policy = aws_policies()["gcp-relay-europe-west4"]
    src = "arn:aws:s3:::b-eu-west-1"
    for s in policy:
        assert not s.grants(WRITES)
        for r in s3_resources(s):
            assert r in (src, f"{src}/{RUN_PREFIX}", f"{src}/{RUN_PREFIX}/*")
    directory = MODULES / "iam-roles" / "aws"
    trust = next(b for t, n, b in labelled(directory, "data") if n == "gcp_relay_trust")
    (sc,) = instances(trust, module_scope(directory, AWS_IAM_SAMPLE))
    (s,) = statements(trust, sc)
    assert s.actions == ("sts:AssumeRoleWithWebIdentity",)
    assert {(c[1], c[2]) for c in s.conditions} == {
        ("accounts.google.com:aud", ("104000000000000000001",)),
        ("accounts.google.com:sub", ("104000000000000000001",)),
    }


def test_aws_only_gc_and_the_opt_in_trainer_statement_delete() -> None:
    for role, policy in aws_policies().items():
        for s in policy:
            if s.grants(DELETES):
                assert role.startswith("gc-") or (role == "trainer" and s.sid == "dynamic"), f"{role}: {s.sid} deletes"


@pytest.mark.parametrize("region", AWS_REGIONS)
def test_aws_gc_deletes_in_the_run_prefix_and_writes_only_retention_records(region: str) -> None:
    policy = aws_policies()[f"gc-{region}"]
    own = f"arn:aws:s3:::b-{region}"
    assert any(s.grants(DELETES) for s in policy)
    for s in policy:
        if s.grants(["s3:PutObject"]):
            assert s.resources == (f"{own}/{RUN_PREFIX}/retention/*",), s
        if s.grants(DELETES):
            assert set(s.resources) == {f"{own}/{RUN_PREFIX}", f"{own}/{RUN_PREFIX}/*"}, s
        for r in s3_resources(s):
            assert r == own or r.startswith(f"{own}/{RUN_PREFIX}"), r
        if "secretsmanager:GetSecretValue" in s.actions:  # Redis: what live actors hold decides what goes
            assert set(s.resources) == {secret_arn("redis-url"), secret_arn("verify-key")}


def test_aws_every_listing_is_scoped_to_the_run_prefix() -> None:
    for role, policy in aws_policies().items():
        for s in policy:
            if s.grants(["s3:ListBucket"]):
                assert ("StringLike", "s3:prefix", (RUN_PREFIX, f"{RUN_PREFIX}/*")) in s.conditions, (role, s.sid)
            assert "*" not in s.actions and "s3:*" not in s.actions, (role, s.sid)


# --- IAM on Google Cloud ----------------------------------------------------------------------------

GCP_IAM_SAMPLE: dict[str, Any] = {
    "project_id": "acme-rl",
    "name_prefix": "aur",
    "run_prefix": RUN_PREFIX,
    "buckets": {"europe-west4": "b-europe-west4", "asia-east1": "b-asia-east1"},
    "home_region": "asia-east1",
    "relays": {"europe-west4": {"source": "asia-east1"}},
    "actor_regions": ["europe-west4", "asia-east1"],
    "secrets": {
        "redis": "projects/acme-rl/secrets/redis",
        "verify_key": "projects/acme-rl/secrets/verify",
        "signing_key": "projects/acme-rl/secrets/signing",
    },
    "trainer_can_delete": True,
}
READ_ROLES = {"roles/storage.objectViewer"}
CREATE_ROLES = {"roles/storage.objectCreator"}


@dataclass(frozen=True)
class Binding:
    resource: str
    bucket: str
    role: str
    member: str
    condition: str


def gcs_bindings() -> list[Binding]:
    directory = MODULES / "iam-roles" / "gcp"
    scope = module_scope(directory, GCP_IAM_SAMPLE)
    out = []
    for type_, name, body in labelled(directory, "resource"):
        if type_ != "google_storage_bucket_iam_member":
            continue
        for sc in instances(body, scope, fallback=GCP_IAM_SAMPLE["relays"]):
            (condition,) = body["condition"]
            role = sc.evaluate(body["role"])
            out.append(
                Binding(
                    name,
                    sc.evaluate(body["bucket"]),
                    role,
                    sc.evaluate(body["member"]),
                    sc.evaluate(condition["expression"]),
                )
            )
    return out


def who(binding: Binding) -> str:
    m = re.search(r"<google_service_account\.(\w+)(?:\[([\w-]+)\])?(?:\[0\])?\.email>", binding.member)
    assert m, binding
    return m.group(1) + (f"-{m.group(2)}" if m.group(2) and m.group(2) != "0" else "")


def test_gcs_every_binding_is_conditioned_on_its_own_bucket_run_prefix() -> None:
    bindings = gcs_bindings()
    assert {who(b) for b in bindings} == {
        "trainer",
        "relay-europe-west4",
        "actor-europe-west4",
        "actor-asia-east1",
        "gc",
    }
    for b in bindings:
        prefixes = re.findall(r'resource\.name\.startsWith\("([^"]*)"\)', b.condition)
        assert prefixes, b
        for prefix in prefixes:
            assert prefix.startswith(f"projects/_/buckets/{b.bucket}/objects/{RUN_PREFIX}/"), b
        assert set(re.findall(r"projects/_/buckets/([\w.-]+)", b.condition)) == {b.bucket}, b


def test_gcs_actors_only_view_their_own_region() -> None:
    for b in gcs_bindings():
        if who(b).startswith("actor-"):
            region = who(b).removeprefix("actor-")
            assert b.role in READ_ROLES, f"actor {region} holds {b.role}"
            assert b.bucket == GCP_IAM_SAMPLE["buckets"][region]


def test_gcs_relays_and_trainer_create_only_in_their_own_bucket_and_only_gc_deletes() -> None:
    own = {"relay-europe-west4": "b-europe-west4", "trainer": "b-asia-east1"}
    for b in gcs_bindings():
        role = who(b)
        if b.role in CREATE_ROLES and role == "gc":  # its retention records only
            assert b.condition == (
                f'resource.name.startsWith("projects/_/buckets/{b.bucket}/objects/{RUN_PREFIX}/retention/")'
            )
        elif b.role in CREATE_ROLES:
            assert own.get(role) == b.bucket, f"{role} creates in {b.bucket}"
        elif b.role not in READ_ROLES:  # the custom object deleter
            assert "object_deleter" in b.role, f"{role} holds {b.role}"
            assert role in ("gc", "trainer"), f"{role} may delete"
    deleter = next(b for t, n, b in labelled(MODULES / "iam-roles" / "gcp", "resource") if n == "object_deleter")
    assert deleter["permissions"] == ["storage.objects.delete"]


def test_gcs_secrets_are_granted_one_by_one_and_the_signing_key_to_the_trainer_only() -> None:
    grants = locals_of(MODULES / "iam-roles" / "gcp")["secret_grants"]
    # the trainer's two, and only the trainer's, include the signing key
    trainer = re.escape(
        '{for name, secret in {redis = var.secrets.redis, signing_key = var.secrets.signing_key} : "trainer/${name}"'
    )
    assert re.search(trainer + r" => \{[^{}]*\} if local\.trainer\}", grants), grants
    assert grants.count("var.secrets.signing_key") == 1
    given = re.findall(r'"([\w$.{}/-]+)" =>? \{\s*secret = var\.secrets\.(\w+)', grants)
    assert {(g[0].split("/")[0].split("-")[0], g[1]) for g in given} == {
        ("relay", "redis"),
        ("relay", "verify_key"),
        ("actor", "redis"),
        ("actor", "verify_key"),
        ("gc", "redis"),
        ("gc", "verify_key"),
    }


# --- buckets ------------------------------------------------------------------------------------------


def resources(directory: Path, type_: str) -> list[dict[str, Any]]:
    return [body for t, _, body in labelled(directory, "resource") if t == type_]


def test_s3_bucket_blocks_public_access_and_owns_its_objects() -> None:
    directory = MODULES / "aws-region-bucket"
    (block,) = resources(directory, "aws_s3_bucket_public_access_block")
    for key in ("block_public_acls", "block_public_policy", "ignore_public_acls", "restrict_public_buckets"):
        assert block[key] is True, key
    (ownership,) = resources(directory, "aws_s3_bucket_ownership_controls")
    assert ownership["rule"][0]["object_ownership"] == "BucketOwnerEnforced"
    (sse,) = resources(directory, "aws_s3_bucket_server_side_encryption_configuration")
    rule = sse["rule"][0]
    assert rule["apply_server_side_encryption_by_default"][0]["sse_algorithm"] == "aws:kms"
    assert rule["bucket_key_enabled"] is True
    (versioning,) = resources(directory, "aws_s3_bucket_versioning")
    assert versioning["versioning_configuration"][0]["status"] == "Disabled"  # deliberate: see the README


def test_s3_bucket_policy_denies_every_non_tls_request() -> None:
    directory = MODULES / "aws-region-bucket"
    scope = Scope({}, {"bucket_arn": "arn:aws:s3:::b"})
    body = next(b for t, n, b in labelled(directory, "data") if t == "aws_iam_policy_document" and n == "bucket")
    by_sid = {s.sid: s for s in statements(body, scope)}
    tls = by_sid["DenyInsecureTransport"]
    assert tls.effect == "Deny" and tls.actions == ("s3:*",)
    assert set(tls.resources) == {"arn:aws:s3:::b", "arn:aws:s3:::b/*"}
    assert tls.conditions == (("Bool", "aws:SecureTransport", ("false",)),)
    assert body["statement"][0]["principals"] == [{"type": "*", "identifiers": ["*"]}]
    (policy,) = resources(directory, "aws_s3_bucket_policy")
    assert policy["policy"] == "${data.aws_iam_policy_document.bucket.json}"


def test_gcs_bucket_is_private_with_uniform_access() -> None:
    (bucket,) = resources(MODULES / "gcs-region-bucket", "google_storage_bucket")
    assert bucket["uniform_bucket_level_access"] is True
    assert bucket["public_access_prevention"] == "enforced"
    assert bucket["versioning"][0]["enabled"] is False


def test_no_bucket_expires_objects_or_replicates() -> None:
    for directory in module_dirs():
        types = {t for t, _, _ in labelled(directory, "resource")}
        assert not types & {"aws_s3_bucket_replication_configuration", "google_storage_transfer_job"}, directory
        for body in resources(directory, "aws_s3_bucket_lifecycle_configuration"):
            for rule in body["rule"]:
                assert set(rule) <= {"id", "status", "filter", "abort_incomplete_multipart_upload"}, rule
        for body in resources(directory, "google_storage_bucket"):
            actions = [a["type"] for r in body.get("lifecycle_rule", []) for a in r["action"]]
            assert actions == ["AbortIncompleteMultipartUpload"], actions
        for body in resources(directory, "aws_s3_bucket"):
            assert "replication_configuration" not in body and "lifecycle_rule" not in body
    text = "\n".join(p.read_text() for p in tf_files())
    assert "noncurrent_version_expiration" not in text and not re.search(r"^\s*expiration\s*\{", text, re.M)


def test_the_abort_rule_aborts_multipart_uploads_after_a_few_days() -> None:
    (lifecycle,) = resources(MODULES / "aws-region-bucket", "aws_s3_bucket_lifecycle_configuration")
    (rule,) = lifecycle["rule"]
    assert (
        rule["abort_incomplete_multipart_upload"][0]["days_after_initiation"]
        == "${var.abort_incomplete_multipart_days}"
    )
    for directory in (MODULES / "aws-region-bucket", MODULES / "gcs-region-bucket"):
        days = dict(blocks(directory, "variable"))["abort_incomplete_multipart_days"]["default"]
        assert 1 <= days <= 7


# --- cloud-init: no secret in user data ----------------------------------------------------------------

SECRET_SOURCES = ["random_password", "secret_string", "secret_data", "redis_url", "tls_private_key", "private_key"]


def test_no_template_is_given_a_secret() -> None:
    for path in tf_files():
        text = path.read_text()
        for call in re.finditer(r"templatefile\((.*?)\}\)", text, re.S):
            for word in SECRET_SOURCES:
                assert word not in call.group(1), f"{rel(path)}: templatefile is given {word}"
        for m in re.finditer(r"^\s*(user_data|user-data|metadata_startup_script)\s*=\s*(.+)$", text, re.M):
            assert m.group(2).strip() in ("base64gzip(local.cloud_init)", "local.cloud_init"), m.group(0)


def test_pools_are_given_secret_names_never_values() -> None:
    pools = [m for _, m in blocks(EXAMPLE, "module") if "gpu-pool" in m["source"]]
    assert len(pools) == 7
    reader_locals = locals_of(EXAMPLE)
    for call in pools:
        refs = call["secrets"]
        if isinstance(refs, str):
            refs = reader_locals[refs.removeprefix("${local.").removesuffix("}")]
        for env, ref in refs.items():
            assert re.fullmatch(r"\$\{[\w.\[\]]+\.(arn|id|secret_arn)\}", ref), f"{env} = {ref}"
    for directory in (MODULES / "gpu-pool" / "aws", MODULES / "gpu-pool" / "gcp"):
        (validation,) = dict(blocks(directory, "variable"))["secrets"]["validation"]
        assert "secretsmanager" in validation["condition"] or "/secrets/" in validation["condition"]


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


def test_render_follows_terraform_strip_markers() -> None:
    template = "a\n%{ for x in xs ~}\n- ${x}\n%{ endfor ~}\n\nb %{ if flag }yes%{ else }no%{ endif } $${lit}\n"
    assert render(template, {"xs": [1, 2], "flag": False}) == "a\n- 1\n- 2\n\nb no ${lit}\n"


def bootstrap_module() -> Any:
    spec = importlib.util.spec_from_file_location("aurora_bootstrap", TEMPLATES / "aurora-bootstrap.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cloud_init_values(role: str, *, refresh_token: bool) -> dict[str, Any]:
    bootstrap = {"cloud": "aws", "role": role, "secrets": {"AURORA_REDIS": secret_arn("redis-url")}, "worker_id": True}
    return {
        "role": role,
        "region_name": "eu-west-1",
        "aurora_toml_b64": base64.b64encode(b'run_id = "exp1"\n').decode(),
        "bootstrap_json_b64": base64.b64encode(json.dumps(bootstrap).encode()).decode(),
        "bootstrap_py_gz_b64": base64.b64encode(
            gzip.compress((TEMPLATES / "aurora-bootstrap.py").read_bytes())
        ).decode(),
        "exec_start": f"/opt/aurora/venv/bin/aurora {role} --config /etc/aurora/aurora.toml --region eu-west-1",
        "pip_install_json": json.dumps(["/opt/aurora/venv/bin/pip", "install", "aurora-rl[relay,s3]==0.1.0"]),
        "refresh_token": refresh_token,
    }


@pytest.mark.parametrize("refresh_token", [False, True])
def test_cloud_init_installs_the_role_as_a_unit_that_fetches_its_secrets_at_start(refresh_token: bool) -> None:
    template = (TEMPLATES / "cloud-init.yaml.tftpl").read_text()
    text = render(template, cloud_init_values("relay", refresh_token=refresh_token))
    assert text.startswith("#cloud-config\n")
    config = yaml.safe_load(text)
    files = {f["path"]: f for f in config["write_files"]}
    unit = files["/etc/systemd/system/aurora-relay.service"]["content"].splitlines()
    for line in (
        "ExecStartPre=+/usr/local/sbin/aurora-bootstrap",
        "EnvironmentFile=-/run/aurora/env",
        "Restart=on-failure",
        "User=aurora",
        "ExecStart=/opt/aurora/venv/bin/aurora relay --config /etc/aurora/aurora.toml --region eu-west-1",
    ):
        assert line in unit, line
    script = gzip.decompress(base64.b64decode(files["/usr/local/sbin/aurora-bootstrap"]["content"]))
    assert script == (TEMPLATES / "aurora-bootstrap.py").read_bytes()
    assert files["/etc/aurora/aurora.toml"]["encoding"] == "b64"
    assert ["/opt/aurora/venv/bin/pip", "install", "aurora-rl[relay,s3]==0.1.0"] in config["runcmd"]
    last = config["runcmd"][-1]
    assert last == ["systemctl", "enable", "--now", "aurora-relay.service"]
    assert ("/etc/systemd/system/aurora-aws-token.timer" in files) is refresh_token
    assert "rediss://" not in text and "PRIVATE KEY" not in text


def test_cloud_init_is_given_exactly_what_it_uses() -> None:
    template = (TEMPLATES / "cloud-init.yaml.tftpl").read_text()
    used = set(re.findall(r"(?<![$%])[$%]\{~?\s*(?:if |for \w+ in )?(\w+)", template)) - {"endif", "endfor", "else"}
    for directory in (MODULES / "gpu-pool" / "aws", MODULES / "gpu-pool" / "gcp"):
        call = locals_of(directory)["cloud_init"]
        given = set(re.findall(r"[{,]\s*(\w+) = ", call))
        assert given == used == set(cloud_init_values("actor", refresh_token=False)), directory


def test_pool_commands_are_the_roles_commands() -> None:
    for directory, size in (
        (MODULES / "gpu-pool" / "aws", "desired_capacity"),
        (MODULES / "gpu-pool" / "gcp", "target_size"),
    ):
        scope = Scope({"region_name": "eu-west-1", "metrics_port": 9400}, locals_of(directory))
        commands = locals_of(directory)["exec_start"]
        for role in ("relay", "actor"):
            config = "--config /etc/aurora/aurora.toml --region eu-west-1 --metrics-port 9400"
            assert scope.evaluate(commands[role]) == f"/opt/aurora/venv/bin/aurora {role} {config}"
        trainer = commands["trainer"]
        for piece in (
            "${local.venv}/bin/torchrun",
            f"--nnodes=${{var.{size}}}",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=$${AURORA_RDZV_HOST}:${var.rendezvous_port}",
            "--rdzv-id=${var.run_id}",
            "-m aurora_store.cli train --config ${local.config_path} --metrics-port ${var.metrics_port}",
        ):
            assert piece in trainer, piece


def test_trainer_pools_open_a_metrics_port_per_rank() -> None:
    aws = MODULES / "gpu-pool" / "aws"
    (rule,) = [b for t, n, b in labelled(aws, "resource") if n == "metrics"]
    assert rule["to_port"] == "${var.metrics_port + local.metrics_ports - 1}"
    assert locals_of(aws)["metrics_ports"] == '${var.role == "trainer" ? var.gpus_per_node : 1}'
    gcp = MODULES / "gpu-pool" / "gcp"
    (firewall,) = [b for t, n, b in labelled(gcp, "resource") if n == "metrics"]
    assert firewall["allow"][0]["ports"] == ["${local.metrics_ports}"]
    assert "${var.metrics_port + var.gpus_per_node - 1}" in locals_of(gcp)["metrics_ports"]


def test_bootstrap_writes_pem_keys_as_single_quoted_multiline_values() -> None:
    module = bootstrap_module()
    pem = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA\n-----END PUBLIC KEY-----\n"
    assert module.env_line("AURORA_VERIFY_KEY", pem) == f"AURORA_VERIFY_KEY='{pem.strip()}'"
    with pytest.raises(SystemExit, match="single quote"):
        module.env_line("AURORA_REDIS", "rediss://:it's@host:6379/0")
    assert sorted(module.ALLOWED) == ["AURORA_REDIS", "AURORA_SIGNING_KEY", "AURORA_VERIFY_KEY"]


# --- checkov --------------------------------------------------------------------------------------------


def checkov_executable() -> str:
    """checkov from $AURORA_CHECKOV, this venv, or a venv of its own made next to this one."""
    for candidate in (
        os.environ.get("AURORA_CHECKOV"),
        str(Path(sys.executable).parent / "checkov"),
        str(Path(sys.prefix) / "checkov" / "bin" / "checkov"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    venv = Path(sys.prefix) / "checkov"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", CHECKOV_SPEC], capture_output=True, text=True, timeout=900
    )
    if pip.returncode != 0:
        shutil.rmtree(venv, ignore_errors=True)
        pytest.fail(
            f"could not install {CHECKOV_SPEC} into {venv} (set AURORA_CHECKOV to a checkov):\n{pip.stderr[-2000:]}"
        )
    return str(venv / "bin" / "checkov")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_checkov_finds_nothing() -> None:
    """About 16 s of scanning on 2 cores (plus about a minute, once, to install checkov)."""
    result = subprocess.run(
        [checkov_executable(), "-d", str(TF), "--framework", "terraform", "-o", "json", "--quiet", "--skip-download"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    (report,) = [r for r in reports if r["check_type"] == "terraform"]
    failed = [(c["check_id"], c["resource"], c["file_path"]) for c in report["results"]["failed_checks"]]
    assert not failed, failed
    summary = report["summary"]
    assert summary["failed"] == 0 and summary["parsing_errors"] == 0
    assert summary["resource_count"] >= 100 and summary["passed"] >= 300, summary


def test_every_checkov_skip_is_inline_with_a_reason_and_listed_in_the_readme() -> None:
    readme = (TF / "README.md").read_text()
    skips = 0
    for path in sorted(TF.rglob("*")):
        if path.name.startswith((".checkov", ".bc-")):
            pytest.fail(f"{rel(path)}: skips belong inline, next to the resource, with a reason")
        if path.suffix != ".tf":
            continue
        for line in path.read_text().splitlines():
            if "checkov" not in line:
                continue
            m = re.fullmatch(r"\s*#checkov:skip=(CKV2?_[A-Z]+_\d+):(.{30,})", line)
            assert m, f"{rel(path)}: a checkov skip needs an id and a reason: {line.strip()}"
            assert m.group(1) in readme, f"{m.group(1)} is skipped but not listed in infra/terraform/README.md"
            skips += 1
    assert skips >= 1


# --- the example's config file ---------------------------------------------------------------------------


def example_config_values() -> dict[str, Any]:
    """The values config.tf gives the template, for a run like terraform.tfvars.example's."""
    q = json.dumps
    uris = {
        "us-east-1": "s3://acme-aur-us-east-1/runs/exp1",
        "eu-west-1": "s3://acme-aur-eu-west-1/runs/exp1",
        "us-west-2": "s3://acme-aur-us-west-2/runs/exp1",
        "europe-west4": "gs://acme-aur-europe-west4/runs/exp1",
    }
    sources = {"eu-west-1": "us-east-1", "us-west-2": "us-east-1", "europe-west4": "eu-west-1"}
    return {
        "run_id": q("exp1"),
        "home": q("us-east-1"),
        "regions": [
            {
                "name": r,
                "uri": q(uri),
                "source": [q(sources[r])] if r in sources else [],
                "s3_region": [q(r)] if uri.startswith("s3://") else [],
                "actor_batch": [16] if r == "europe-west4" else [],
            }
            for r, uri in uris.items()
        ],
        "steps": 1000,
        "model": q("/opt/models/Qwen3-8B"),
        "data": q("/opt/data/train.jsonl"),
        "data_format": q("gsm8k"),
        "reward": q("math"),
        "prompts": 256,
        "full_every": 10,
        "lease_s": "60.0",
        "actor_engine": q("vllm"),
        "relay_concurrency": 16,
    }


def rendered_config() -> str:
    return render((EXAMPLE / "aurora.toml.tftpl").read_text(), example_config_values())


def test_config_template_uses_plain_interpolations_and_region_loops_only() -> None:
    template = (EXAMPLE / "aurora.toml.tftpl").read_text()
    for m in re.finditer(r"(?<![$%])\$\{(.*?)\}", template):
        assert re.fullmatch(r"\w+(\.\w+)?", m.group(1)), f"not a plain interpolation: {m.group(0)}"
    for m in re.finditer(r"(?<![$%])%\{~?\s*(.*?)\s*~?\}", template):
        assert re.fullmatch(r"for (r in regions|\w+ in r\.\w+)|endfor", m.group(1)), m.group(0)
    config_tf = locals_of(EXAMPLE)
    given = set(re.findall(r"[{,]\s*(\w+) = ", config_tf["aurora_toml"]))
    assert given == set(example_config_values()), "config.tf and this test give the template different values"
    region_keys = set(re.findall(r"r\.(\w+)", template))
    assert region_keys == set(example_config_values()["regions"][0])
    assert region_keys == set(re.findall(r"[{,]\s*(\w+) = (?!=)", config_tf["config_regions"]))


def test_config_renders_to_the_run_config_schema() -> None:
    config = tomllib.loads(rendered_config())
    assert config["run_id"] == "exp1" and not re.search(r"[\s|{}]", config["run_id"])
    assert config["home"] in config["regions"]
    assert "redis" not in config and "keys" not in config, "secrets come from the environment"
    for name, region in config["regions"].items():
        assert re.fullmatch(r"[A-Za-z0-9_-]+", name)
        assert re.fullmatch(r"(s3|gs)://[a-z0-9.-]+/runs/exp1", region["uri"]), region
        assert region.get("source", config["home"]) in config["regions"]
        assert ("storage_options" in region) is region["uri"].startswith("s3://")
        if "storage_options" in region:
            assert region["storage_options"] == {"client_kwargs": {"region_name": name}}
    assert "source" not in config["regions"]["us-east-1"]
    assert config["regions"]["europe-west4"]["source"] == "eu-west-1"
    assert config["regions"]["europe-west4"]["actor"] == {"batch": 16}
    assert config["trainer"]["steps"] == 1000 and config["schedule"]["lease_s"] == 60.0
    assert isinstance(config["schedule"]["lease_s"], float)
    assert config["data"] == {"data": "/opt/data/train.jsonl", "data_format": "gsm8k"}
    assert (config["actor"]["engine"], config["relay"]["concurrency"]) == ("vllm", 16)
    assert config["model"]["model"] == "/opt/models/Qwen3-8B" and config["reward"]["reward"] == "math"
    assert config["rollout"]["prompts"] == 256 and config["publish"]["full_every"] == 10


def test_config_is_what_every_pool_boots_with() -> None:
    pools = [m for _, m in blocks(EXAMPLE, "module") if "gpu-pool" in m["source"]]
    assert {m["aurora_toml"] for m in pools} == {"${local.aurora_toml}"}
    assert locals_of(EXAMPLE)["aurora_toml"].startswith('${templatefile("${path.module}/aurora.toml.tftpl", {')
    (output,) = [body for name, body in blocks(EXAMPLE, "output") if name == "aurora_toml"]
    assert output["value"] == "${local.aurora_toml}" and not output.get("sensitive")


def test_aurora_config_check_accepts_the_rendered_config(tmp_path: Path) -> None:
    path = tmp_path / "aurora.toml"
    path.write_text(rendered_config(), encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "aurora_store.cli", "config", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr
