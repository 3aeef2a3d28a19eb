"""infra/terraform's identities, evaluated from the parsed HCL for sample buckets and regions and
checked role by role: actors only read their own region, a relay writes only its region's run
prefix, the trainer only the home one, only gc deletes; on AWS and on Google Cloud."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest

from tests.terraform_hcl import (
    ACCOUNT,
    MODULES,
    Statement,
    instances,
    labelled,
    locals_of,
    module_scope,
    secret_arn,
    statements,
)

# --- IAM on AWS ----------------------------------------------------------------------------------

RUN_PREFIX = "runs/exp1"
AWS_REGIONS = ("us-east-1", "eu-west-1", "us-west-2")


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
