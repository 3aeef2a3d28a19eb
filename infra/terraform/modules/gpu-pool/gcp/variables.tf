variable "name" {
  type        = string
  description = "Name of the pool: its managed instance group (the trainer's hosts find each other by it), instance template prefix, network tag and firewall rules."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,46}[a-z0-9]$", var.name))
    error_message = "name must be 3-48 lower-case letters, digits and '-', starting with a letter."
  }
}

variable "role" {
  type        = string
  description = "The AuroraRL role the hosts run: trainer (torchrun over all nodes), relay (CPU, usually one host) or actor."

  validation {
    condition     = contains(["trainer", "relay", "actor"], var.role)
    error_message = "role must be trainer, relay or actor."
  }
}

variable "region_name" {
  type        = string
  description = "The AuroraRL region the hosts serve (a key of [regions] in aurora.toml), passed as --region to relays and actors."

  validation {
    condition     = can(regex("^[A-Za-z0-9_-]+$", var.region_name))
    error_message = "region_name must be a TOML bare key: letters, digits, '-' and '_'."
  }
}

variable "run_id" {
  type        = string
  description = "The run's id (run_id in aurora.toml); the trainer's torchrun uses it as --rdzv-id."

  validation {
    condition     = can(regex("^[A-Za-z0-9_.:-]{1,64}$", var.run_id))
    error_message = "run_id must be 1-64 letters, digits and _ . : - (no spaces, '|' or braces)."
  }
}

variable "aurora_toml" {
  type        = string
  description = "The run's rendered config file, written to /etc/aurora/aurora.toml. Non-secret by construction: Redis credentials and keys come from the secret store at start."

  validation {
    condition     = !can(regex("(?i)rediss?://[^/\\s\"]*:[^@/\\s\"]+@|-----BEGIN [A-Z ]*PRIVATE KEY-----", var.aurora_toml))
    error_message = "aurora_toml must not hold credentials: no Redis URL with a password, no private key (they reach the hosts through secrets)."
  }
}

variable "aurora_version" {
  type        = string
  description = "The AuroraRL release to pip install (an exact version, so every host of a run runs the same code)."

  validation {
    condition     = can(regex("^[0-9]+(\\.[0-9]+)*([a-z]+[0-9]*)?(\\.post[0-9]+)?(\\.dev[0-9]+)?$", var.aurora_version))
    error_message = "aurora_version must be an exact PEP 440 release such as 0.1.0."
  }
}

variable "aurora_package" {
  type        = string
  default     = "aurora-rl"
  description = "The distribution to install (aurora-rl, or a fork's name on your index)."

  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9._-]*$", var.aurora_package))
    error_message = "aurora_package must be a plain distribution name."
  }
}

variable "pip_index_url" {
  type        = string
  default     = null
  description = "A package index to install from instead of PyPI (e.g. a private mirror), or null."
}

variable "gpus_per_node" {
  type        = number
  default     = 8
  description = "Trainer only: processes per node (torchrun --nproc-per-node), one per GPU."

  validation {
    condition     = var.gpus_per_node >= 1 && var.gpus_per_node <= 64
    error_message = "gpus_per_node must be from 1 to 64."
  }
}

variable "rendezvous_port" {
  type        = number
  default     = 29400
  description = "Trainer only: the c10d rendezvous port on the lowest-IP node."
}

variable "rendezvous_timeout_s" {
  type        = number
  default     = 900
  description = "Trainer only: how long a node waits for all target_size nodes to run before its start fails (and systemd retries)."
}

variable "metrics_port" {
  type        = number
  default     = 9400
  description = "Port of the role's Prometheus metrics (--metrics-port); a trainer serves one per rank, metrics_port to metrics_port + gpus_per_node - 1."

  validation {
    condition     = var.metrics_port >= 1024 && var.metrics_port <= 65535
    error_message = "metrics_port must be from 1024 to 65535."
  }
}

variable "monitoring_cidrs" {
  type        = list(string)
  default     = []
  description = "CIDRs allowed to scrape metrics_port (your Prometheus)."

  validation {
    condition     = alltrue([for c in var.monitoring_cidrs : can(cidrnetmask(c)) && c != "0.0.0.0/0"])
    error_message = "monitoring_cidrs must be IPv4 CIDRs, and not 0.0.0.0/0."
  }
}

