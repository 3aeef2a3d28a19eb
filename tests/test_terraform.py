"""infra/terraform, checked without terraform (which cannot be installed on the build machine).

Every .tf file parses (python-hcl2); every module has its files, types and documents every
input and output, and pins its providers. Buckets are private, TLS-only, never replicated, and
expire nothing but each run's offloaded result payloads (RUN_PREFIX/results/). cloud-init carries
no secret. checkov finds nothing. The example's
aurora.toml renders to the config schema, and `aurora config check` accepts it. The IAM
policies are checked in test_terraform_iam.py.
"""

from __future__ import annotations

import base64
import gzip
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import hcl2
import pytest
import yaml

from tests.terraform_hcl import (
    _OPTIONS,
    CHECKOV_SPEC,
    EXAMPLE,
    EXPECTED_MODULES,
    MODULES,
    REPO,
    TEMPLATES,
    TF,
    Scope,
    blocks,
    labelled,
    locals_of,
    module_dirs,
    parse,
    rel,
    render,
    resources,
    secret_arn,
    statements,
    tf_files,
)

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


# --- buckets ------------------------------------------------------------------------------------------


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


def test_nothing_but_results_ever_expires_and_no_bucket_replicates() -> None:
    """Versions must never expire (a kept delta needs its full version, whatever its age): the only
    expiring rule of each bucket module is the one for RUN_PREFIX/results/, the offloaded payloads."""
    expiring = []
    for directory in module_dirs():
        types = {t for t, _, _ in labelled(directory, "resource")}
        assert not types & {"aws_s3_bucket_replication_configuration", "google_storage_transfer_job"}, directory
        for body in resources(directory, "aws_s3_bucket_lifecycle_configuration"):
            for rule in body["rule"]:  # static rules: abort incomplete uploads only
                assert set(rule) <= {"id", "status", "filter", "abort_incomplete_multipart_upload"}, rule
            for dynamic in body.get("dynamic", []):
                assert list(dynamic) == ["rule"], dynamic
                spec = dynamic["rule"]
                assert spec["for_each"] == "${toset(var.run_prefixes)}"
                (content,) = spec["content"]
                assert set(content) == {"id", "status", "filter", "expiration"}, content
                assert content["filter"] == [{"prefix": "${rule.value}/results/"}]
                assert content["expiration"] == [{"days": "${var.results_expire_days}"}]
                expiring.append(rel(directory))
        for body in resources(directory, "google_storage_bucket"):
            actions = [a["type"] for r in body.get("lifecycle_rule", []) for a in r["action"]]
            assert actions == ["AbortIncompleteMultipartUpload"], actions
            for dynamic in body.get("dynamic", []):
                if "lifecycle_rule" not in dynamic:
                    continue
                (content,) = dynamic["lifecycle_rule"]["content"]
                assert content["action"] == [{"type": "Delete"}]
                assert content["condition"] == [
                    {
                        "age": "${var.results_expire_days}",
                        "matches_prefix": '${[for p in var.run_prefixes : "${p}/results/"]}',
                    }
                ]
                expiring.append(rel(directory))
        for body in resources(directory, "aws_s3_bucket"):
            assert "replication_configuration" not in body and "lifecycle_rule" not in body
    assert sorted(expiring) == ["modules/aws-region-bucket", "modules/gcs-region-bucket"]
    text = "\n".join(p.read_text() for p in tf_files())
    assert "noncurrent_version_expiration" not in text
    assert len(re.findall(r"^\s*expiration\s*\{", text, re.M)) == 1, "the results rule's, and no other"
    assert "SetStorageClass" not in text and "transition" not in text


@pytest.mark.parametrize("directory", ["aws-region-bucket", "gcs-region-bucket"])
def test_the_results_rule_matches_a_runs_payloads_and_nothing_else(directory: str) -> None:
    variables = dict(blocks(MODULES / directory, "variable"))
    assert variables["run_prefixes"]["default"] == [] and variables["results_expire_days"]["default"] == 1
    (check,) = variables["run_prefixes"]["validation"]
    iam_check = dict(blocks(MODULES / "iam-roles" / "aws", "variable"))["run_prefix"]["validation"][0]["condition"]
    assert (
        check["condition"]
        == f"${{alltrue([for p in var.run_prefixes : {iam_check[2:-1].replace('var.run_prefix', 'p')}])}}"
    )
    prefixes = [f"{p}/results/" for p in ("runs/exp1", "runs/exp")]  # as the rule renders them
    payload = "results/" + "ab" * 32 + ".bin"
    assert all(any(f"{run}/{payload}".startswith(p) for p in prefixes) for run in ("runs/exp1", "runs/exp"))
    for key in (
        "runs/exp1/versions/0000000000/manifest.json",
        "runs/exp1/trainer/state-0000000001/state.json",
        "runs/exp1/retention/0000000000001-" + "cd" * 16 + ".json",
        "runs/exp1/results",
        f"runs/exp10/{payload}",
        f"runs/exp1x/{payload}",
        payload,
    ):
        assert not any(key.startswith(p) for p in prefixes), key


def test_the_example_expires_its_runs_results_in_every_bucket() -> None:
    buckets = [m for _, m in blocks(EXAMPLE, "module") if "region-bucket" in m["source"]]
    assert len(buckets) == 4
    assert all(m["run_prefixes"] == ["${local.run_prefix}"] for m in buckets)
    assert locals_of(EXAMPLE)["run_prefix"] == "runs/${var.run_id}"


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


