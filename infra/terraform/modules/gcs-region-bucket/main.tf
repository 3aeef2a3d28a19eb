# One region's AuroraRL bucket on Cloud Storage: uniform bucket-level access (IAM only, so the
# iam-roles module's prefix conditions are the whole story), public access prevented, optional
# CMEK, and nothing that moves or deletes objects behind AuroraRL's back but the expiry of the
# offloaded result payloads under RUN_PREFIX/results/.

data "google_storage_project_service_account" "gcs" {
  count   = var.kms_key_name == null ? 0 : 1
  project = var.project_id
}

# With CMEK, Cloud Storage's own service agent wraps and unwraps object keys: it, and only it,
# needs the key. Readers and writers need no KMS permission at all.
resource "google_kms_crypto_key_iam_member" "gcs" {
  count = var.kms_key_name == null ? 0 : 1

  crypto_key_id = var.kms_key_name
  role          = "roles/cloudkms.cryptoKeyEncrypterDecrypter"
  member        = "serviceAccount:${data.google_storage_project_service_account.gcs[0].email_address}"
}

resource "google_storage_bucket" "this" {
  #checkov:skip=CKV_GCP_78:Versioning stays off on purpose: AuroraRL objects are created once with ifGenerationMatch=0 and never overwritten, so versions would only keep what aurora gc deletes; soft delete (var.soft_delete_retention_days) is the bounded recovery window instead.
  name     = var.name
  project  = var.project_id
  location = var.location

  storage_class               = "STANDARD"
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = var.force_destroy
  labels                      = var.labels

  versioning {
    enabled = false
  }

  # A bounded window in which an object aurora gc (or a mistake) deleted can still be restored;
  # 0 turns soft delete off. Unlike versioning it ends by itself.
  soft_delete_policy {
    retention_duration_seconds = var.soft_delete_retention_days * 86400
  }

  # Abort the XML-API multipart uploads a killed writer left. There is deliberately NO Delete
  # rule for versions, trainer states or retention records: retention is aurora gc's job, and an
  # age-based rule could delete the full version that kept deltas need.
  lifecycle_rule {
    condition {
      age = var.abort_incomplete_multipart_days
    }
    action {
      type = "AbortIncompleteMultipartUpload"
    }
  }

  # The one Delete rule: a run's offloaded result payloads (RUN_PREFIX/results/<sha256>.bin) are
  # read once, when the trainer admits their result within its lease, and are garbage after.
  # Every prefix ends in "/results/", so nothing else of a run matches.
  dynamic "lifecycle_rule" {
    for_each = length(var.run_prefixes) > 0 ? ["results"] : []
    content {
      condition {
        age            = var.results_expire_days
        matches_prefix = [for p in var.run_prefixes : "${p}/results/"]
      }
      action {
        type = "Delete"
      }
    }
  }

  dynamic "encryption" {
    for_each = var.kms_key_name == null ? [] : [var.kms_key_name]
    content {
      default_kms_key_name = encryption.value
    }
  }

  dynamic "logging" {
    for_each = var.log_bucket == null ? [] : [var.log_bucket]
    content {
      log_bucket        = logging.value
      log_object_prefix = "gcs/${var.name}/"
    }
  }

  depends_on = [google_kms_crypto_key_iam_member.gcs]
}
