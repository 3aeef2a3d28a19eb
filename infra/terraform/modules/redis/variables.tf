variable "name" {
  type        = string
  description = "Name of the replication group, its subnet, parameter and security groups, and prefix of its secret (NAME/redis-url)."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,38}[a-z0-9]$", var.name)) && !can(regex("--", var.name))
    error_message = "name must be 2-40 lower-case letters, digits and single hyphens, starting with a letter (an ElastiCache replication group id)."
  }
}

variable "vpc_id" {
  type        = string
  description = "The home region's VPC."
}

variable "subnet_ids" {
  type        = list(string)
  description = "Private subnets in at least two availability zones (the primary and its replica go to different zones)."

  validation {
    condition     = length(var.subnet_ids) >= 2
    error_message = "give at least two subnets, in different availability zones, for Multi-AZ failover."
  }
}

variable "allowed_cidrs" {
  type        = list(string)
  description = "CIDRs that may reach Redis on its port: every pool's network, this region's and the other regions' (over VPC peering, a transit gateway or a VPN)."

  validation {
    condition     = length(var.allowed_cidrs) > 0 && alltrue([for c in var.allowed_cidrs : can(cidrnetmask(c)) && c != "0.0.0.0/0"])
    error_message = "allowed_cidrs must be IPv4 CIDRs, and not 0.0.0.0/0."
  }
}

variable "engine" {
  type        = string
  default     = "redis"
  description = "ElastiCache engine: redis (Redis OSS) or valkey."

  validation {
    condition     = contains(["redis", "valkey"], var.engine)
    error_message = "engine must be redis or valkey."
  }
}

variable "engine_version" {
  type        = string
  default     = "7.1"
  description = "Engine version (e.g. 7.1 for redis, 8.0 for valkey); must match parameter_group_family."
}

variable "parameter_group_family" {
  type        = string
  default     = "redis7"
  description = "Parameter group family of the engine version (redis7, valkey7, valkey8)."
}

variable "node_type" {
  type        = string
  default     = "cache.r7g.large"
  description = "Node type. Redis holds coordination only (leases, announcements, results), so a small memory-optimized node serves large runs."
}

variable "port" {
  type        = number
  default     = 6379
  description = "The port Redis listens on."
}

variable "database" {
  type        = number
  default     = 0
  description = "Database number in the URL (rediss://:TOKEN@HOST:PORT/DB)."
}

variable "kms_key_arn" {
  type        = string
  default     = null
  description = "Customer-managed KMS key for encryption at rest and for the URL secret. Null: the module creates one, with rotation on."
}

variable "snapshot_retention_days" {
  type        = number
  default     = 7
  description = "Days of daily snapshots to keep (1-35). Redis can be rebuilt from the buckets, but a snapshot keeps admitted-result bookkeeping across a total loss."

  validation {
    condition     = var.snapshot_retention_days >= 1 && var.snapshot_retention_days <= 35
    error_message = "snapshot_retention_days must be from 1 to 35."
  }
}

variable "snapshot_window" {
  type        = string
  default     = "03:00-05:00"
  description = "Daily UTC window for snapshots (hh24:mi-hh24:mi)."
}

variable "maintenance_window" {
  type        = string
  default     = "sun:05:00-sun:07:00"
  description = "Weekly UTC maintenance window (ddd:hh24:mi-ddd:hh24:mi); must not overlap snapshot_window."
}

variable "secret_recovery_window_days" {
  type        = number
  default     = 7
  description = "Days a deleted URL secret stays recoverable (0 deletes it at once; 7-30 otherwise)."

  validation {
    condition     = var.secret_recovery_window_days == 0 || (var.secret_recovery_window_days >= 7 && var.secret_recovery_window_days <= 30)
    error_message = "secret_recovery_window_days must be 0 or from 7 to 30."
  }
}

variable "tags" {
  type        = map(string)
  default     = {}
  description = "Tags for every resource."
}