def test_render_follows_terraform_strip_markers() -> None:
    template = "a\n%{ for x in xs ~}\n- ${x}\n%{ endfor ~}\n\nb %{ if flag }yes%{ else }no%{ endif } $${lit}\n"
    assert render(template, {"xs": [1, 2], "flag": False}) == "a\n- 1\n- 2\n\nb no ${lit}\n"


def bootstrap_module() -> Any:
    spec = importlib.util.spec_from_file_location("aurora_bootstrap", TEMPLATES / "aurora-bootstrap.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GCP_CREDENTIALS = {"type": "external_account", "audience": "//iam.googleapis.com/projects/1/locations/global/x"}


def cloud_init_values(role: str, *, refresh_token: bool, gcp_credentials: bool = False) -> dict[str, Any]:
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
        "gcp_credentials": gcp_credentials,
        "gcp_credentials_b64": base64.b64encode(json.dumps(GCP_CREDENTIALS).encode()).decode()
        if gcp_credentials
        else "",
    }


@pytest.mark.parametrize(("refresh_token", "gcp_credentials"), [(False, False), (True, False), (False, True)])
def test_cloud_init_installs_the_role_as_a_unit_that_fetches_its_secrets_at_start(
    refresh_token: bool, gcp_credentials: bool
) -> None:
    template = (TEMPLATES / "cloud-init.yaml.tftpl").read_text()
    values = cloud_init_values("relay", refresh_token=refresh_token, gcp_credentials=gcp_credentials)
    text = render(template, values)
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
    credentials = "/etc/aurora/gcp-credentials.json"
    assert (credentials in files) is gcp_credentials
    assert (f"Environment=GOOGLE_APPLICATION_CREDENTIALS={credentials}" in unit) is gcp_credentials
    if gcp_credentials:
        assert files[credentials]["encoding"] == "b64" and files[credentials]["permissions"] == "0644"
        assert json.loads(base64.b64decode(files[credentials]["content"])) == GCP_CREDENTIALS
    assert "rediss://" not in text and "PRIVATE KEY" not in text


def test_cloud_init_is_given_exactly_what_it_uses() -> None:
    template = (TEMPLATES / "cloud-init.yaml.tftpl").read_text()
    used = set(re.findall(r"(?<![$%])[$%]\{~?\s*(?:if |for \w+ in )?(\w+)", template)) - {"endif", "endfor", "else"}
    for directory in (MODULES / "gpu-pool" / "aws", MODULES / "gpu-pool" / "gcp"):
        call = locals_of(directory)["cloud_init"]
        given = set(re.findall(r"[{,]\s*(\w+) = ", call))
        assert given == used == set(cloud_init_values("actor", refresh_token=False)), directory


def test_the_aws_trainer_reads_gcs_results_with_a_credential_configuration_not_a_key() -> None:
    aws = MODULES / "gpu-pool" / "aws"
    call = locals_of(aws)["cloud_init"]
    assert "gcp_credentials = var.gcp_credential_config != null" in call
    assert (
        'gcp_credentials_b64 = var.gcp_credential_config == null ? "" : base64encode(var.gcp_credential_config)' in call
    )
    assert '["gcs"]' in locals_of(aws)["extras"] and "var.gcp_credential_config == null" in locals_of(aws)["extras"]
    (check,) = dict(blocks(aws, "variable"))["gcp_credential_config"]["validation"]
    assert '"external_account"' in check["condition"], "never a service account key"
    gcp_call = locals_of(MODULES / "gpu-pool" / "gcp")["cloud_init"]
    assert "gcp_credentials = false" in gcp_call, "a Google Cloud host uses its own service account"
    (trainer,) = [m for n, m in blocks(EXAMPLE, "module") if n == "trainer"]
    assert trainer["gcp_credential_config"] == "${module.iam_gcp.aws_trainer_credential_config}"
    (iam_gcp,) = [m for n, m in blocks(EXAMPLE, "module") if n == "iam_gcp"]
    assert iam_gcp["aws_trainer"] == {
        "account_id": "${data.aws_caller_identity.home.account_id}",
        "role_name": "${module.iam_aws.trainer_role_name}",
    }
    (output,) = [b for n, b in blocks(MODULES / "iam-roles" / "gcp", "output") if n == "aws_trainer_credential_config"]
    config = output["value"]
    for piece in (
        'type = "external_account"',
        'subject_token_type = "urn:ietf:params:aws:token-type:aws4_request"',
        "imdsv2_session_token_url",
        'environment_id = "aws1"',
    ):
        assert piece in config, piece
    assert "private_key" not in config and "service_account_impersonation_url" not in config


def test_pool_commands_are_the_roles_commands() -> None:
    for directory, size in (
        (MODULES / "gpu-pool" / "aws", "desired_capacity"),
        (MODULES / "gpu-pool" / "gcp", "target_size"),
    ):
        scope = Scope({"region_name": "eu-west-1", "metrics_port": 9400}, locals_of(directory))
        commands = locals_of(directory)["exec_start"]
        for role in ("relay", "actor"):
            config = "--config /etc/aurora/aurora.toml --region eu-west-1 --metrics-port 9400 --metrics-addr 0.0.0.0"
            assert scope.evaluate(commands[role]) == f"/opt/aurora/venv/bin/aurora {role} {config}"
        trainer = commands["trainer"]
        for piece in (
            "${local.venv}/bin/torchrun",
            f"--nnodes=${{var.{size}}}",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=$${AURORA_RDZV_HOST}:${var.rendezvous_port}",
            "--rdzv-id=${var.run_id}",
            "-m aurora_store.cli train --config ${local.config_path} --metrics-port ${var.metrics_port}"
            " --metrics-addr 0.0.0.0",
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
