variable "name_prefix" {
  type        = string
  description = "Prefix of every role and instance profile name (e.g. aurora-exp1): roles are NAME_PREFIX-trainer, NAME_PREFIX-relay-REGION, NAME_PREFIX-actor-REGION, NAME_PREFIX-gc."

  validation {
    condition     = can(regex("^[A-Za-z0-9+=,.@_-]{1,38}$", var.name_prefix))
    error_message = "name_prefix must be 1-38 characters of letters, digits and +=,.@_- (IAM role names, PREFIX-gcp-relay-REGION, are at most 64 characters)."
  }
}

variable "run_prefix" {
  type        = string
  description = "The run's prefix inside every bucket, without slashes at either end (e.g. runs/exp1). Every object permission is scoped to it."

  validation {
    condition     = can(regex("^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$", var.run_prefix)) && !can(regex("(^|/)\\.\\.?(/|$)", var.run_prefix))
    error_message = "run_prefix must be a plain relative path such as runs/exp1: no leading or trailing '/', no '.' or '..' segments, no wildcards."
  }
}

variable "buckets" {
  type = map(object({
    bucket_arn  = string
    kms_key_arn = string
    aws_region  = string
  }))
  description = "The run's S3 buckets, keyed by AuroraRL region name (the keys of [regions] in aurora.toml): each bucket's ARN, its SSE-KMS key and its AWS region (outputs of aws-region-bucket)."

  validation {
    condition     = alltrue([for k, b in var.buckets : can(regex("^arn:aws[a-z-]*:s3:::[a-z0-9.-]+$", b.bucket_arn)) && can(regex("^arn:aws[a-z-]*:kms:", b.kms_key_arn))])
    error_message = "every bucket needs an S3 bucket ARN (arn:aws:s3:::NAME) and a KMS key ARN."
  }
}

variable "home_region" {
  type        = string
  default     = null
  description = "The trainer's region: a key of buckets, whose run prefix only the trainer writes. Null when the home bucket is not on S3 (no trainer role is made here)."
}

variable "relays" {
  type = map(object({
    source = string
  }))
  default     = {}
  description = "Relays hosted on AWS, keyed by the region they write (a key of buckets): source is the region they copy from (a key of buckets; usually the home region). Each relay may write only its own region's run prefix."
}

variable "actor_regions" {
  type        = set(string)
  default     = []
  description = "Regions (keys of buckets) with actor pools on AWS. An actor may read (Get/List) its own region's run prefix, and put (if absent) only under its RUN_PREFIX/results/ (offloaded rollout results)."
}

variable "gcp_relays" {
  type = map(object({
    source                    = string
    service_account_unique_id = string
  }))
  default     = {}
  description = "Relays hosted on Google Cloud whose source bucket is on S3, keyed by the region they write: source is a key of buckets; service_account_unique_id is the relay's Google service account's numeric unique id. Each gets a role it assumes with its Google identity token (no AWS keys), allowed to read the source's run prefix only."

  validation {
    condition     = alltrue([for k, r in var.gcp_relays : can(regex("^[0-9]{10,}$", r.service_account_unique_id))])
    error_message = "service_account_unique_id must be the service account's numeric unique id (google_service_account.unique_id), not its email."
  }
}

variable "gcp_trainer" {
  type = object({
    service_account_unique_id = string
  })
  default     = null
  description = "A trainer hosted on Google Cloud (home bucket on Cloud Storage, home_region null here): the numeric unique id of its service account (iam-roles/gcp's trainer_unique_id). It gets a role it assumes with its Google identity token, allowed only to read every bucket's RUN_PREFIX/results/ (the offloaded rollout results of the S3 regions)."

  validation {
    condition     = var.gcp_trainer == null ? true : can(regex("^[0-9]{10,}$", var.gcp_trainer.service_account_unique_id))
    error_message = "gcp_trainer.service_account_unique_id must be the service account's numeric unique id (google_service_account.unique_id), not its email."
  }
}

variable "secrets" {
  type = object({
    redis_arn       = string
    verify_key_arn  = string
    signing_key_arn = optional(string)
    kms_key_arn     = string
  })
  description = "Secrets Manager secrets the roles read at start (their ARNs, never their values): the Redis URL (AURORA_REDIS, every role, gc included: it asks Redis what live actors hold), the verify key (AURORA_VERIFY_KEY, relays, actors and gc), the signing key (AURORA_SIGNING_KEY, the trainer only), and the KMS key they are encrypted with."

  validation {
    condition = alltrue([
      for arn in compact([var.secrets.redis_arn, var.secrets.verify_key_arn, var.secrets.signing_key_arn]) :
      can(regex("^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:", arn))
    ])
    error_message = "secrets must hold Secrets Manager secret ARNs (arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME): ARNs, never secret values."
  }
}

variable "trainer_can_delete" {
  type        = bool
  default     = false
  description = "Also let the trainer delete objects under the home run prefix. AuroraRL's trainer never deletes from an object store (objects are immutable; temporaries exist only on local disks), so this stays off unless a tool run with the trainer's identity needs it."
}

variable "trainer_discovery" {
  type        = bool
  default     = true
  description = "Let the trainer's hosts list their own autoscaling group's instances (autoscaling:DescribeAutoScalingGroups, ec2:DescribeInstances: read-only, not resource-scopable) to agree on the torchrun rendezvous host."
}

variable "gc_trusted_principal_arns" {
  type        = list(string)
  default     = []
  description = "IAM principals (operators' roles) that may assume the gc role to run aurora gc, besides EC2 instances given its instance profile."
}

variable "tags" {
  type        = map(string)
  default     = {}
  description = "Tags for every role and instance profile."
}
