# A run over four regions: the home region on AWS (trainer, Redis, secrets, its bucket) and
# three rollout regions (two on AWS, one on Google Cloud), each with its bucket, a relay and an
# actor pool. Buckets, IAM and secrets here; pools in pools.tf; the config file in config.tf.

locals {
  run_prefix   = "runs/${var.run_id}"
  aws_rollout  = [var.aws_region_a, var.aws_region_b]
  rollout      = concat(local.aws_rollout, [var.gcp_region])
  all_regions  = concat([var.home_region], local.rollout)
  sources      = { for r in local.rollout : r => lookup(var.relay_sources, r, var.home_region) }
  bucket_names = { for r in local.all_regions : r => "${var.name_prefix}-${r}" }
  # Every pool's network may reach Redis (the rollout regions over peering, TGW or VPN).
  pool_cidrs = distinct(concat([for r in [var.home_region, var.aws_region_a, var.aws_region_b] : var.aws_networks[r].vpc_cidr], [var.gcp_network.cidr]))
}

# --- buckets: one per region, the run under runs/RUN_ID/ ---------------------------------------

module "bucket_home" {
  source    = "../../modules/aws-region-bucket"
  providers = { aws = aws.home }

  name          = local.bucket_names[var.home_region]
  force_destroy = var.force_destroy_buckets
  # the run's offloaded result payloads (results/) expire; nothing else does
  run_prefixes = [local.run_prefix]
}

module "bucket_a" {
  source    = "../../modules/aws-region-bucket"
  providers = { aws = aws.rollout_a }

  name          = local.bucket_names[var.aws_region_a]
  force_destroy = var.force_destroy_buckets
  # the run's offloaded result payloads (results/) expire; nothing else does
  run_prefixes = [local.run_prefix]
}

module "bucket_b" {
  source    = "../../modules/aws-region-bucket"
  providers = { aws = aws.rollout_b }

  name          = local.bucket_names[var.aws_region_b]
  force_destroy = var.force_destroy_buckets
  # the run's offloaded result payloads (results/) expire; nothing else does
  run_prefixes = [local.run_prefix]
}

module "bucket_gcp" {
  source = "../../modules/gcs-region-bucket"

  name          = local.bucket_names[var.gcp_region]
  project_id    = var.gcp_project
  location      = var.gcp_region
  force_destroy = var.force_destroy_buckets
  # the run's offloaded result payloads (results/) expire; nothing else does
  run_prefixes = [local.run_prefix]
}

locals {
  aws_buckets = {
    (var.home_region)  = { bucket_arn = module.bucket_home.bucket_arn, kms_key_arn = module.bucket_home.kms_key_arn, aws_region = var.home_region }
    (var.aws_region_a) = { bucket_arn = module.bucket_a.bucket_arn, kms_key_arn = module.bucket_a.kms_key_arn, aws_region = var.aws_region_a }
    (var.aws_region_b) = { bucket_arn = module.bucket_b.bucket_arn, kms_key_arn = module.bucket_b.kms_key_arn, aws_region = var.aws_region_b }
  }
}

# --- secrets (home region): their values never reach user data -------------------------------

resource "aws_kms_key" "secrets" {
  provider = aws.home

  description             = "AuroraRL ${var.run_id}: Secrets Manager secrets and Redis at rest"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid       = "AccountIamPoliciesDecide"
      Effect    = "Allow"
      Principal = { AWS = "arn:${data.aws_partition.home.partition}:iam::${data.aws_caller_identity.home.account_id}:root" }
      Action    = "kms:*"
      Resource  = "*"
    }]
  })
}

data "aws_caller_identity" "home" {
  provider = aws.home
}

data "aws_partition" "home" {
  provider = aws.home
}

# The trainer's private key: the secret is made here, its value is put by you (README) so that
# it never enters Terraform's state. Until then the trainer's start fails and systemd retries.
resource "aws_secretsmanager_secret" "signing_key" {
  #checkov:skip=CKV2_AWS_57:A run's signing key is fixed at version 0 (docs/SECURITY.md): rotating it means starting a new run, not a Lambda rotation.
  provider = aws.home

  name                    = "${var.name_prefix}/${var.run_id}/signing-key"
  description             = "AURORA_SIGNING_KEY for AuroraRL run ${var.run_id}: the trainer's Ed25519 private key (PEM)"
  kms_key_id              = aws_kms_key.secrets.arn
  recovery_window_in_days = 7
}

