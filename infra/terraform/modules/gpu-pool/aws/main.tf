# An AWS pool of AuroraRL hosts: a launch template (IMDSv2 only, encrypted root volume,
# cloud-init from ../templates) and an autoscaling group with a mixed instances policy.
# The same module makes the trainer (fixed size, torchrun over all nodes), a relay (one CPU
# host) and actor pools (spot welcome).

locals {
  config_path = "/etc/aurora/aurora.toml"
  venv        = "/opt/aurora/venv"
  role_extras = { trainer = ["trainer", "s3"], relay = ["relay", "s3"], actor = ["actor", "s3"] }
  extras = distinct(concat(
    var.extras == null ? local.role_extras[var.role] : var.extras,
    ["s3"],
    var.gcp_credential_config == null ? [] : ["gcs"],
  ))
  requirement = "${var.aurora_package}[${join(",", local.extras)}]==${var.aurora_version}"
  pip_install = concat(
    ["${local.venv}/bin/pip", "install", "--quiet"],
    var.pip_index_url == null ? [] : ["--index-url", var.pip_index_url],
    [local.requirement],
  )

  # The role's command line. $${AURORA_RDZV_HOST} reaches the unit as ${AURORA_RDZV_HOST}, which
  # systemd fills in from /run/aurora/env (aurora-bootstrap wrote the lowest node's IP there).
  # Metrics bind every address (a role binds loopback by default): Prometheus scrapes from
  # monitoring_cidrs, which the security group below alone lets in.
  exec_start = {
    trainer = join(" ", [
      "${local.venv}/bin/torchrun",
      "--nnodes=${var.desired_capacity}",
      "--nproc-per-node=${var.gpus_per_node}",
      "--rdzv-backend=c10d",
      "--rdzv-endpoint=$${AURORA_RDZV_HOST}:${var.rendezvous_port}",
      "--rdzv-id=${var.run_id}",
      "-m aurora_store.cli train --config ${local.config_path} --metrics-port ${var.metrics_port} --metrics-addr 0.0.0.0",
    ])
    relay = "${local.venv}/bin/aurora relay --config ${local.config_path} --region ${var.region_name} --metrics-port ${var.metrics_port} --metrics-addr 0.0.0.0"
    actor = "${local.venv}/bin/aurora actor --config ${local.config_path} --region ${var.region_name} --metrics-port ${var.metrics_port} --metrics-addr 0.0.0.0"
  }

  # Names of secrets and how to find the rendezvous peers: nothing secret.
  bootstrap = {
    cloud            = "aws"
    role             = var.role
    secrets          = var.secrets
    worker_id        = var.role == "actor"
    rendezvous       = var.role == "trainer" ? { group = var.name, nodes = var.desired_capacity, timeout_s = var.rendezvous_timeout_s } : null
    aws_web_identity = null
  }

  cloud_init = templatefile("${path.module}/../templates/cloud-init.yaml.tftpl", {
    role                = var.role
    region_name         = var.region_name
    aurora_toml_b64     = base64encode(var.aurora_toml)
    bootstrap_json_b64  = base64encode(jsonencode(local.bootstrap))
    bootstrap_py_gz_b64 = base64gzip(file("${path.module}/../templates/aurora-bootstrap.py"))
    exec_start          = local.exec_start[var.role]
    pip_install_json    = jsonencode(local.pip_install)
    refresh_token       = false
    gcp_credentials     = var.gcp_credential_config != null
    gcp_credentials_b64 = var.gcp_credential_config == null ? "" : base64encode(var.gcp_credential_config)
  })

  required_secrets = {
    trainer = ["AURORA_REDIS", "AURORA_SIGNING_KEY"]
    relay   = ["AURORA_REDIS", "AURORA_VERIFY_KEY"]
    actor   = ["AURORA_REDIS", "AURORA_VERIFY_KEY"]
  }
  tags = merge(var.tags, { "aurora:role" = var.role, "aurora:region" = var.region_name, "aurora:run" = var.run_id })
  # Under torchrun every rank serves metrics, on metrics_port plus its local rank.
  metrics_ports = var.role == "trainer" ? var.gpus_per_node : 1
}

resource "aws_security_group" "pool" {
  name        = var.name
  description = "AuroraRL ${var.role} pool ${var.name}: metrics in from monitoring; HTTPS and Redis out"
  vpc_id      = var.vpc_id
  tags        = local.tags
}

resource "aws_vpc_security_group_ingress_rule" "metrics" {
  for_each = toset(var.monitoring_cidrs)

  security_group_id = aws_security_group.pool.id
  description       = "Prometheus scrapes the ${var.role}'s metrics from ${each.value}"
  cidr_ipv4         = each.value
  ip_protocol       = "tcp"
  from_port         = var.metrics_port
  to_port           = var.metrics_port + local.metrics_ports - 1
}

# The trainer's nodes talk to each other on any port: c10d rendezvous, then NCCL's sockets.
resource "aws_vpc_security_group_ingress_rule" "trainer_peers" {
  count = var.role == "trainer" ? 1 : 0

  security_group_id            = aws_security_group.pool.id
  description                  = "Trainer nodes to each other (rendezvous, NCCL)"
  referenced_security_group_id = aws_security_group.pool.id
  ip_protocol                  = "-1"
}

