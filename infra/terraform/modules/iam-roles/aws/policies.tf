# What each role may do, one policy document per role. Object permissions name the run prefix
# (PREFIX and PREFIX/*, the second for objects, the first because fsspec asks for the prefix
# itself when it checks that a run exists); listing is scoped with the s3:prefix condition.
# Statements reference plain inputs only (no functions), so tests/test_terraform.py can evaluate
# every role's resources for sample inputs and check them.

locals {
  # Secrets Manager calls KMS for the secrets; this pins their key's use to that service.
  secrets_via_service = "secretsmanager.${split(":", var.secrets.redis_arn)[3]}.amazonaws.com"
  reader_secrets      = [var.secrets.redis_arn, var.secrets.verify_key_arn]
}

data "aws_iam_policy_document" "trainer" {
  count = var.home_region == null ? 0 : 1

  lifecycle {
    precondition {
      condition     = contains(keys(var.buckets), coalesce(var.home_region, "-")) && var.secrets.signing_key_arn != null
      error_message = "home_region must be a key of buckets, and secrets.signing_key_arn must be set: the trainer signs every version."
    }
  }

  statement {
    sid       = "ListHomeRunPrefix"
    actions   = ["s3:ListBucket"]
    resources = [var.buckets[var.home_region].bucket_arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = [var.run_prefix, "${var.run_prefix}/*"]
    }
  }

  statement {
    sid       = "ReadHomeRun"
    actions   = ["s3:GetObject"]
    resources = ["${var.buckets[var.home_region].bucket_arn}/${var.run_prefix}", "${var.buckets[var.home_region].bucket_arn}/${var.run_prefix}/*"]
  }

  statement {
    sid       = "WriteHomeRun"
    actions   = ["s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"]
    resources = ["${var.buckets[var.home_region].bucket_arn}/${var.run_prefix}/*"]
  }

  # Rollout results too large for Redis are offloaded by each actor to its own region's bucket
  # (RUN_PREFIX/results/<sha256>.bin); the trainer reads each once, when it admits the result.
  # Read only, and only results/: nothing else of another region's bucket.
  dynamic "statement" {
    for_each = var.buckets
    content {
      actions   = ["s3:GetObject"]
      resources = ["${statement.value.bucket_arn}/${var.run_prefix}/results/*"]
    }
  }

  dynamic "statement" {
    for_each = var.buckets
    content {
      actions   = ["kms:Decrypt"]
      resources = [statement.value.kms_key_arn]
      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = ["s3.${statement.value.aws_region}.amazonaws.com"]
      }
    }
  }

  dynamic "statement" {
    for_each = var.trainer_can_delete ? ["DeleteHomeRun"] : []
    content {
      sid       = statement.value
      actions   = ["s3:DeleteObject"]
      resources = ["${var.buckets[var.home_region].bucket_arn}/${var.run_prefix}/*"]
    }
  }

  statement {
    sid       = "HomeBucketKey"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [var.buckets[var.home_region].kms_key_arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["s3.${var.buckets[var.home_region].aws_region}.amazonaws.com"]
    }
  }

  statement {
    sid       = "ReadTrainerSecrets"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [var.secrets.redis_arn, var.secrets.signing_key_arn]
  }

  statement {
    sid       = "SecretsKey"
    actions   = ["kms:Decrypt"]
    resources = [var.secrets.kms_key_arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = [local.secrets_via_service]
    }
  }

  dynamic "statement" {
    for_each = var.trainer_discovery ? ["FindRendezvousHost"] : []
    content {
      sid = statement.value
      # Read-only Describe calls, which IAM cannot scope to one group: every node lists its
      # autoscaling group's instances and takes the lowest private IP as the c10d host.
      actions   = ["autoscaling:DescribeAutoScalingGroups", "ec2:DescribeInstances"]
      resources = ["*"]
    }
  }
}

