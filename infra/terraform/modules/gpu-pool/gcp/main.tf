# A Google Cloud pool of AuroraRL hosts: an instance template (Shielded VM, no public IP,
# optional Spot) and a regional managed instance group, booting the same cloud-init as the AWS
# pool (../templates). Trainer, relay or actors, like the AWS module.

locals {
  config_path = "/etc/aurora/aurora.toml"
  venv        = "/opt/aurora/venv"
  role_extras = { trainer = ["trainer", "gcs"], relay = ["relay", "gcs"], actor = ["actor", "gcs"] }
  extras = distinct(concat(
    var.extras == null ? local.role_extras[var.role] : var.extras,
    ["gcs"],
    var.aws_web_identity == null ? [] : ["s3"],
  ))
  requirement = "${var.aurora_package}[${join(",", local.extras)}]==${var.aurora_version}"
  pip_install = concat(
    ["${local.venv}/bin/pip", "install", "--quiet"],
    var.pip_index_url == null ? [] : ["--index-url", var.pip_index_url],
    [local.requirement],
  )

  # Metrics bind every address (a role binds loopback by default): Prometheus scrapes from
  # monitoring_cidrs, which the firewall rule below alone lets in.
  exec_start = {
    trainer = join(" ", [
      "${local.venv}/bin/torchrun",
      "--nnodes=${var.target_size}",
      "--nproc-per-node=${var.gpus_per_node}",
      "--rdzv-backend=c10d",
      "--rdzv-endpoint=$${AURORA_RDZV_HOST}:${var.rendezvous_port}",
      "--rdzv-id=${var.run_id}",
      "-m aurora_store.cli train --config ${local.config_path} --metrics-port ${var.metrics_port} --metrics-addr 0.0.0.0",
    ])
    relay = "${local.venv}/bin/aurora relay --config ${local.config_path} --region ${var.region_name} --metrics-port ${var.metrics_port} --metrics-addr 0.0.0.0"
    actor = "${local.venv}/bin/aurora actor --config ${local.config_path} --region ${var.region_name} --metrics-port ${var.metrics_port} --metrics-addr 0.0.0.0"
  }

  bootstrap = {
    cloud      = "gcp"
    role       = var.role
    secrets    = var.secrets
    worker_id  = var.role == "actor"
    rendezvous = var.role == "trainer" ? { group = var.name, nodes = var.target_size, timeout_s = var.rendezvous_timeout_s, project = var.project_id, region = var.region } : null
    aws_web_identity = var.aws_web_identity == null ? null : {
      role_arn = var.aws_web_identity.role_arn
      region   = var.aws_web_identity.region
      audience = "sts.amazonaws.com"
    }
  }

  cloud_init = templatefile("${path.module}/../templates/cloud-init.yaml.tftpl", {
    role                = var.role
    region_name         = var.region_name
    aurora_toml_b64     = base64encode(var.aurora_toml)
    bootstrap_json_b64  = base64encode(jsonencode(local.bootstrap))
    bootstrap_py_gz_b64 = base64gzip(file("${path.module}/../templates/aurora-bootstrap.py"))
    exec_start          = local.exec_start[var.role]
    pip_install_json    = jsonencode(local.pip_install)
    refresh_token       = var.aws_web_identity != null
    gcp_credentials     = false # a Google Cloud host reads Cloud Storage as its own service account
    gcp_credentials_b64 = ""
  })

  required_secrets = {
    trainer = ["AURORA_REDIS", "AURORA_SIGNING_KEY"]
    relay   = ["AURORA_REDIS", "AURORA_VERIFY_KEY"]
    actor   = ["AURORA_REDIS", "AURORA_VERIFY_KEY"]
  }
  # Under torchrun every rank serves metrics, on metrics_port plus its local rank.
  metrics_ports = var.role == "trainer" ? "${var.metrics_port}-${var.metrics_port + var.gpus_per_node - 1}" : tostring(var.metrics_port)
  network_tag   = "aurora-${var.name}"
  labels        = merge(var.labels, { aurora-role = var.role, aurora-run = lower(replace(var.run_id, "/[^A-Za-z0-9_-]/", "-")) })
}

