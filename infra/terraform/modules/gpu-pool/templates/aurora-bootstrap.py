#!/opt/aurora/venv/bin/python
"""aurora-bootstrap: what an AuroraRL host does before its role starts (systemd ExecStartPre).

Reads /etc/aurora/bootstrap.json (written by cloud-init; it holds the NAMES of secrets, never
their values), fetches each secret from the cloud's secret store with the host's own identity
(EC2 instance profile, or GCE service account), and writes them to /run/aurora/env (tmpfs,
mode 0600, root), which systemd passes to the role as environment variables. Also adds
AURORA_WORKER_ID (the instance id or name), the torchrun rendezvous host for a trainer, and,
for a Google Cloud relay whose source is on S3, the web identity settings botocore uses to
assume its AWS role (`aurora-bootstrap --refresh-token` renews the token from a timer).

Runs at every start of the role, so a restarted role always gets the current secret versions.
Standard library only on Google Cloud; boto3 (installed with aurora-rl[s3]) on AWS.
Never prints a secret value.
"""

from __future__ import annotations

import base64
import functools
import ipaddress
import json
import os
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

CONF = "/etc/aurora/bootstrap.json"
RUN_DIR = "/run/aurora"
ENV_FILE = f"{RUN_DIR}/env"
TOKEN_FILE = f"{RUN_DIR}/aws-web-identity-token"
ALLOWED = {"AURORA_REDIS", "AURORA_SIGNING_KEY", "AURORA_VERIFY_KEY"}
AWS_IMDS = "http://169.254.169.254/latest"
GCE_METADATA = "http://metadata.google.internal/computeMetadata/v1"


def log(message: str) -> None:
    print(f"aurora-bootstrap: {message}", file=sys.stderr, flush=True)


def http(url: str, *, method: str = "GET", headers: dict[str, str] | None = None, timeout: float = 10.0) -> bytes:
    request = urllib.request.Request(url, method=method, headers=headers or {})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return bytes(response.read())


def retry(what: str, fn: Callable[[], T], *, attempts: int = 10) -> T:
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as exc:  # a transient metadata or API error at boot: try again, then fail the unit
            if attempt == attempts:
                raise SystemExit(f"aurora-bootstrap: {what} failed: {type(exc).__name__}: {exc}") from None
            log(f"{what}: {type(exc).__name__}; retrying ({attempt}/{attempts})")
            time.sleep(min(2**attempt, 30))
    raise AssertionError("unreachable")


# --- AWS ------------------------------------------------------------------------------------


def aws_imds(path: str) -> str:
    token = http(
        f"{AWS_IMDS}/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"}
    ).decode()
    return http(f"{AWS_IMDS}/{path}", headers={"X-aws-ec2-metadata-token": token}).decode()


def aws_secret(arn: str) -> str:
    import boto3  # from aurora-rl[s3], in the same venv

    region = arn.split(":")[3]
    client = boto3.client("secretsmanager", region_name=region)
    return str(client.get_secret_value(SecretId=arn)["SecretString"])


def aws_rendezvous_ips(conf: dict[str, Any]) -> list[str]:
    import boto3

    region = aws_imds("meta-data/placement/region")
    groups = boto3.client("autoscaling", region_name=region).describe_auto_scaling_groups(
        AutoScalingGroupNames=[conf["group"]]
    )["AutoScalingGroups"]
    ids = [i["InstanceId"] for g in groups for i in g["Instances"] if i["LifecycleState"] == "InService"]
    if not ids:
        return []
    ips = []
    for page in boto3.client("ec2", region_name=region).get_paginator("describe_instances").paginate(InstanceIds=ids):
        for reservation in page["Reservations"]:
            for instance in reservation["Instances"]:
                if instance["State"]["Name"] == "running" and instance.get("PrivateIpAddress"):
                    ips.append(instance["PrivateIpAddress"])
    return ips


# --- Google Cloud ---------------------------------------------------------------------------


def gce_metadata(path: str) -> str:
    return http(f"{GCE_METADATA}/{path}", headers={"Metadata-Flavor": "Google"}).decode()


def gce_access_token() -> str:
    return str(json.loads(gce_metadata("instance/service-accounts/default/token"))["access_token"])


def gcp_api(url: str, *, method: str = "GET") -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {gce_access_token()}"}
    data: dict[str, Any] = json.loads(http(url, method=method, headers=headers))
    return data


def gcp_secret(name: str) -> str:
    data = gcp_api(f"https://secretmanager.googleapis.com/v1/{name}/versions/latest:access")
    return base64.b64decode(data["payload"]["data"]).decode("utf-8")