variable "secrets" {
  type        = map(string)
  description = "Environment variable => Secret Manager secret id (projects/P/secrets/NAME; its latest version is read), fetched at every start into /run/aurora/env: AURORA_REDIS for every role, AURORA_SIGNING_KEY for the trainer, AURORA_VERIFY_KEY for relays and actors. Ids only, never values."

  validation {
    condition     = alltrue([for k, v in var.secrets : contains(["AURORA_REDIS", "AURORA_SIGNING_KEY", "AURORA_VERIFY_KEY"], k) && can(regex("^projects/[^/]+/secrets/[A-Za-z0-9_-]+$", v))])
    error_message = "secrets keys must be AURORA_REDIS, AURORA_SIGNING_KEY or AURORA_VERIFY_KEY, and values Secret Manager secret ids (never secret values)."
  }
}

variable "extras" {
  type        = list(string)
  default     = null
  description = "The package's extras to install. Null: the role's own ([trainer,gcs], [relay,gcs], [actor,gcs]); e.g. [\"vllm\", \"gcs\"] for vLLM actors. gcs is always added, and s3 too for a host given aws_web_identity."

  validation {
    condition     = var.extras == null ? true : alltrue([for e in var.extras : contains(["trainer", "actor", "relay", "vllm", "s3", "gcs", "audit", "embedded"], e)])
    error_message = "extras must be among trainer, actor, relay, vllm, s3, gcs, audit, embedded."
  }
}

variable "project_id" {
  type        = string
  description = "The Google Cloud project of the pool."
}

variable "region" {
  type        = string
  description = "The Compute Engine region of the regional managed instance group (e.g. europe-west4)."
}

variable "zones" {
  type        = list(string)
  default     = null
  description = "Zones the group may use (null: all of the region's). A trainer: exactly one zone, for bandwidth between its nodes."
}

variable "machine_type" {
  type        = string
  description = "Machine type (e.g. a3-highgpu-8g or g2-standard-48 for GPUs with them built in; n2-standard-4 for a relay)."
}

variable "accelerator_type" {
  type        = string
  default     = null
  description = "GPU type to attach to machine types without built-in GPUs (e.g. nvidia-tesla-t4 on n1), or null."
}

variable "accelerator_count" {
  type        = number
  default     = 0
  description = "GPUs of accelerator_type per instance (0: none attached)."
}

variable "image" {
  type        = string
  default     = "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accelerator-2204-amd64-with-nvidia-550"
  description = "Boot image; it must run cloud-init from the user-data metadata key (Ubuntu images do; Container-Optimized OS and Deep Learning VM images do not)."
}

variable "boot_disk_gb" {
  type        = number
  default     = 200
  description = "Boot disk size (GB): the venv, the model, vLLM's caches."
}

variable "boot_disk_type" {
  type        = string
  default     = "pd-balanced"
  description = "Boot disk type (pd-balanced, pd-ssd, hyperdisk-balanced...)."
}

variable "boot_disk_kms_key" {
  type        = string
  default     = null
  description = "Cloud KMS key (self link) for the boot disk (CMEK); null: Google-managed encryption."
}

variable "network" {
  type        = string
  description = "The VPC network (self link or name) of the pool's firewall rules."
}

variable "subnetwork" {
  type        = string
  description = "The subnetwork (self link) to launch in. Hosts get no public IP: give the subnet Cloud NAT (or Private Google Access plus a package mirror)."
}

variable "service_account_email" {
  type        = string
  description = "The role's service account (from iam-roles/gcp): the hosts' only credential, for buckets and secrets alike."
}

variable "target_size" {
  type        = number
  default     = 1
  description = "Instances to run. A trainer: its number of nodes (torchrun --nnodes)."

  validation {
    condition     = var.target_size >= 0
    error_message = "target_size must be 0 or more."
  }
}

variable "spot" {
  type        = bool
  default     = false
  description = "Spot VMs (preemptible: deleted when reclaimed, and the group recreates them). Good for actors, whose leases simply expire; not for the trainer."
}

variable "secure_boot" {
  type        = bool
  default     = true
  description = "Shielded VM Secure Boot (vTPM and integrity monitoring are always on). Needs signed GPU drivers, as Ubuntu's accelerator images ship."
}

variable "aws_web_identity" {
  type = object({
    role_arn = string
    region   = string
  })
  default     = null
  description = "A host that reads S3 — a relay whose source bucket is on S3 (iam-roles/aws gcp_relay_role_arns), or a trainer reading the S3 regions' results/ (gcp_trainer_role_arn): the AWS role it assumes with its Google identity token, and an AWS region for STS. No AWS keys anywhere."
}

variable "create_firewall_rules" {
  type        = bool
  default     = true
  description = "Create the pool's ingress rules (metrics from monitoring_cidrs; the trainer's nodes to each other) on network."
}

variable "labels" {
  type        = map(string)
  default     = {}
  description = "Labels for the instances and their template."
}