resource "google_compute_instance_template" "pool" {
  name_prefix    = "${var.name}-"
  project        = var.project_id
  region         = var.region
  description    = "AuroraRL ${var.role} for region ${var.region_name}"
  machine_type   = var.machine_type
  can_ip_forward = false
  tags           = [local.network_tag]
  labels         = local.labels

  disk {
    source_image = var.image
    boot         = true
    auto_delete  = true
    disk_size_gb = var.boot_disk_gb
    disk_type    = var.boot_disk_type

    dynamic "disk_encryption_key" {
      for_each = var.boot_disk_kms_key == null ? [] : [var.boot_disk_kms_key]
      content {
        kms_key_self_link = disk_encryption_key.value
      }
    }
  }

  # No access_config: no public IP.
  network_interface {
    subnetwork = var.subnetwork
  }

  # The role's own service account; the cloud-platform scope defers to its IAM roles, which
  # iam-roles/gcp keeps to the run's prefix and the role's secrets.
  service_account {
    email  = var.service_account_email
    scopes = ["cloud-platform"]
  }

  metadata = {
    user-data              = local.cloud_init
    block-project-ssh-keys = "true"
    enable-oslogin         = "TRUE"
    serial-port-enable     = "false"
  }

  shielded_instance_config {
    enable_secure_boot          = var.secure_boot
    enable_vtpm                 = true
    enable_integrity_monitoring = true
  }

  dynamic "guest_accelerator" {
    for_each = var.accelerator_count > 0 ? [var.accelerator_type] : []
    content {
      type  = guest_accelerator.value
      count = var.accelerator_count
    }
  }

  scheduling {
    provisioning_model          = var.spot ? "SPOT" : "STANDARD"
    preemptible                 = var.spot
    automatic_restart           = !var.spot
    on_host_maintenance         = "TERMINATE" # GPUs cannot live-migrate; Spot VMs must terminate
    instance_termination_action = var.spot ? "DELETE" : null
  }

  lifecycle {
    create_before_destroy = true

    precondition {
      condition     = alltrue([for s in local.required_secrets[var.role] : contains(keys(var.secrets), s)])
      error_message = "a ${var.role} needs the secrets ${join(", ", local.required_secrets[var.role])}."
    }
    precondition {
      condition     = var.role == "trainer" || !contains(keys(var.secrets), "AURORA_SIGNING_KEY")
      error_message = "only the trainer may be given AURORA_SIGNING_KEY."
    }
    precondition {
      condition     = var.accelerator_count == 0 || var.accelerator_type != null
      error_message = "accelerator_count > 0 needs an accelerator_type."
    }
    precondition {
      condition     = var.aws_web_identity == null || var.role == "relay"
      error_message = "aws_web_identity is for relays (reading an S3 source) only."
    }
  }
}

resource "google_compute_region_instance_group_manager" "pool" {
  name                      = var.name
  project                   = var.project_id
  region                    = var.region
  base_instance_name        = var.name
  distribution_policy_zones = var.zones
  target_size               = var.target_size

  version {
    name              = "primary"
    instance_template = google_compute_instance_template.pool.self_link_unique
  }

  lifecycle {
    precondition {
      condition     = var.role != "trainer" || (var.zones != null && length(coalesce(var.zones, [])) == 1)
      error_message = "a trainer pool runs in exactly one zone (zones = [\"ZONE\"]), for bandwidth between its nodes."
    }
    precondition {
      condition     = var.role != "trainer" || !var.spot
      error_message = "a trainer pool is a fixed torchrun world: no Spot VMs."
    }
  }
}

resource "google_compute_firewall" "metrics" {
  count = var.create_firewall_rules && length(var.monitoring_cidrs) > 0 ? 1 : 0

  name          = "${var.name}-metrics"
  project       = var.project_id
  network       = var.network
  description   = "Prometheus scrapes the AuroraRL ${var.role}'s metrics"
  direction     = "INGRESS"
  source_ranges = var.monitoring_cidrs
  target_tags   = [local.network_tag]

  allow {
    protocol = "tcp"
    ports    = [local.metrics_ports]
  }
}

resource "google_compute_firewall" "trainer_peers" {
  count = var.create_firewall_rules && var.role == "trainer" ? 1 : 0

  name        = "${var.name}-peers"
  project     = var.project_id
  network     = var.network
  description = "AuroraRL trainer nodes to each other (c10d rendezvous, NCCL)"
  direction   = "INGRESS"
  source_tags = [local.network_tag]
  target_tags = [local.network_tag]

  allow {
    protocol = "tcp"
  }
  allow {
    protocol = "udp"
  }
}
