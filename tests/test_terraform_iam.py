"""infra/terraform's identities, evaluated from the parsed HCL for sample buckets and regions and
checked role by role: actors read only their own region and write only its results/, a relay
writes only its region's run prefix, the trainer only the home one (and reads every region's
results/, across clouds through federation), only gc deletes; on AWS and on Google Cloud. The new
grants are checked both ways: what a role needs is allowed, the neighbouring key is not."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest

from tests.terraform_hcl import (
    ACCOUNT,
    MODULES,
    Statement,
    allows,
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
    "gcp_trainer": {"service_account_unique_id": "104000000000000000002"},  # worst case, beside home_region
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
PAYLOAD = "results/" + "ab" * 32 + ".bin"
"""An offloaded result payload's key under the run prefix."""


def neighbours(bucket: str) -> list[str]:
    """Object ARNs next to a payload in ``bucket`` that no results/ grant may reach."""
    return [
        f"{bucket}/{RUN_PREFIX}/versions/0000000001/manifest.json",
        f"{bucket}/{RUN_PREFIX}/trainer/state-0000000001/state.json",
        f"{bucket}/{RUN_PREFIX}/retention/0000000000001-{'cd' * 16}.json",
        f"{bucket}/{RUN_PREFIX}/results",
        f"{bucket}/{RUN_PREFIX}x/{PAYLOAD}",  # another run whose name starts the same
        f"{bucket}/runs/other/{PAYLOAD}",
        f"{bucket}/{PAYLOAD}",
    ]


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
        "gcp-trainer",
        *(f"gc-{r}" for r in AWS_REGIONS),
    }
    # and each is attached to its role
    roles = {(t, n) for t, n, _ in labelled(MODULES / "iam-roles" / "aws", "resource")}
    for name in ("trainer", "relay", "actor", "gcp_relay", "gcp_trainer", "gc"):
        assert ("aws_iam_role_policy", name) in roles and ("aws_iam_role", name) in roles


@pytest.mark.parametrize("region", ["eu-west-1", "us-west-2"])
def test_aws_actor_reads_its_own_region_and_writes_only_its_results(region: str) -> None:
    policy = aws_policies()[f"actor-{region}"]
    own = f"arn:aws:s3:::b-{region}"
    key = f"arn:aws:kms:{region}:{ACCOUNT}:key/k-{region}"
    for s in policy:
        assert s.effect == "Allow"
        assert not s.grants(DELETES), f"actor {region}: {s.sid} deletes"
        assert set(s.actions) <= {
            "s3:GetObject",
            "s3:ListBucket",
            "s3:PutObject",
            "kms:Decrypt",
            "kms:GenerateDataKey",
            "secretsmanager:GetSecretValue",
        }, s
        if s.grants(WRITES) and not s.grants(["kms:GenerateDataKey"]):  # the one write: its results/
            assert s.actions == ("s3:PutObject",) and s.resources == (f"{own}/{RUN_PREFIX}/results/*",), s
        for r in s3_resources(s):
            assert r in (own, f"{own}/{RUN_PREFIX}", f"{own}/{RUN_PREFIX}/*", f"{own}/{RUN_PREFIX}/results/*"), r
        if "secretsmanager:GetSecretValue" in s.actions:
            assert set(s.resources) == {secret_arn("redis-url"), secret_arn("verify-key")}
        if s.grants(["kms:Decrypt", "kms:GenerateDataKey"]) and s.sid != "SecretsKey":
            assert s.resources == (key,)
            assert s.conditions == (("StringEquals", "kms:ViaService", (f"s3.{region}.amazonaws.com",)),)
    # both ways: its own results/ only, and nothing but a put there
    assert allows(policy, "s3:PutObject", f"{own}/{RUN_PREFIX}/{PAYLOAD}")
    assert allows(policy, "kms:GenerateDataKey", key), "an SSE-KMS put needs a data key"
    for other in neighbours(own) + [f"arn:aws:s3:::b-{r}/{RUN_PREFIX}/{PAYLOAD}" for r in AWS_REGIONS if r != region]:
        assert not allows(policy, "s3:PutObject", other), f"actor {region} may put {other}"
    for action in [*DELETES, "s3:AbortMultipartUpload", "s3:PutObjectAcl", "s3:RestoreObject"]:
        assert not allows(policy, action, f"{own}/{RUN_PREFIX}/{PAYLOAD}"), f"actor {region} may {action}"
    assert allows(policy, "s3:GetObject", f"{own}/{RUN_PREFIX}/{PAYLOAD}"), "a retried put reads back what is there"