resource "aws_vpc_security_group_egress_rule" "trainer_peers" {
  count = var.role == "trainer" ? 1 : 0

  security_group_id            = aws_security_group.pool.id
  description                  = "Trainer nodes to each other (rendezvous, NCCL)"
  referenced_security_group_id = aws_security_group.pool.id
  ip_protocol                  = "-1"
}

resource "aws_vpc_security_group_egress_rule" "https" {
  for_each = toset(var.egress_cidrs)

  security_group_id = aws_security_group.pool.id
  description       = "HTTPS to S3, Secrets Manager, STS and the package index"
  cidr_ipv4         = each.value
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
}

resource "aws_vpc_security_group_egress_rule" "http" {
  for_each = var.allow_http_egress ? toset(var.egress_cidrs) : toset([])

  security_group_id = aws_security_group.pool.id
  description       = "HTTP to the OS package mirrors (cloud-init installs python3-venv)"
  cidr_ipv4         = each.value
  ip_protocol       = "tcp"
  from_port         = 80
  to_port           = 80
}

resource "aws_vpc_security_group_egress_rule" "redis" {
  for_each = toset(var.redis_cidrs)

  security_group_id = aws_security_group.pool.id
  description       = "Redis (TLS) of the run's coordinator"
  cidr_ipv4         = each.value
  ip_protocol       = "tcp"
  from_port         = var.redis_port
  to_port           = var.redis_port
}

resource "aws_placement_group" "cluster" {
  count = var.cluster_placement ? 1 : 0

  name     = var.name
  strategy = "cluster"
  tags     = local.tags
}

resource "aws_launch_template" "pool" {
  name_prefix            = "${var.name}-"
  description            = "AuroraRL ${var.role} for region ${var.region_name}"
  image_id               = var.ami_id
  instance_type          = var.instance_types[0]
  update_default_version = true
  ebs_optimized          = true
  vpc_security_group_ids = [aws_security_group.pool.id]
  # gzip: cloud-init unpacks it, and it keeps the user data far below EC2's 16 KiB limit.
  user_data = base64gzip(local.cloud_init)

  iam_instance_profile {
    name = var.instance_profile
  }

  # IMDSv2 only, one hop: a container on the host cannot reach the instance's credentials.
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
    instance_metadata_tags      = "disabled"
  }

  block_device_mappings {
    device_name = var.root_device_name
    ebs {
      volume_size           = var.root_volume_gb
      volume_type           = "gp3"
      encrypted             = true
      kms_key_id            = var.ebs_kms_key_arn
      delete_on_termination = true
    }
  }

  monitoring {
    enabled = true
  }

  tag_specifications {
    resource_type = "instance"
    tags          = merge(local.tags, { Name = var.name })
  }

  tag_specifications {
    resource_type = "volume"
    tags          = merge(local.tags, { Name = var.name })
  }

  tags = local.tags

  lifecycle {
    precondition {
      condition     = alltrue([for s in local.required_secrets[var.role] : contains(keys(var.secrets), s)])
      error_message = "a ${var.role} needs the secrets ${join(", ", local.required_secrets[var.role])}."
    }
    precondition {
      condition     = var.role == "trainer" || !contains(keys(var.secrets), "AURORA_SIGNING_KEY")
      error_message = "only the trainer may be given AURORA_SIGNING_KEY."
    }
  }
}

resource "aws_autoscaling_group" "pool" {
  name                = var.name
  min_size            = var.min_size
  max_size            = var.max_size
  desired_capacity    = var.desired_capacity
  vpc_zone_identifier = var.subnet_ids
  placement_group     = one(aws_placement_group.cluster[*].id)
  health_check_type   = "EC2"
  # Replace a spot instance before it is reclaimed when EC2 warns of it; not for the trainer,
  # whose nodes are a fixed torchrun world.
  capacity_rebalance = var.role != "trainer"

  mixed_instances_policy {
    instances_distribution {
      on_demand_base_capacity                  = var.on_demand_base_capacity
      on_demand_percentage_above_base_capacity = var.on_demand_percentage_above_base_capacity
      spot_allocation_strategy                 = var.spot_allocation_strategy
    }

    launch_template {
      launch_template_specification {
        launch_template_id = aws_launch_template.pool.id
        version            = aws_launch_template.pool.latest_version
      }

      dynamic "override" {
        for_each = var.instance_types
        content {
          instance_type = override.value
        }
      }
    }
  }

  dynamic "tag" {
    for_each = merge(local.tags, { Name = var.name })
    content {
      key                 = tag.key
      value               = tag.value
      propagate_at_launch = true
    }
  }

  lifecycle {
    precondition {
      condition     = var.min_size <= var.desired_capacity && var.desired_capacity <= var.max_size
      error_message = "need min_size <= desired_capacity <= max_size."
    }
    precondition {
      condition     = var.role != "trainer" || (var.min_size == var.max_size && var.max_size == var.desired_capacity)
      error_message = "a trainer pool has a fixed size (min_size = max_size = desired_capacity = the number of torchrun nodes)."
    }
    precondition {
      condition     = var.role != "trainer" || length(var.subnet_ids) == 1
      error_message = "a trainer pool launches into one subnet (one availability zone)."
    }
  }
}
