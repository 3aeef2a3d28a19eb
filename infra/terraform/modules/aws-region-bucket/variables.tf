variable "name" {
  type        = string
  description = "The bucket's name (globally unique S3 name). One bucket per region; runs live under prefixes such as runs/exp1/."

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.name)) && !can(regex("\\.\\.|^xn--|-s3alias$|--ol-s3$", var.name))
    error_message = "name must be a valid S3 bucket name: 3-63 lower-case letters, digits, '.' and '-', starting and ending with a letter or digit."
  }
}

variable "kms_key_arn" {
  type        = string
  default     = null
  description = "ARN of an existing customer-managed KMS key for SSE-KMS. Null: the module creates one key for this bucket, with rotation on."

  validation {
    condition     = var.kms_key_arn == null || can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/", var.kms_key_arn))
    error_message = "kms_key_arn must be a KMS key ARN (arn:aws:kms:REGION:ACCOUNT:key/ID), or null."
  }
}

variable "abort_incomplete_multipart_days" {
  type        = number
  default     = 3
  description = "Days after which the parts of a multipart upload that was never completed (a writer killed mid-upload) are removed."

  validation {
    condition     = var.abort_incomplete_multipart_days >= 1 && var.abort_incomplete_multipart_days <= 30 && floor(var.abort_incomplete_multipart_days) == var.abort_incomplete_multipart_days
    error_message = "abort_incomplete_multipart_days must be a whole number of days from 1 to 30."
  }
}

variable "run_prefixes" {
  type        = list(string)
  default     = []
  description = "Prefixes of the runs in this bucket (runs/RUN_ID, no slash at either end) whose offloaded result payloads (RUN_PREFIX/results/) expire after results_expire_days. Nothing else ever expires."

  validation {
    condition     = alltrue([for p in var.run_prefixes : can(regex("^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$", p)) && !can(regex("(^|/)\\.\\.?(/|$)", p))])
    error_message = "run_prefixes must be plain relative paths such as runs/exp1: no leading or trailing '/', no '.' or '..' segments, no wildcards."
  }
}

variable "results_expire_days" {
  type        = number
  default     = 1
  description = "Days after which a run's offloaded result payloads (RUN_PREFIX/results/, for each of run_prefixes) are deleted by the lifecycle rule. The trainer reads each once, within a lease of seconds to minutes."

  validation {
    condition     = var.results_expire_days >= 1 && var.results_expire_days <= 365 && floor(var.results_expire_days) == var.results_expire_days
    error_message = "results_expire_days must be a whole number of days from 1 to 365."
  }
}

variable "require_conditional_writes" {
  type        = bool
  default     = true
  description = "Deny any object creation without If-None-Match: * (put-if-absent), so that no principal can overwrite a committed object. Turn off only for tools that cannot send the header."
}

variable "access_log_bucket" {
  type        = string
  default     = null
  description = "Name of an existing bucket for S3 server access logs (under s3/NAME/), or null for none (CloudTrail data events are the usual alternative)."
}

variable "force_destroy" {
  type        = bool
  default     = false
  description = "Let terraform destroy delete a bucket that still holds objects (every version of every run in it). Leave false outside throwaway tests."
}

variable "tags" {
  type        = map(string)
  default     = {}
  description = "Tags for the bucket and its KMS key."
}