def test_aws_bucket_policy_still_refuses_an_unconditional_put_of_a_result() -> None:
    """An actor's put of a payload is put-if-absent (put_payload); the bucket's deny covers results/ too."""
    directory = MODULES / "aws-region-bucket"
    scope = module_scope(directory, {"name": "b-eu-west-1"})
    scope.locals["bucket_arn"] = "arn:aws:s3:::b-eu-west-1"
    body = next(b for t, n, b in labelled(directory, "data") if t == "aws_iam_policy_document" and n == "bucket")
    (deny,) = [s for s in statements(body, scope) if s.effect == "Deny" and s.actions == ("s3:PutObject",)]
    assert scope.vars["require_conditional_writes"] is True, "on by default"
    assert ("Null", "s3:if-none-match", ("true",)) in deny.conditions
    assert ("Bool", "s3:ObjectCreationOperation", ("true",)) in deny.conditions
    payload = f"arn:aws:s3:::b-eu-west-1/{RUN_PREFIX}/{PAYLOAD}"
    assert Statement(deny.sid, "Allow", deny.actions, deny.resources, ()).allows("s3:PutObject", payload)


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


def test_aws_trainer_writes_only_the_home_run_prefix_and_reads_every_regions_results() -> None:
    policy = aws_policies()["trainer"]
    home = "arn:aws:s3:::b-us-east-1"
    results = {f"arn:aws:s3:::b-{r}/{RUN_PREFIX}/results/*" for r in AWS_REGIONS}
    for s in policy:
        if s.grants(WRITES) and not s.grants(["kms:GenerateDataKey"]):
            assert s.resources == (f"{home}/{RUN_PREFIX}/*",), f"trainer writes {s.resources}"
        if s.grants(["kms:GenerateDataKey"]):
            assert s.resources == (f"arn:aws:kms:us-east-1:{ACCOUNT}:key/k-us-east-1",), s
        for r in s3_resources(s):
            assert r in (home, f"{home}/{RUN_PREFIX}", f"{home}/{RUN_PREFIX}/*") or r in results, f"trainer reaches {r}"
            if r in results:
                assert s.actions == ("s3:GetObject",), s
        if "secretsmanager:GetSecretValue" in s.actions:
            assert set(s.resources) == {secret_arn("redis-url"), secret_arn("signing-key")}
        if s.resources == ("*",):  # only the read-only rendezvous discovery
            assert all(a.split(":")[1].startswith("Describe") for a in s.actions), s
        for r in s.resources:  # each bucket key only through S3 in the key's own region
            if r.startswith("arn:aws:kms:") and s.sid != "SecretsKey":
                region = r.split(":")[3]
                assert s.conditions == (("StringEquals", "kms:ViaService", (f"s3.{region}.amazonaws.com",)),), s
    # both ways: every region's payloads, read only; nothing else of another region
    for region in AWS_REGIONS:
        bucket = f"arn:aws:s3:::b-{region}"
        assert allows(policy, "s3:GetObject", f"{bucket}/{RUN_PREFIX}/{PAYLOAD}"), region
        assert allows(policy, "kms:Decrypt", f"arn:aws:kms:{region}:{ACCOUNT}:key/k-{region}"), region
        if bucket != home:
            for other in neighbours(bucket):
                assert not allows(policy, "s3:GetObject", other), f"trainer reads {other}"
            for action in ["s3:PutObject", *DELETES, "s3:ListBucket"]:
                assert not allows(policy, action, f"{bucket}/{RUN_PREFIX}/{PAYLOAD}"), (region, action)
                assert not allows(policy, action, bucket), (region, action)
    assert not allows(policy, "s3:GetObject", f"{home}/runs/other/{PAYLOAD}")


