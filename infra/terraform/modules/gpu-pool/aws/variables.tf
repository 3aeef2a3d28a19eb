variable "name" {
  type        = string
  description = "Name of the pool: its autoscaling group (the trainer's hosts find each other by it), launch template prefix and security group."

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

variable "secrets" {
  type        = map(string)
  description = "Environment variable => Secrets Manager secret ARN, read at every start into /run/aurora/env: AURORA_REDIS for every role, AURORA_SIGNING_KEY for the trainer, AURORA_VERIFY_KEY for relays and actors. ARNs only, never values."

  validation {
    condition     = alltrue([for k, v in var.secrets : contains(["AURORA_REDIS", "AURORA_SIGNING_KEY", "AURORA_VERIFY_KEY"], k) && can(regex("^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:[A-Za-z0-9/_+=.@-]+$", v))])
    error_message = "secrets keys must be AURORA_REDIS, AURORA_SIGNING_KEY or AURORA_VERIFY_KEY, and values Secrets Manager secret ARNs (never secret values)."
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

variable "extras" {
  type        = list(string)
  default     = null
  description = "The package's extras to install. Null: the role's own ([trainer,s3], [relay,s3], [actor,s3]); e.g. [\"vllm\", \"s3\"] for vLLM actors. s3 is always added, and gcs too with gcp_credential_config."

  validation {
    condition     = var.extras == null ? true : alltrue([for e in var.extras : contains(["trainer", "actor", "relay", "vllm", "s3", "gcs", "audit", "embedded"], e)])
    error_message = "extras must be among trainer, actor, relay, vllm, s3, gcs, audit, embedded."
  }
}

variable "gcp_credential_config" {
  type        = string
  default     = null
  description = "A trainer whose run has Cloud Storage regions: Google's external-account credential configuration (iam-roles/gcp's aws_trainer_credential_config; JSON, no secret in it), written to /etc/aurora/gcp-credentials.json and named by GOOGLE_APPLICATION_CREDENTIALS, so the host reads those regions' results/ with its own instance profile. Adds the gcs extra. Null: none."

  validation {
    condition     = var.gcp_credential_config == null || try(jsondecode(var.gcp_credential_config).type, "") == "external_account"
    error_message = "gcp_credential_config must be the JSON of an external_account credential configuration (never a service account key)."
  }
}

variable "pip_index_url" {
  type        = string
  default     = null
  description = "A package index to install from instead of PyPI (e.g. a private mirror), or null."
}

variable "ami_id" {
  type        = string
  description = "The image: an Ubuntu-based image with cloud-init and python3 (for GPU roles, with the NVIDIA driver, e.g. a Deep Learning Base AMI). AMIs are regional."
}

variable "instance_types" {
  type        = list(string)
  description = "Instance types the group may launch, in order of preference (several spread spot risk). A relay: one CPU type."

  validation {
    condition     = length(var.instance_types) >= 1 && length(var.instance_types) <= 20
    error_message = "give 1 to 20 instance types."
  }
}

variable "instance_profile" {
  type        = string
  description = "The instance profile of the role (from iam-roles/aws): it is the hosts' only credential, for buckets and secrets alike."
}

variable "vpc_id" {
  type        = string
  description = "The VPC of the pool's security group."
}

variable "subnet_ids" {
  type        = list(string)
  description = "Private subnets to launch in. A trainer: one subnet (one availability zone), for bandwidth between its nodes."

  validation {
    condition     = length(var.subnet_ids) >= 1
    error_message = "give at least one subnet."
  }
}

variable "min_size" {
  type        = number
  default     = 1
  description = "Fewest instances. A trainer: equal to max_size and desired_capacity (a fixed torchrun world)."
}

variable "max_size" {
  type        = number
  default     = 1
  description = "Most instances."
}

variable "desired_capacity" {
  type        = number
  default     = 1
  description = "Instances to run. A trainer: its number of nodes (torchrun --nnodes)."
}

variable "on_demand_base_capacity" {
  type        = number
  default     = 0
  description = "Instances that are always on-demand; capacity above it follows on_demand_percentage_above_base_capacity."

  validation {
    condition     = var.on_demand_base_capacity >= 0
    error_message = "on_demand_base_capacity must be 0 or more."
  }
}

variable "on_demand_percentage_above_base_capacity" {
  type        = number
  default     = 0
  description = "Percent of the capacity above the base that is on-demand (the rest is spot). 0 suits actors (a reclaimed actor's leases just expire); 100 suits the trainer and relays."

  validation {
    condition     = var.on_demand_percentage_above_base_capacity >= 0 && var.on_demand_percentage_above_base_capacity <= 100
    error_message = "on_demand_percentage_above_base_capacity must be from 0 to 100."
  }
}

variable "spot_allocation_strategy" {
  type        = string
  default     = "price-capacity-optimized"
  description = "How spot capacity is chosen among instance_types."

  validation {
    condition     = contains(["price-capacity-optimized", "capacity-optimized", "capacity-optimized-prioritized", "lowest-price"], var.spot_allocation_strategy)
    error_message = "spot_allocation_strategy must be price-capacity-optimized, capacity-optimized, capacity-optimized-prioritized or lowest-price."
  }
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
  description = "Trainer only: how long a node waits for all desired_capacity nodes to run before its start fails (and systemd retries)."
}

variable "cluster_placement" {
  type        = bool
  default     = false
  description = "Launch into a cluster placement group (the trainer: lowest latency, highest bandwidth between nodes)."
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

variable "redis_cidrs" {
  type        = list(string)
  description = "CIDRs of the coordinator (Redis) the hosts connect to on redis_port."

  validation {
    condition     = length(var.redis_cidrs) > 0 && alltrue([for c in var.redis_cidrs : can(cidrnetmask(c))])
    error_message = "redis_cidrs must be one or more IPv4 CIDRs."
  }
}

variable "redis_port" {
  type        = number
  default     = 6379
  description = "The coordinator's port."
}

variable "egress_cidrs" {
  type        = list(string)
  default     = ["0.0.0.0/0"]
  description = "Where HTTPS may go: S3, Secrets Manager, STS, the package index (narrow it to VPC endpoint and proxy CIDRs where you have them)."
}

variable "allow_http_egress" {
  type        = bool
  default     = true
  description = "Also allow port 80 to egress_cidrs (Ubuntu's package mirrors, for cloud-init's python3-venv); off when the image already has it or a proxy serves it."
}

variable "root_volume_gb" {
  type        = number
  default     = 200
  description = "Root volume size (GiB): the venv, the model, vLLM's caches."

  validation {
    condition     = var.root_volume_gb >= 20
    error_message = "root_volume_gb must be at least 20."
  }
}

variable "root_device_name" {
  type        = string
  default     = "/dev/sda1"
  description = "The image's root device (/dev/sda1 on Ubuntu AMIs, /dev/xvda on Amazon Linux)."
}

variable "ebs_kms_key_arn" {
  type        = string
  default     = null
  description = "KMS key for the (always encrypted) root volume; null: the account's default EBS key."
}

variable "tags" {
  type        = map(string)
  default     = {}
  description = "Tags for the group, its instances and volumes."
}
