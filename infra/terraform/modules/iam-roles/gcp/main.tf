# A service account per AuroraRL role and region, and bucket IAM bindings conditioned on the
# run's prefix (IAM Conditions need uniform bucket-level access, which gcs-region-bucket sets).
#
# How the prefix is enforced: object permissions (get, create, delete) are checked against the
# object, projects/_/buckets/B/objects/NAME, so `resource.name.startsWith(...)` scopes them.
# storage.objects.list is checked against the bucket, projects/_/buckets/B, whatever prefix is
# listed: the list request's prefix is the API attribute storage.googleapis.com/objectListPrefix,
# which the conditions below require to be the run's prefix.

locals {
  trainer = var.home_region != null
  # relays whose source bucket is on Cloud Storage (one on S3 is iam-roles/aws's gcp_relays)
  gcs_sourced_relays = { for k, r in var.relays : k => r if contains(keys(var.buckets), r.source) }
}

resource "google_service_account" "trainer" {
  count = local.trainer ? 1 : 0

  project      = var.project_id
  account_id   = "${var.name_prefix}-trainer"
  display_name = "AuroraRL trainer (writes ${var.run_prefix} in the home bucket only)"

  lifecycle {
    precondition {
      condition     = contains(keys(var.buckets), coalesce(var.home_region, "-")) && var.secrets.signing_key != null
      error_message = "home_region must be a key of buckets, and secrets.signing_key must be set: the trainer signs every version."
    }
  }
}

resource "google_service_account" "relay" {
  for_each = var.relays

  project      = var.project_id
  account_id   = "${var.name_prefix}-relay-${each.key}"
  display_name = "AuroraRL relay into ${each.key} (from ${each.value.source})"

  lifecycle {
    precondition {
      condition     = contains(keys(var.buckets), each.key) && each.key != each.value.source && length("${var.name_prefix}-relay-${each.key}") <= 30
      error_message = "relay ${each.key}: its region must be a key of buckets and differ from its source, and ${var.name_prefix}-relay-${each.key} must fit in 30 characters."
    }
  }
}

resource "google_service_account" "actor" {
  for_each = var.actor_regions

  project      = var.project_id
  account_id   = "${var.name_prefix}-actor-${each.key}"
  display_name = "AuroraRL actors in ${each.key} (read; create results/ only)"

  lifecycle {
    precondition {
      condition     = contains(keys(var.buckets), each.key) && length("${var.name_prefix}-actor-${each.key}") <= 30
      error_message = "actor region ${each.key} must be a key of buckets, and ${var.name_prefix}-actor-${each.key} must fit in 30 characters."
    }
  }
}

resource "google_service_account" "gc" {
  project      = var.project_id
  account_id   = "${var.name_prefix}-gc"
  display_name = "AuroraRL retention (aurora gc): reads, deletes, writes retention records"
}

# storage.objects.delete alone: the predefined roles that include it also include create.
resource "google_project_iam_custom_role" "object_deleter" {
  project     = var.project_id
  role_id     = "${replace(var.name_prefix, "-", "_")}_aurora_object_deleter"
  title       = "AuroraRL object deleter (aurora gc)"
  description = "Delete objects; granted only on buckets, conditioned on the run prefix"
  permissions = ["storage.objects.delete"]
}

resource "google_project_iam_custom_role" "trainer_discovery" {
  count = local.trainer && var.trainer_discovery ? 1 : 0

  project     = var.project_id
  role_id     = "${replace(var.name_prefix, "-", "_")}_aurora_trainer_discovery"
  title       = "AuroraRL trainer rendezvous discovery"
  description = "Read a managed instance group's instances to pick the torchrun c10d host"
  permissions = ["compute.instanceGroupManagers.get", "compute.instances.get"]
}

resource "google_project_iam_member" "trainer_discovery" {
  count = local.trainer && var.trainer_discovery ? 1 : 0

  project = var.project_id
  role    = google_project_iam_custom_role.trainer_discovery[0].id
  member  = "serviceAccount:${google_service_account.trainer[0].email}"
}

# --- trainer: read and create under the home run prefix --------------------------------------

