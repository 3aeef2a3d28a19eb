# One region's AuroraRL bucket on S3: private, TLS-only, KMS-encrypted, and free of anything
# that moves or deletes objects behind AuroraRL's back (no replication; nothing expires but the
# offloaded result payloads under RUN_PREFIX/results/, garbage a day after they are written).

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}
data "aws_region" "current" {}

locals {
  bucket_arn = aws_s3_bucket.this.arn
  # The bucket's key: the caller's, or one made here (one key per bucket: a key policy or a
  # grant then scopes to one region's weights, and CloudTrail says which bucket a decrypt was for).
  kms_key_arn = var.kms_key_arn != null ? var.kms_key_arn : aws_kms_key.bucket[0].arn
}

resource "aws_kms_key" "bucket" {
  count = var.kms_key_arn == null ? 1 : 0

  description             = "AuroraRL weights bucket ${var.name} (SSE-KMS with an S3 bucket key)"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  # The account's IAM policies decide who may use the key (the iam-roles module grants each role
  # exactly the bucket keys it needs); this is the key policy AWS itself would create.
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

resource "aws_kms_alias" "bucket" {
  count = var.kms_key_arn == null ? 1 : 0

  name          = "alias/${var.name}"
  target_key_id = aws_kms_key.bucket[0].key_id
}

resource "aws_s3_bucket" "this" {
  #checkov:skip=CKV_AWS_21:Versioning stays off on purpose: AuroraRL objects are written once with put-if-absent (enforced below) and never overwritten, so versions would only keep every object aurora gc deletes, forever, unless a noncurrent-version expiration were added (see README).
  #checkov:skip=CKV_AWS_144:No cross-region replication on purpose: an AuroraRL relay copies each version once, verifies every object against the signed manifest and commits the manifest last; S3 replication would copy unverified objects and manifests out of order.
  #checkov:skip=CKV2_AWS_62:No event notifications: relays and actors learn of new objects from Redis announcements, not from S3 events.
  bucket        = var.name
  force_destroy = var.force_destroy
  tags          = var.tags
}

resource "aws_s3_bucket_ownership_controls" "this" {
  bucket = aws_s3_bucket.this.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_public_access_block" "this" {
  bucket = aws_s3_bucket.this.id

  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_server_side_encryption_configuration" "this" {
  bucket = aws_s3_bucket.this.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = local.kms_key_arn
    }
    # Actors read each version with many parallel ranged GETs: without a bucket key every object
    # read is a KMS Decrypt call (cost, and the KMS request quota); with it S3 reuses a bucket-level
    # data key for a while and calls KMS orders of magnitude less.
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_versioning" "this" {
  bucket = aws_s3_bucket.this.id

  versioning_configuration {
    # Deliberate (see README): immutable put-if-absent objects gain nothing from versions, and
    # versions would keep what aurora gc deletes.
    status = "Disabled"
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "this" {
  bucket = aws_s3_bucket.this.id

  # The parts of uploads a killed writer never completed cost storage and are invisible to
  # AuroraRL. There is deliberately NO expiration rule for versions, trainer states or retention
  # records: retention is aurora gc's job, and an age-based rule could delete the full version
  # that kept deltas need.
  rule {
    id     = "abort-incomplete-multipart-uploads"
    status = "Enabled"

    filter {}

    abort_incomplete_multipart_upload {
      days_after_initiation = var.abort_incomplete_multipart_days
    }
  }

  # The one exception: a run's offloaded result payloads (RUN_PREFIX/results/<sha256>.bin) are
  # read once, when the trainer admits their result within its lease, and are garbage after. The
  # prefix ends in "/results/", so nothing else of the run (or of a run named like it) matches.
  dynamic "rule" {
    for_each = toset(var.run_prefixes)
    content {
      id     = "expire-results-${rule.value}"
      status = "Enabled"

      filter {
        prefix = "${rule.value}/results/"
      }

      expiration {
        days = var.results_expire_days
      }
    }
  }
}

resource "aws_s3_bucket_logging" "this" {
  count = var.access_log_bucket == null ? 0 : 1

  bucket        = aws_s3_bucket.this.id
  target_bucket = var.access_log_bucket
  target_prefix = "s3/${var.name}/"
}

data "aws_iam_policy_document" "bucket" {
  statement {
    sid     = "DenyInsecureTransport"
    effect  = "Deny"
    actions = ["s3:*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    resources = [local.bucket_arn, "${local.bucket_arn}/*"]
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }

  statement {
    sid     = "DenyTlsOlderThan12"
    effect  = "Deny"
    actions = ["s3:*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    resources = [local.bucket_arn, "${local.bucket_arn}/*"]
    condition {
      test     = "NumericLessThan"
      variable = "s3:TlsVersion"
      values   = ["1.2"]
    }
  }

  # Put-if-absent as an access control, not only a protocol between cooperating writers: an
  # object is created only with `If-None-Match: *` (what s3fs sends for mode="create", on a
  # PutObject and on CompleteMultipartUpload), so no writer can overwrite a committed object.
  # s3:ObjectCreationOperation is false for UploadPart, which carries no such header.
  dynamic "statement" {
    for_each = var.require_conditional_writes ? ["DenyUnconditionalObjectCreation"] : []
    content {
      sid     = statement.value
      effect  = "Deny"
      actions = ["s3:PutObject"]
      principals {
        type        = "*"
        identifiers = ["*"]
      }
      resources = ["${local.bucket_arn}/*"]
      condition {
        test     = "Null"
        variable = "s3:if-none-match"
        values   = ["true"]
      }
      condition {
        test     = "Bool"
        variable = "s3:ObjectCreationOperation"
        values   = ["true"]
      }
    }
  }
}

resource "aws_s3_bucket_policy" "this" {
  bucket = aws_s3_bucket.this.id
  policy = data.aws_iam_policy_document.bucket.json

  # A bucket policy put before the public access block could be judged public in between.
  depends_on = [aws_s3_bucket_public_access_block.this]
}
