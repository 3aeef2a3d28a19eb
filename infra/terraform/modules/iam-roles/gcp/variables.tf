variable "project_id" {
  type        = string
  description = "The Google Cloud project of the service accounts, buckets and secrets."
}

variable "name_prefix" {
  type        = string
  description = "Prefix of every service account id (e.g. aur-exp1): accounts are PREFIX-trainer, PREFIX-relay-REGION, PREFIX-actor-REGION, PREFIX-gc, each at most 30 characters."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,11}$", var.name_prefix))
    error_message = "name_prefix must be 2-12 lower-case letters, digits and '-', starting with a letter (service account ids are at most 30 characters)."
  }
}

variable "run_prefix" {
  type        = string
  description = "The run's prefix inside every bucket, without slashes at either end (e.g. runs/exp1). Every object permission is conditioned on it."

  validation {
    condition     = can(regex("^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$", var.run_prefix)) && !can(regex("(^|/)\\.\\.?(/|$)", var.run_prefix))
    error_message = "run_prefix must be a plain relative path such as runs/exp1: no leading or trailing '/', no '.' or '..' segments, no wildcards."
  }
}

variable "buckets" {
  type        = map(string)
  description = "The run's Cloud Storage buckets, keyed by AuroraRL region name (the keys of [regions] in aurora.toml): the bucket's name."
}

variable "home_region" {
  type        = string
  default     = null
  description = "The trainer's region, when the home bucket is on Cloud Storage (a key of buckets): a trainer service account is made that writes its run prefix only. Null otherwise."
}

variable "relays" {
  type = map(object({
    source = string
  }))
  default     = {}
  description = "Relays hosted on Google Cloud, keyed by the region they write (a key of buckets); source is the region they copy from. A source on Cloud Storage is granted here; a source on S3 is granted by iam-roles/aws (gcp_relays), with this module's relay_unique_ids."
}

variable "aws_trainer" {
  type = object({
    account_id = string
    role_name  = string
    partition  = optional(string, "aws")
  })
  default     = null
  description = "A trainer hosted on AWS (home_region null here): its account id and role name (iam-roles/aws's trainer_role_name). A workload identity pool trusting that role only is made, and granted viewer on every bucket's RUN_PREFIX/results/ (the offloaded rollout results of the Cloud Storage regions); the host reads with aws_trainer_credential_config."

  validation {
    condition     = var.aws_trainer == null ? true : can(regex("^[0-9]{12}$", var.aws_trainer.account_id)) && can(regex("^[A-Za-z0-9+=,.@_-]{1,64}$", var.aws_trainer.role_name)) && can(regex("^aws[a-z-]*$", var.aws_trainer.partition))
    error_message = "aws_trainer needs a 12-digit AWS account id, an IAM role name (no path) and an AWS partition (aws, aws-cn, aws-us-gov)."
  }
}

variable "actor_regions" {
  type        = set(string)
  default     = []
  description = "Regions (keys of buckets) with actor pools on Google Cloud. An actor may read its own region's run prefix, and create objects only under its RUN_PREFIX/results/ (offloaded rollout results)."
}

variable "secrets" {
  type = object({
    redis       = string
    verify_key  = string
    signing_key = optional(string)
  })
  description = "Secret Manager secrets the roles read at start, as resource ids (projects/P/secrets/NAME), never values: the Redis URL (every role), the verify key (relays, actors, gc) and the signing key (the trainer only)."

  validation {
    condition     = alltrue([for s in compact([var.secrets.redis, var.secrets.verify_key, var.secrets.signing_key]) : can(regex("^projects/[^/]+/secrets/[A-Za-z0-9_-]+$", s))])
    error_message = "secrets must hold Secret Manager secret ids (projects/P/secrets/NAME): ids, never secret values."
  }
}

variable "trainer_can_delete" {
  type        = bool
  default     = false
  description = "Also let the trainer delete objects under the home run prefix. AuroraRL's trainer never deletes from an object store, so this stays off unless a tool run with its identity needs it."
}

variable "trainer_discovery" {
  type        = bool
  default     = true
  description = "Let the trainer's hosts read their managed instance group and its instances (compute.instanceGroupManagers.get, compute.instances.get: read-only, project-wide) to agree on the torchrun rendezvous host."
}