resource "google_storage_bucket_iam_member" "trainer_read" {
  count = local.trainer ? 1 : 0

  bucket = var.buckets[var.home_region]
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:${google_service_account.trainer[0].email}"
  condition {
    title       = "aurora-run-prefix"
    description = "The run prefix's objects, and listing that prefix"
    expression  = "resource.name == \"projects/_/buckets/${var.buckets[var.home_region]}/objects/${var.run_prefix}\" || resource.name.startsWith(\"projects/_/buckets/${var.buckets[var.home_region]}/objects/${var.run_prefix}/\") || (resource.name == \"projects/_/buckets/${var.buckets[var.home_region]}\" && (api.getAttribute(\"storage.googleapis.com/objectListPrefix\", \"\") == \"${var.run_prefix}\" || api.getAttribute(\"storage.googleapis.com/objectListPrefix\", \"\").startsWith(\"${var.run_prefix}/\")))"
  }
}

resource "google_storage_bucket_iam_member" "trainer_write" {
  count = local.trainer ? 1 : 0

  bucket = var.buckets[var.home_region]
  role   = "roles/storage.objectCreator"
  member = "serviceAccount:${google_service_account.trainer[0].email}"
  condition {
    title       = "aurora-run-prefix-objects"
    description = "Create objects under the run prefix only (create without delete cannot overwrite)"
    expression  = "resource.name.startsWith(\"projects/_/buckets/${var.buckets[var.home_region]}/objects/${var.run_prefix}/\")"
  }
}

resource "google_storage_bucket_iam_member" "trainer_delete" {
  count = local.trainer && var.trainer_can_delete ? 1 : 0

  bucket = var.buckets[var.home_region]
  role   = google_project_iam_custom_role.object_deleter.id
  member = "serviceAccount:${google_service_account.trainer[0].email}"
  condition {
    title       = "aurora-run-prefix-objects"
    description = "Delete objects under the run prefix only"
    expression  = "resource.name.startsWith(\"projects/_/buckets/${var.buckets[var.home_region]}/objects/${var.run_prefix}/\")"
  }
}

# Rollout results too large for Redis are offloaded by each actor to its own region's bucket
# (RUN_PREFIX/results/<sha256>.bin); the trainer reads each once, when it admits the result.
# Viewer on results/ only, in every bucket (the home one is already covered by trainer_read).
resource "google_storage_bucket_iam_member" "trainer_results_read" {
  for_each = local.trainer ? var.buckets : {}

  bucket = each.value
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:${google_service_account.trainer[0].email}"
  condition {
    title       = "aurora-run-results"
    description = "Read the run's offloaded result payloads only"
    expression  = "resource.name.startsWith(\"projects/_/buckets/${each.value}/objects/${var.run_prefix}/results/\")"
  }
}

# --- a trainer on AWS: read results/ with its AWS identity (Workload Identity Federation) -------
#
# The mirror of iam-roles/aws's gcp_relays: no key crosses clouds. The trainer host signs a
# GetCallerIdentity request with its instance profile's credentials; Google's STS checks it with
# AWS and accepts only the trainer's role (attribute_condition); the resulting federated
# identity is granted viewer on every bucket's RUN_PREFIX/results/ directly (no service account
# to impersonate). The host reads with aws_trainer_credential_config (gpu-pool/aws's
# gcp_credential_config), which holds no secret.

resource "google_iam_workload_identity_pool" "aws_trainer" {
  count = var.aws_trainer == null ? 0 : 1

  project                   = var.project_id
  workload_identity_pool_id = "${var.name_prefix}-aws-trainer"
  display_name              = "AuroraRL trainer on AWS"
  description               = "The AuroraRL trainer's AWS role, reading the run's results/ in Cloud Storage"

  lifecycle {
    precondition {
      condition     = var.home_region == null
      error_message = "aws_trainer is for a trainer on AWS; a trainer whose home bucket is on Cloud Storage (home_region) reads results with its own service account."
    }
  }
}

resource "google_iam_workload_identity_pool_provider" "aws_trainer" {
  #checkov:skip=CKV_GCP_125:A GitHub Actions OIDC check; this provider is AWS (no oidc block, which checkov 3.3.30's check reads unconditionally and so fails), and attribute_condition admits only the trainer's role.
  count = var.aws_trainer == null ? 0 : 1

  project                            = var.project_id
  workload_identity_pool_id          = google_iam_workload_identity_pool.aws_trainer[0].workload_identity_pool_id
  workload_identity_pool_provider_id = "aws-trainer"
  display_name                       = "AuroraRL trainer's AWS role"
  # Google's documented mapping for AWS: an assumed role's session ARN becomes its role's
  # arn:aws:sts::ACCOUNT:assumed-role/NAME, whatever the session name (the instance id).
  attribute_mapping = {
    "google.subject"     = "assertion.arn"
    "attribute.aws_role" = "assertion.arn.contains('assumed-role') ? assertion.arn.extract('{account_arn}assumed-role/') + 'assumed-role/' + assertion.arn.extract('assumed-role/{role_name}/') : assertion.arn"
  }
  # Only the trainer's role: any other identity of the account is refused a token.
  attribute_condition = "attribute.aws_role == \"arn:${var.aws_trainer.partition}:sts::${var.aws_trainer.account_id}:assumed-role/${var.aws_trainer.role_name}\""

  aws {
    account_id = var.aws_trainer.account_id
  }
}