def test_aws_gcp_trainer_reads_only_results_and_trusts_only_its_service_account() -> None:
    policy = aws_policies()["gcp-trainer"]
    for s in policy:
        assert not s.grants(WRITES), s
        assert set(s.actions) <= {"s3:GetObject", "kms:Decrypt"}, s
    for region in AWS_REGIONS:
        bucket = f"arn:aws:s3:::b-{region}"
        assert allows(policy, "s3:GetObject", f"{bucket}/{RUN_PREFIX}/{PAYLOAD}")
        assert allows(policy, "kms:Decrypt", f"arn:aws:kms:{region}:{ACCOUNT}:key/k-{region}")
        for other in neighbours(bucket):
            assert not allows(policy, "s3:GetObject", other), other
    directory = MODULES / "iam-roles" / "aws"
    trust = next(b for t, n, b in labelled(directory, "data") if n == "gcp_trainer_trust")
    (sc,) = instances(trust, module_scope(directory, AWS_IAM_SAMPLE))
    (s,) = statements(trust, sc)
    assert s.actions == ("sts:AssumeRoleWithWebIdentity",)
    assert {(c[1], c[2]) for c in s.conditions} == {
        ("accounts.google.com:aud", ("104000000000000000002",)),
        ("accounts.google.com:sub", ("104000000000000000002",)),
    }


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
    assert allows(policy, "s3:DeleteObject", f"{own}/{RUN_PREFIX}/{PAYLOAD}"), "old results/ payloads too"
    assert allows(policy, "s3:ListBucket", own) and allows(policy, "s3:GetObject", f"{own}/{RUN_PREFIX}/{PAYLOAD}")
    for other in (
        f"{own}/runs/other/{PAYLOAD}",
        f"{own}/{PAYLOAD}",
        f"arn:aws:s3:::b-elsewhere/{RUN_PREFIX}/{PAYLOAD}",
    ):
        assert not allows(policy, "s3:DeleteObject", other), other
    assert not allows(policy, "s3:PutObject", f"{own}/{RUN_PREFIX}/{PAYLOAD}"), "gc writes only retention records"
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
    # worst case: a trainer on AWS too (a precondition refuses both at once; every binding is present here)
    "aws_trainer": {"account_id": ACCOUNT, "role_name": "aur-exp1-trainer", "partition": "aws"},
}
AWS_TRAINER = f"arn:aws:sts::{ACCOUNT}:assumed-role/aur-exp1-trainer"
READ_ROLES = {"roles/storage.objectViewer"}
CREATE_ROLES = {"roles/storage.objectCreator"}
PERMISSIONS = {"roles/storage.objectViewer": {"get", "list"}, "roles/storage.objectCreator": {"create"}}
"""The object permissions of each predefined role (the custom deleter holds ``delete`` only)."""
FALLBACKS = {
    "relay_source_read": GCP_IAM_SAMPLE["relays"],
    "trainer_results_read": GCP_IAM_SAMPLE["buckets"],
    "aws_trainer_results_read": GCP_IAM_SAMPLE["buckets"],
}
"""A superset of each conditional for_each (the evaluator cannot compute a conditional)."""


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
        for sc in instances(body, scope, fallback=FALLBACKS.get(name)):
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
    if binding.member.startswith("principalSet://"):
        pool = "principalSet://iam.googleapis.com/<google_iam_workload_identity_pool.aws_trainer[0].name>"
        assert binding.member == f"{pool}/attribute.aws_role/{AWS_TRAINER}", binding
        return "aws-trainer"
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
        "aws-trainer",
        "gc",
    }
    for b in bindings:
        prefixes = re.findall(r'resource\.name\.startsWith\("([^"]*)"\)', b.condition)
        assert prefixes, b
        for prefix in prefixes:
            assert prefix.startswith(f"projects/_/buckets/{b.bucket}/objects/{RUN_PREFIX}/"), b
        assert set(re.findall(r"projects/_/buckets/([\w.-]+)", b.condition)) == {b.bucket}, b


def may(bindings: list[Binding], role: str, permission: str, bucket: str, name: str) -> bool:
    """Whether ``role`` (a who()) holds ``permission`` on object ``name`` of ``bucket``: a binding of
    a role with it whose condition admits the object (its ``startsWith`` and ``==`` clauses; the
    listing clause matches only the bucket itself)."""
    obj = f"projects/_/buckets/{bucket}/objects/{name}"
    for b in bindings:
        held = PERMISSIONS.get(b.role, {"delete"} if "object_deleter" in b.role else set())
        if who(b) != role or b.bucket != bucket or permission not in held:
            continue
        starts = re.findall(r'resource\.name\.startsWith\("([^"]*)"\)', b.condition)
        equals = re.findall(r'resource\.name == "([^"]*)"', b.condition)
        if any(obj.startswith(p) for p in starts) or obj in equals:
            return True
    return False


def gcs_neighbours() -> list[str]:
    return [n.split("/", 1)[1] for n in neighbours("b")]


