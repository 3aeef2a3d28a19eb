# The run's coordinator: an ElastiCache replication group (Redis OSS or Valkey) in the home
# region, TLS in transit, KMS at rest, AUTH on, two nodes with automatic failover. The full
# rediss:// URL (with the AUTH token) goes into Secrets Manager: that secret is what the roles
# read as AURORA_REDIS; the token appears nowhere else (Terraform state aside).

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}

locals {
  kms_key_arn = var.kms_key_arn != null ? var.kms_key_arn : aws_kms_key.redis[0].arn
  redis_url   = "rediss://:${random_password.auth.result}@${aws_elasticache_replication_group.this.primary_endpoint_address}:${var.port}/${var.database}"
}

resource "aws_kms_key" "redis" {
  count = var.kms_key_arn == null ? 1 : 0

  description             = "AuroraRL coordinator ${var.name}: ElastiCache at rest and its URL secret"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid       = "AccountIamPoliciesDecide"
      Effect    = "Allow"
      Principal = { AWS = "arn:${data.aws_partition.current.partition}:iam::${data.aws_caller_identity.current.account_id}:root" }
      Action    = "kms:*"
      Resource  = "*"
    }]
  })
  tags = var.tags
}

# ElastiCache AUTH tokens: 16-128 printable characters, no '@', '"' or '/'. Letters and digits
# only, so the token is also safe inside a URL and an EnvironmentFile without any escaping.
resource "random_password" "auth" {
  length  = 64
  special = false
}

resource "aws_elasticache_subnet_group" "this" {
  name        = var.name
  description = "AuroraRL coordinator ${var.name}"
  subnet_ids  = var.subnet_ids
  tags        = var.tags
}

resource "aws_security_group" "redis" {
  name        = "${var.name}-redis"
  description = "AuroraRL coordinator ${var.name}: Redis (TLS) from the pools' CIDRs only"
  vpc_id      = var.vpc_id
  tags        = var.tags
}

resource "aws_vpc_security_group_ingress_rule" "redis" {
  for_each = toset(var.allowed_cidrs)

  security_group_id = aws_security_group.redis.id
  description       = "Redis TLS from ${each.value} (a pool's network, local or over peering/TGW/VPN)"
  cidr_ipv4         = each.value
  ip_protocol       = "tcp"
  from_port         = var.port
  to_port           = var.port
}

# Leases, jobs and results must never be evicted to make room: a Redis that is full should
# refuse writes (the roles log, count and retry) rather than silently drop a lease.
resource "aws_elasticache_parameter_group" "this" {
  name        = var.name
  family      = var.parameter_group_family
  description = "AuroraRL coordinator ${var.name}: never evict keys"

  parameter {
    name  = "maxmemory-policy"
    value = "noeviction"
  }

  tags = var.tags
}

resource "aws_elasticache_replication_group" "this" {
  replication_group_id = var.name
  description          = "AuroraRL coordinator ${var.name}"

  engine               = var.engine
  engine_version       = var.engine_version
  node_type            = var.node_type
  port                 = var.port
  parameter_group_name = aws_elasticache_parameter_group.this.name

  num_cache_clusters         = 2
  automatic_failover_enabled = true
  multi_az_enabled           = true

  subnet_group_name  = aws_elasticache_subnet_group.this.name
  security_group_ids = [aws_security_group.redis.id]

  at_rest_encryption_enabled = true
  kms_key_id                 = local.kms_key_arn
  transit_encryption_enabled = true
  transit_encryption_mode    = "required"
  auth_token                 = random_password.auth.result

  snapshot_retention_limit   = var.snapshot_retention_days
  snapshot_window            = var.snapshot_window
  maintenance_window         = var.maintenance_window
  auto_minor_version_upgrade = true
  apply_immediately          = false

  tags = var.tags
}

resource "aws_secretsmanager_secret" "redis_url" {
  #checkov:skip=CKV2_AWS_57:Rotating the AUTH token is an ElastiCache operation (auth_token_update_strategy ROTATE, then SET), followed by a new secret version and a restart of every role; no Lambda rotation is wired here.
  name                    = "${var.name}/redis-url"
  description             = "AURORA_REDIS for AuroraRL coordinator ${var.name}: the full rediss:// URL with the AUTH token"
  kms_key_id              = local.kms_key_arn
  recovery_window_in_days = var.secret_recovery_window_days
  tags                    = var.tags
}

resource "aws_secretsmanager_secret_version" "redis_url" {
  secret_id     = aws_secretsmanager_secret.redis_url.id
  secret_string = local.redis_url
}