resource "google_storage_bucket_iam_member" "aws_trainer_results_read" {
  for_each = var.aws_trainer == null ? {} : var.buckets

  bucket = each.value
  role   = "roles/storage.objectViewer"
  member = "principalSet://iam.googleapis.com/${google_iam_workload_identity_pool.aws_trainer[0].name}/attribute.aws_role/arn:${var.aws_trainer.partition}:sts::${var.aws_trainer.account_id}:assumed-role/${var.aws_trainer.role_name}"
  condition {
    title       = "aurora-run-results"
    description = "Read the run's offloaded result payloads only"
    expression  = "resource.name.startsWith(\"projects/_/buckets/${each.value}/objects/${var.run_prefix}/results/\")"
  }
}

# --- relays: read the source's run prefix, create under their own region's --------------------

resource "google_storage_bucket_iam_member" "relay_source_read" {
  for_each = local.gcs_sourced_relays

  bucket = var.buckets[each.value.source]
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:${google_service_account.relay[each.key].email}"
  condition {
    title       = "aurora-run-prefix"
    description = "The run prefix's objects, and listing that prefix"
    expression  = "resource.name == \"projects/_/buckets/${var.buckets[each.value.source]}/objects/${var.run_prefix}\" || resource.name.startsWith(\"projects/_/buckets/${var.buckets[each.value.source]}/objects/${var.run_prefix}/\") || (resource.name == \"projects/_/buckets/${var.buckets[each.value.source]}\" && (api.getAttribute(\"storage.googleapis.com/objectListPrefix\", \"\") == \"${var.run_prefix}\" || api.getAttribute(\"storage.googleapis.com/objectListPrefix\", \"\").startsWith(\"${var.run_prefix}/\")))"
  }
}

resource "google_storage_bucket_iam_member" "relay_read" {
  for_each = var.relays

  bucket = var.buckets[each.key]
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:${google_service_account.relay[each.key].email}"
  condition {
    title       = "aurora-run-prefix"
    description = "The run prefix's objects, and listing that prefix"
    expression  = "resource.name == \"projects/_/buckets/${var.buckets[each.key]}/objects/${var.run_prefix}\" || resource.name.startsWith(\"projects/_/buckets/${var.buckets[each.key]}/objects/${var.run_prefix}/\") || (resource.name == \"projects/_/buckets/${var.buckets[each.key]}\" && (api.getAttribute(\"storage.googleapis.com/objectListPrefix\", \"\") == \"${var.run_prefix}\" || api.getAttribute(\"storage.googleapis.com/objectListPrefix\", \"\").startsWith(\"${var.run_prefix}/\")))"
  }
}

# Create only (roles/storage.objectCreator has no delete): with ifGenerationMatch=0 a relay never
# overwrites, and on an object store it leaves no .tmp-* temporaries to delete.
resource "google_storage_bucket_iam_member" "relay_write" {
  for_each = var.relays

  bucket = var.buckets[each.key]
  role   = "roles/storage.objectCreator"
  member = "serviceAccount:${google_service_account.relay[each.key].email}"
  condition {
    title       = "aurora-run-prefix-objects"
    description = "Create objects under the run prefix only"
    expression  = "resource.name.startsWith(\"projects/_/buckets/${var.buckets[each.key]}/objects/${var.run_prefix}/\")"
  }
}

# --- actors: read their own region's run prefix, create only under its results/ ---------------