def test_gcs_actors_view_their_own_region_and_create_only_its_results() -> None:
    bindings = gcs_bindings()
    for b in bindings:
        if who(b).startswith("actor-"):
            region = who(b).removeprefix("actor-")
            assert b.bucket == GCP_IAM_SAMPLE["buckets"][region]
            assert b.role in READ_ROLES | CREATE_ROLES, f"actor {region} holds {b.role}"
            if b.role in CREATE_ROLES:
                assert b.condition == (
                    f'resource.name.startsWith("projects/_/buckets/{b.bucket}/objects/{RUN_PREFIX}/results/")'
                ), b
    for region, bucket in GCP_IAM_SAMPLE["buckets"].items():
        actor = f"actor-{region}"
        assert may(bindings, actor, "create", bucket, f"{RUN_PREFIX}/{PAYLOAD}")
        assert may(bindings, actor, "get", bucket, f"{RUN_PREFIX}/versions/0000000001/manifest.json")
        for name in gcs_neighbours():
            assert not may(bindings, actor, "create", bucket, name), (actor, name)
        for other in set(GCP_IAM_SAMPLE["buckets"].values()) - {bucket}:
            assert not may(bindings, actor, "create", other, f"{RUN_PREFIX}/{PAYLOAD}")
            assert not may(bindings, actor, "get", other, f"{RUN_PREFIX}/{PAYLOAD}")
        assert not may(bindings, actor, "delete", bucket, f"{RUN_PREFIX}/{PAYLOAD}")


def test_gcs_trainers_read_every_regions_results_and_nothing_else_there() -> None:
    bindings = gcs_bindings()
    home = GCP_IAM_SAMPLE["buckets"][GCP_IAM_SAMPLE["home_region"]]
    for trainer in ("trainer", "aws-trainer"):
        for bucket in GCP_IAM_SAMPLE["buckets"].values():
            assert may(bindings, trainer, "get", bucket, f"{RUN_PREFIX}/{PAYLOAD}"), (trainer, bucket)
            if trainer == "aws-trainer" or bucket != home:
                for name in gcs_neighbours():
                    assert not may(bindings, trainer, "get", bucket, name), (trainer, bucket, name)
                for permission in ("create", "delete"):
                    assert not may(bindings, trainer, permission, bucket, f"{RUN_PREFIX}/{PAYLOAD}")
    for b in bindings:
        if who(b) == "aws-trainer" or b.resource == "trainer_results_read":
            assert b.role == "roles/storage.objectViewer"
            assert b.condition == (
                f'resource.name.startsWith("projects/_/buckets/{b.bucket}/objects/{RUN_PREFIX}/results/")'
            ), b


def test_gcs_the_aws_trainer_pool_admits_only_the_trainers_role() -> None:
    directory = MODULES / "iam-roles" / "gcp"
    scope = module_scope(directory, GCP_IAM_SAMPLE)
    (provider,) = [
        b for t, n, b in labelled(directory, "resource") if t == "google_iam_workload_identity_pool_provider"
    ]
    assert scope.evaluate(provider["attribute_condition"]) == f'attribute.aws_role == "{AWS_TRAINER}"'
    assert provider["aws"] == [{"account_id": "${var.aws_trainer.account_id}"}]
    mapping = provider["attribute_mapping"]
    assert mapping["google.subject"] == "assertion.arn" and "assumed-role/{role_name}/" in mapping["attribute.aws_role"]
    (pool,) = [b for t, _, b in labelled(directory, "resource") if t == "google_iam_workload_identity_pool"]
    assert pool["count"] == provider["count"] == "${var.aws_trainer == null ? 0 : 1}"
    assert "var.home_region == null" in pool["lifecycle"][0]["precondition"][0]["condition"]


def test_gcs_gc_deletes_results_in_every_bucket() -> None:
    bindings = gcs_bindings()
    for bucket in GCP_IAM_SAMPLE["buckets"].values():
        assert may(bindings, "gc", "delete", bucket, f"{RUN_PREFIX}/{PAYLOAD}")
        assert not may(bindings, "gc", "delete", bucket, f"runs/other/{PAYLOAD}")
        assert not may(bindings, "gc", "create", bucket, f"{RUN_PREFIX}/{PAYLOAD}")


def test_gcs_relays_and_trainer_create_only_in_their_own_bucket_and_only_gc_deletes() -> None:
    own = {"relay-europe-west4": "b-europe-west4", "trainer": "b-asia-east1"}
    for b in gcs_bindings():
        role = who(b)
        if b.role in CREATE_ROLES and role == "gc":  # its retention records only
            assert b.condition == (
                f'resource.name.startsWith("projects/_/buckets/{b.bucket}/objects/{RUN_PREFIX}/retention/")'
            )
        elif b.role in CREATE_ROLES and role.startswith("actor-"):  # results/ only (above)
            assert b.condition.endswith(f'/objects/{RUN_PREFIX}/results/")'), b
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