def gcp_rendezvous_ips(conf: dict[str, Any]) -> list[str]:
    base = f"https://compute.googleapis.com/compute/v1/projects/{conf['project']}/regions/{conf['region']}"
    listed = gcp_api(f"{base}/instanceGroupManagers/{conf['group']}/listManagedInstances", method="POST")
    ips = []
    for managed in listed.get("managedInstances", []):
        if managed.get("instanceStatus") != "RUNNING":
            continue
        instance = gcp_api(managed["instance"])
        ip = instance.get("networkInterfaces", [{}])[0].get("networkIP")
        if ip:
            ips.append(ip)
    return ips


def gcp_write_token(audience: str) -> None:
    """A fresh Google-signed identity token for AssumeRoleWithWebIdentity (valid for an hour)."""
    query = urllib.parse.urlencode({"audience": audience, "format": "full"})
    token = gce_metadata(f"instance/service-accounts/default/identity?{query}")
    write_private(TOKEN_FILE, token, owner="aurora")


# --- common ---------------------------------------------------------------------------------


def write_private(path: str, text: str, *, owner: str | None = None) -> None:
    """Write `text` to `path` atomically, mode 0600 (owned by root, or by `owner`)."""
    os.makedirs(RUN_DIR, mode=0o711, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    if owner is not None:
        import pwd

        entry = pwd.getpwnam(owner)
        os.chown(tmp, entry.pw_uid, entry.pw_gid)
    os.replace(tmp, path)


def env_line(name: str, value: str) -> str:
    """NAME='value' as systemd's EnvironmentFile reads it: a single-quoted value may span lines
    (PEM keys do) and is taken verbatim, so it may hold anything but a single quote."""
    if "'" in value or "\x00" in value:
        raise SystemExit(f"aurora-bootstrap: {name} holds a single quote or NUL, which an EnvironmentFile cannot carry")
    return f"{name}='{value.strip()}'"


def rendezvous_host(conf: dict[str, Any], cloud: str) -> str:
    """The lowest private IP of the pool once all `nodes` instances run: every node computes the
    same answer, and that node hosts torchrun's c10d store."""
    find = aws_rendezvous_ips if cloud == "aws" else gcp_rendezvous_ips
    deadline = time.monotonic() + float(conf.get("timeout_s", 900))
    while True:
        ips = retry("listing the trainer pool", lambda: find(conf))
        if len(ips) >= int(conf["nodes"]):
            return str(min(ipaddress.ip_address(ip) for ip in ips))
        if time.monotonic() > deadline:
            raise SystemExit(f"aurora-bootstrap: only {len(ips)} of {conf['nodes']} trainer nodes running; giving up")
        log(f"{len(ips)} of {conf['nodes']} trainer nodes running; waiting")
        time.sleep(10)


def main(argv: list[str]) -> int:
    with open(CONF, encoding="utf-8") as f:
        conf = json.load(f)
    cloud = conf["cloud"]
    identity = conf.get("aws_web_identity")

    if argv[1:] == ["--refresh-token"]:
        if identity:
            retry("fetching the identity token", lambda: gcp_write_token(identity["audience"]))
        return 0

    lines = []
    for name, ref in sorted(conf["secrets"].items()):
        if name not in ALLOWED:
            raise SystemExit(f"aurora-bootstrap: {name} is not an AuroraRL secret variable")
        read = aws_secret if cloud == "aws" else gcp_secret
        value = retry(f"reading {name}", functools.partial(read, ref))
        lines.append(env_line(name, value))
        log(f"{name}: read from {ref}")

    if conf.get("worker_id"):
        worker = retry(
            "reading the instance id",
            lambda: aws_imds("meta-data/instance-id") if cloud == "aws" else gce_metadata("instance/name"),
        )
        lines.append(f"AURORA_WORKER_ID={worker.strip()}")

    if conf.get("rendezvous"):
        lines.append(f"AURORA_RDZV_HOST={rendezvous_host(conf['rendezvous'], cloud)}")

    if identity:
        retry("fetching the identity token", lambda: gcp_write_token(identity["audience"]))
        lines.append(f"AWS_ROLE_ARN={identity['role_arn']}")
        lines.append(f"AWS_WEB_IDENTITY_TOKEN_FILE={TOKEN_FILE}")
        lines.append(f"AWS_ROLE_SESSION_NAME=aurora-{conf['role']}")
        lines.append(f"AWS_DEFAULT_REGION={identity['region']}")

    write_private(ENV_FILE, "\n".join(lines) + "\n")
    log(f"wrote {ENV_FILE} ({len(lines)} variables)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