resource "google_storage_bucket_iam_member" "actor_read" {
  for_each = var.actor_regions

  bucket = var.buckets[each.key]
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:${google_service_account.actor[each.key].email}"
  condition {
    title       = "aurora-run-prefix"
    description = "The run prefix's objects, and listing that prefix"
    expression  = "resource.name == \"projects/_/buckets/${var.buckets[each.key]}/objects/${var.run_prefix}\" || resource.name.startsWith(\"projects/_/buckets/${var.buckets[each.key]}/objects/${var.run_prefix}/\") || (resource.name == \"projects/_/buckets/${var.buckets[each.key]}\" && (api.getAttribute(\"storage.googleapis.com/objectListPrefix\", \"\") == \"${var.run_prefix}\" || api.getAttribute(\"storage.googleapis.com/objectListPrefix\", \"\").startsWith(\"${var.run_prefix}/\")))"
  }
}

# The one write: a rollout result too large for Redis, as RUN_PREFIX/results/<sha256>.bin, created
# with ifGenerationMatch=0. Create only (no delete, so nothing can be overwritten), results/ only.
resource "google_storage_bucket_iam_member" "actor_write_results" {
  for_each = var.actor_regions

  bucket = var.buckets[each.key]
  role   = "roles/storage.objectCreator"
  member = "serviceAccount:${google_service_account.actor[each.key].email}"
  condition {
    title       = "aurora-run-results"
    description = "Create offloaded result payloads under the run prefix's results/ only"
    expression  = "resource.name.startsWith(\"projects/_/buckets/${var.buckets[each.key]}/objects/${var.run_prefix}/results/\")"
  }
}

# --- gc: read, delete and record retention under the run prefix of every bucket ---------------

resource "google_storage_bucket_iam_member" "gc_read" {
  for_each = var.buckets

  bucket = each.value
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:${google_service_account.gc.email}"
  condition {
    title       = "aurora-run-prefix"
    description = "The run prefix's objects, and listing that prefix"
    expression  = "resource.name == \"projects/_/buckets/${each.value}/objects/${var.run_prefix}\" || resource.name.startsWith(\"projects/_/buckets/${each.value}/objects/${var.run_prefix}/\") || (resource.name == \"projects/_/buckets/${each.value}\" && (api.getAttribute(\"storage.googleapis.com/objectListPrefix\", \"\") == \"${var.run_prefix}\" || api.getAttribute(\"storage.googleapis.com/objectListPrefix\", \"\").startsWith(\"${var.run_prefix}/\")))"
  }
}

# gc writes its retention record (retention/) before its first deletion.
resource "google_storage_bucket_iam_member" "gc_write_records" {
  for_each = var.buckets

  bucket = each.value
  role   = "roles/storage.objectCreator"
  member = "serviceAccount:${google_service_account.gc.email}"
  condition {
    title       = "aurora-run-retention-records"
    description = "Create retention records under the run prefix only"
    expression  = "resource.name.startsWith(\"projects/_/buckets/${each.value}/objects/${var.run_prefix}/retention/\")"
  }
}

resource "google_storage_bucket_iam_member" "gc_delete" {
  for_each = var.buckets

  bucket = each.value
  role   = google_project_iam_custom_role.object_deleter.id
  member = "serviceAccount:${google_service_account.gc.email}"
  condition {
    title       = "aurora-run-prefix-objects"
    description = "Delete objects under the run prefix only"
    expression  = "resource.name.startsWith(\"projects/_/buckets/${each.value}/objects/${var.run_prefix}/\")"
  }
}

# --- secrets: each role reads the secrets it needs, one by one ---------------------------------

locals {
  secret_grants = merge(
    {
      for name, secret in { redis = var.secrets.redis, signing_key = var.secrets.signing_key } :
      "trainer/${name}" => { secret = secret, email = google_service_account.trainer[0].email } if local.trainer
    },
    { for k, sa in google_service_account.relay : "relay-${k}/redis" => { secret = var.secrets.redis, email = sa.email } },
    { for k, sa in google_service_account.relay : "relay-${k}/verify_key" => { secret = var.secrets.verify_key, email = sa.email } },
    { for k, sa in google_service_account.actor : "actor-${k}/redis" => { secret = var.secrets.redis, email = sa.email } },
    { for k, sa in google_service_account.actor : "actor-${k}/verify_key" => { secret = var.secrets.verify_key, email = sa.email } },
    { "gc/redis" = { secret = var.secrets.redis, email = google_service_account.gc.email } },
    { "gc/verify_key" = { secret = var.secrets.verify_key, email = google_service_account.gc.email } },
  )
}

resource "google_secret_manager_secret_iam_member" "role" {
  for_each = local.secret_grants

  project   = var.project_id
  secret_id = each.value.secret
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${each.value.email}"
}
