variable "name" {
  type        = string
  description = "The bucket's name (globally unique). One bucket per region; runs live under prefixes such as runs/exp1/."

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9_-]{1,61}[a-z0-9]$", var.name)) && !startswith(var.name, "goog")
    error_message = "name must be 3-63 lower-case letters, digits, '-' and '_', starting and ending with a letter or digit, and not starting with 'goog'."
  }
}

variable "project_id" {
  type        = string
  description = "The Google Cloud project that owns the bucket."
}

variable "location" {
  type        = string
  description = "The bucket's location: a region (e.g. europe-west4), the same as the actors that read it, so reads stay in-region."

  validation {
    condition     = can(regex("^[a-zA-Z]+-[a-zA-Z]+[0-9]+$", var.location))
    error_message = "location must be a single region such as europe-west4: a multi-region bucket would put the actors' reads across regions."
  }
}

variable "kms_key_name" {
  type        = string
  default     = null
  description = "Optional CMEK: the Cloud KMS key (projects/P/locations/L/keyRings/R/cryptoKeys/K, in the bucket's location) that encrypts new objects. Null: Google-managed encryption."

  validation {
    condition     = var.kms_key_name == null || can(regex("^projects/[^/]+/locations/[^/]+/keyRings/[^/]+/cryptoKeys/[^/]+$", var.kms_key_name))
    error_message = "kms_key_name must be a Cloud KMS crypto key id (projects/P/locations/L/keyRings/R/cryptoKeys/K), or null."
  }
}

variable "abort_incomplete_multipart_days" {
  type        = number
  default     = 3
  description = "Days after which an XML-API multipart upload that was never completed is aborted."

  validation {
    condition     = var.abort_incomplete_multipart_days >= 1 && var.abort_incomplete_multipart_days <= 30 && floor(var.abort_incomplete_multipart_days) == var.abort_incomplete_multipart_days
    error_message = "abort_incomplete_multipart_days must be a whole number of days from 1 to 30."
  }
}

variable "run_prefixes" {
  type        = list(string)
  default     = []
  description = "Prefixes of the runs in this bucket (runs/RUN_ID, no slash at either end) whose offloaded result payloads (RUN_PREFIX/results/) are deleted results_expire_days after they are written. Nothing else is ever deleted by a rule."

  validation {
    condition     = alltrue([for p in var.run_prefixes : can(regex("^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$", p)) && !can(regex("(^|/)\\.\\.?(/|$)", p))])
    error_message = "run_prefixes must be plain relative paths such as runs/exp1: no leading or trailing '/', no '.' or '..' segments, no wildcards."
  }
}

variable "results_expire_days" {
  type        = number
  default     = 1
  description = "Age in days at which a run's offloaded result payloads (RUN_PREFIX/results/, for each of run_prefixes) are deleted by the lifecycle rule. The trainer reads each once, within a lease of seconds to minutes."

  validation {
    condition     = var.results_expire_days >= 1 && var.results_expire_days <= 365 && floor(var.results_expire_days) == var.results_expire_days
    error_message = "results_expire_days must be a whole number of days from 1 to 365."
  }
}

variable "soft_delete_retention_days" {
  type        = number
  default     = 7
  description = "Days a deleted object stays restorable (Cloud Storage soft delete; billed as storage meanwhile). 0 turns it off; 7 to 90 otherwise."

  validation {
    condition     = var.soft_delete_retention_days == 0 || (var.soft_delete_retention_days >= 7 && var.soft_delete_retention_days <= 90)
    error_message = "soft_delete_retention_days must be 0 (off) or from 7 to 90."
  }
}

variable "log_bucket" {
  type        = string
  default     = null
  description = "Name of an existing bucket for usage and storage logs (under gcs/NAME/), or null for none."
}

variable "force_destroy" {
  type        = bool
  default     = false
  description = "Let terraform destroy delete a bucket that still holds objects (every version of every run in it). Leave false outside throwaway tests."
}

variable "labels" {
  type        = map(string)
  default     = {}
  description = "Labels for the bucket."
}