data "aws_iam_policy_document" "relay" {
  for_each = var.relays

  lifecycle {
    precondition {
      condition     = contains(keys(var.buckets), each.key) && contains(keys(var.buckets), each.value.source) && each.key != each.value.source
      error_message = "relay ${each.key}: both its region and its source (${each.value.source}) must be keys of buckets, and differ."
    }
  }

  statement {
    sid       = "ListSourceRunPrefix"
    actions   = ["s3:ListBucket"]
    resources = [var.buckets[each.value.source].bucket_arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = [var.run_prefix, "${var.run_prefix}/*"]
    }
  }

  statement {
    sid       = "ReadSourceRun"
    actions   = ["s3:GetObject"]
    resources = ["${var.buckets[each.value.source].bucket_arn}/${var.run_prefix}", "${var.buckets[each.value.source].bucket_arn}/${var.run_prefix}/*"]
  }

  statement {
    sid       = "ListOwnRunPrefix"
    actions   = ["s3:ListBucket"]
    resources = [var.buckets[each.key].bucket_arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = [var.run_prefix, "${var.run_prefix}/*"]
    }
  }

  # The relay reads back what it wrote (to verify it) and skips what is already there.
  statement {
    sid       = "ReadOwnRun"
    actions   = ["s3:GetObject"]
    resources = ["${var.buckets[each.key].bucket_arn}/${var.run_prefix}", "${var.buckets[each.key].bucket_arn}/${var.run_prefix}/*"]
  }

  # Put-if-absent only: no s3:DeleteObject. On an object store a relay leaves no temporaries
  # (.tmp-* files exist only on local disks), and an upload it abandons is aborted, not deleted.
  statement {
    sid       = "WriteOwnRun"
    actions   = ["s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"]
    resources = ["${var.buckets[each.key].bucket_arn}/${var.run_prefix}/*"]
  }

  statement {
    sid       = "SourceBucketKey"
    actions   = ["kms:Decrypt"]
    resources = [var.buckets[each.value.source].kms_key_arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["s3.${var.buckets[each.value.source].aws_region}.amazonaws.com"]
    }
  }

  statement {
    sid       = "OwnBucketKey"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [var.buckets[each.key].kms_key_arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["s3.${var.buckets[each.key].aws_region}.amazonaws.com"]
    }
  }

  statement {
    sid       = "ReadRelaySecrets"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = local.reader_secrets
  }

  statement {
    sid       = "SecretsKey"
    actions   = ["kms:Decrypt"]
    resources = [var.secrets.kms_key_arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = [local.secrets_via_service]
    }
  }
}

data "aws_iam_policy_document" "actor" {
  for_each = var.actor_regions

  lifecycle {
    precondition {
      condition     = contains(keys(var.buckets), each.key)
      error_message = "actor region ${each.key} must be a key of buckets."
    }
  }

  statement {
    sid       = "ListRegionRunPrefix"
    actions   = ["s3:ListBucket"]
    resources = [var.buckets[each.key].bucket_arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = [var.run_prefix, "${var.run_prefix}/*"]
    }
  }

  # Its own region only: no other region's bucket.
  statement {
    sid       = "ReadRegionRun"
    actions   = ["s3:GetObject"]
    resources = ["${var.buckets[each.key].bucket_arn}/${var.run_prefix}", "${var.buckets[each.key].bucket_arn}/${var.run_prefix}/*"]
  }

  # The one write: a rollout result too large for Redis, as RUN_PREFIX/results/<sha256>.bin,
  # put-if-absent (the bucket policy refuses any put without If-None-Match: *, so no actor can
  # replace a payload, let alone a version). A payload is at most 64 MiB, one PutObject: no
  # multipart actions. No delete: results expire by the bucket's lifecycle rule and aurora gc.
  statement {
    sid       = "WriteRegionResults"
    actions   = ["s3:PutObject"]
    resources = ["${var.buckets[each.key].bucket_arn}/${var.run_prefix}/results/*"]
  }

  # GenerateDataKey: a put is encrypted under the bucket's key (SSE-KMS).
  statement {
    sid       = "RegionBucketKey"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [var.buckets[each.key].kms_key_arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["s3.${var.buckets[each.key].aws_region}.amazonaws.com"]
    }
  }

  statement {
    sid       = "ReadActorSecrets"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = local.reader_secrets
  }

  statement {
    sid       = "SecretsKey"
    actions   = ["kms:Decrypt"]
    resources = [var.secrets.kms_key_arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = [local.secrets_via_service]
    }
  }
}

# A relay on Google Cloud reading an S3 source: read-only on the source's run prefix.
data "aws_iam_policy_document" "gcp_relay" {
  for_each = var.gcp_relays

  lifecycle {
    precondition {
      condition     = contains(keys(var.buckets), each.value.source)
      error_message = "gcp relay ${each.key}: its source (${each.value.source}) must be a key of buckets."
    }
  }

  statement {
    sid       = "ListSourceRunPrefix"
    actions   = ["s3:ListBucket"]
    resources = [var.buckets[each.value.source].bucket_arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = [var.run_prefix, "${var.run_prefix}/*"]
    }
  }

  statement {
    sid       = "ReadSourceRun"
    actions   = ["s3:GetObject"]
    resources = ["${var.buckets[each.value.source].bucket_arn}/${var.run_prefix}", "${var.buckets[each.value.source].bucket_arn}/${var.run_prefix}/*"]
  }

  statement {
    sid       = "SourceBucketKey"
    actions   = ["kms:Decrypt"]
    resources = [var.buckets[each.value.source].kms_key_arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["s3.${var.buckets[each.value.source].aws_region}.amazonaws.com"]
    }
  }
}