resource "aws_secretsmanager_secret" "verify_key" {
  #checkov:skip=CKV2_AWS_57:The public verify key is fixed at version 0 with the signing key (docs/SECURITY.md); there is nothing to rotate within a run.
  provider = aws.home

  name                    = "${var.name_prefix}/${var.run_id}/verify-key"
  description             = "AURORA_VERIFY_KEY for AuroraRL run ${var.run_id}: the trainer's public key (PEM)"
  kms_key_id              = aws_kms_key.secrets.arn
  recovery_window_in_days = 7
}

resource "aws_secretsmanager_secret_version" "verify_key" {
  provider = aws.home

  secret_id     = aws_secretsmanager_secret.verify_key.id
  secret_string = var.verify_key_pem
}

# --- the coordinator ------------------------------------------------------------------------

module "redis" {
  source    = "../../modules/redis"
  providers = { aws = aws.home }

  name          = "${var.name_prefix}-${var.run_id}"
  vpc_id        = var.aws_networks[var.home_region].vpc_id
  subnet_ids    = var.aws_networks[var.home_region].subnet_ids
  allowed_cidrs = local.pool_cidrs
  kms_key_arn   = aws_kms_key.secrets.arn
}

# The GCP pools read their secrets from Secret Manager in their own project: copies of the
# Redis URL and of the public key, readable by exactly the accounts iam-roles/gcp names.
resource "google_secret_manager_secret" "redis_url" {
  project   = var.gcp_project
  secret_id = "${var.name_prefix}-${var.run_id}-redis-url"

  replication {
    user_managed {
      replicas {
        location = var.gcp_region
      }
    }
  }
}

resource "google_secret_manager_secret_version" "redis_url" {
  secret      = google_secret_manager_secret.redis_url.id
  secret_data = module.redis.redis_url
}

resource "google_secret_manager_secret" "verify_key" {
  project   = var.gcp_project
  secret_id = "${var.name_prefix}-${var.run_id}-verify-key"

  replication {
    user_managed {
      replicas {
        location = var.gcp_region
      }
    }
  }
}

resource "google_secret_manager_secret_version" "verify_key" {
  secret      = google_secret_manager_secret.verify_key.id
  secret_data = var.verify_key_pem
}

# --- identities -------------------------------------------------------------------------------

module "iam_gcp" {
  source = "../../modules/iam-roles/gcp"

  project_id    = var.gcp_project
  name_prefix   = var.name_prefix
  run_prefix    = local.run_prefix
  buckets       = { (var.gcp_region) = module.bucket_gcp.bucket }
  relays        = { (var.gcp_region) = { source = local.sources[var.gcp_region] } }
  actor_regions = [var.gcp_region]
  # The trainer (on AWS) reads the GCP actors' offloaded results with its own AWS role, federated.
  aws_trainer = {
    account_id = data.aws_caller_identity.home.account_id
    role_name  = module.iam_aws.trainer_role_name
  }
  secrets = {
    redis      = google_secret_manager_secret.redis_url.id
    verify_key = google_secret_manager_secret.verify_key.id
  }
}

module "iam_aws" {
  source    = "../../modules/iam-roles/aws"
  providers = { aws = aws.home }

  name_prefix   = "${var.name_prefix}-${var.run_id}"
  run_prefix    = local.run_prefix
  buckets       = local.aws_buckets
  home_region   = var.home_region
  relays        = { for r in local.aws_rollout : r => { source = local.sources[r] } }
  actor_regions = local.aws_rollout
  # The GCP relay reads its source on S3 with its Google identity: no AWS keys on GCP.
  gcp_relays = {
    (var.gcp_region) = {
      source                    = local.sources[var.gcp_region]
      service_account_unique_id = module.iam_gcp.relay_unique_ids[var.gcp_region]
    }
  }
  secrets = {
    redis_arn       = module.redis.secret_arn
    verify_key_arn  = aws_secretsmanager_secret.verify_key.arn
    signing_key_arn = aws_secretsmanager_secret.signing_key.arn
    kms_key_arn     = aws_kms_key.secrets.arn
  }
}