# A trainer on Google Cloud (its home bucket on Cloud Storage, iam-roles/gcp) reading the
# offloaded result payloads of the S3 regions, with its Google identity token: results/ only.
data "aws_iam_policy_document" "gcp_trainer" {
  count = var.gcp_trainer == null ? 0 : 1

  lifecycle {
    precondition {
      condition     = var.home_region == null
      error_message = "gcp_trainer is for a trainer on Google Cloud; a trainer whose home bucket is on S3 (home_region) reads results with its own role."
    }
  }

  dynamic "statement" {
    for_each = var.buckets
    content {
      actions   = ["s3:GetObject"]
      resources = ["${statement.value.bucket_arn}/${var.run_prefix}/results/*"]
    }
  }

  dynamic "statement" {
    for_each = var.buckets
    content {
      actions   = ["kms:Decrypt"]
      resources = [statement.value.kms_key_arn]
      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = ["s3.${statement.value.aws_region}.amazonaws.com"]
      }
    }
  }
}

# The operator's retention job (aurora gc), one document per bucket: the only identity that
# deletes (versions and trainer states no one needs, and result payloads older than
# --results-max-age, all under the run prefix). It writes nothing but its retention records
# (retention/, written before the first deletion), and reads Redis to learn what live actors and
# regions still hold.
data "aws_iam_policy_document" "gc" {
  for_each = var.buckets

  statement {
    sid       = "ListRunPrefix"
    actions   = ["s3:ListBucket"]
    resources = [each.value.bucket_arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = [var.run_prefix, "${var.run_prefix}/*"]
    }
  }

  statement {
    sid       = "ReadAndDeleteRunObjects"
    actions   = ["s3:GetObject", "s3:DeleteObject"]
    resources = ["${each.value.bucket_arn}/${var.run_prefix}", "${each.value.bucket_arn}/${var.run_prefix}/*"]
  }

  statement {
    sid       = "WriteRetentionRecords"
    actions   = ["s3:PutObject", "s3:AbortMultipartUpload"]
    resources = ["${each.value.bucket_arn}/${var.run_prefix}/retention/*"]
  }

  statement {
    sid       = "BucketKey"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [each.value.kms_key_arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["s3.${each.value.aws_region}.amazonaws.com"]
    }
  }

  statement {
    sid       = "ReadGcSecrets"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = local.reader_secrets
  }

  statement {
    sid       = "SecretsKey"
    actions   = ["kms:Decrypt"]
    resources = [var.secrets.kms_key_arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = [local.secrets_via_service]
    }
  }
}

# Who may become each role.
data "aws_iam_policy_document" "ec2_trust" {
  statement {
    sid     = "Ec2Instances"
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

data "aws_iam_policy_document" "gcp_relay_trust" {
  for_each = var.gcp_relays

  # Google signs the relay host's identity token (from its metadata server); the token's azp/sub
  # are the service account's unique id, which AWS exposes as accounts.google.com:aud and :sub.
  statement {
    sid     = "GoogleServiceAccount"
    actions = ["sts:AssumeRoleWithWebIdentity"]
    principals {
      type        = "Federated"
      identifiers = ["accounts.google.com"]
    }
    condition {
      test     = "StringEquals"
      variable = "accounts.google.com:aud"
      values   = [each.value.service_account_unique_id]
    }
    condition {
      test     = "StringEquals"
      variable = "accounts.google.com:sub"
      values   = [each.value.service_account_unique_id]
    }
  }
}

data "aws_iam_policy_document" "gcp_trainer_trust" {
  count = var.gcp_trainer == null ? 0 : 1

  # As gcp_relay_trust: the trainer host's Google-signed identity token, for its service account only.
  statement {
    sid     = "GoogleServiceAccount"
    actions = ["sts:AssumeRoleWithWebIdentity"]
    principals {
      type        = "Federated"
      identifiers = ["accounts.google.com"]
    }
    condition {
      test     = "StringEquals"
      variable = "accounts.google.com:aud"
      values   = [var.gcp_trainer.service_account_unique_id]
    }
    condition {
      test     = "StringEquals"
      variable = "accounts.google.com:sub"
      values   = [var.gcp_trainer.service_account_unique_id]
    }
  }
}

data "aws_iam_policy_document" "gc_trust" {
  statement {
    sid     = "Ec2Instances"
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }

  dynamic "statement" {
    for_each = length(var.gc_trusted_principal_arns) > 0 ? ["Operators"] : []
    content {
      sid     = statement.value
      actions = ["sts:AssumeRole"]
      principals {
        type        = "AWS"
        identifiers = var.gc_trusted_principal_arns
      }
    }
  }
}
