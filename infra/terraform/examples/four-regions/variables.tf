variable "run_id" {
  type        = string
  description = "The run's name (run_id in aurora.toml, the Redis key prefix, torchrun's --rdzv-id); the run lives under runs/RUN_ID/ in every bucket, and this example names the run's cloud resources after it."

  validation {
    condition     = can(regex("^[a-z0-9]([a-z0-9-]{0,22}[a-z0-9])?$", var.run_id)) && !strcontains(var.run_id, "--")
    error_message = "run_id must be 1-24 lower-case letters, digits and single '-', starting and ending with a letter or digit (it names the run's Redis, roles and pools)."
  }
}

variable "name_prefix" {
  type        = string
  description = "Short prefix of every name (buckets NAME_PREFIX-REGION, roles, pools, secrets), e.g. acme-aur. Bucket names are global: make it yours."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,10}[a-z0-9]$", var.name_prefix))
    error_message = "name_prefix must be 3-12 lower-case letters, digits and '-', starting with a letter."
  }
}

variable "home_region" {
  type        = string
  default     = "us-east-1"
  description = "The home region (AWS): the trainer, Redis and the secrets. Also its AuroraRL region name."
}

variable "aws_region_a" {
  type        = string
  default     = "eu-west-1"
  description = "The first AWS rollout region: a bucket, a relay and an actor pool."
}

variable "aws_region_b" {
  type        = string
  default     = "us-west-2"
  description = "The second AWS rollout region: a bucket, a relay and an actor pool."
}

variable "gcp_region" {
  type        = string
  default     = "europe-west4"
  description = "The Google Cloud rollout region: a bucket, a relay and an actor pool."
}

variable "gcp_project" {
  type        = string
  description = "The Google Cloud project of the GCP region."
}

variable "relay_sources" {
  type        = map(string)
  default     = {}
  description = "Region => the region its relay copies from (two-tier fan-out); regions not listed copy from home_region. An AWS region's source must be on AWS."
}

variable "aws_networks" {
  type = map(object({
    vpc_id     = string
    vpc_cidr   = string
    subnet_ids = list(string)
  }))
  description = "Per AWS region (home_region, aws_region_a, aws_region_b): the VPC, its CIDR and private subnets (with a NAT gateway or VPC endpoints for S3, Secrets Manager and STS). The trainer uses the home region's first subnet."
}

variable "gcp_network" {
  type = object({
    network    = string
    subnetwork = string
    cidr       = string
  })
  description = "The GCP region's VPC network, subnetwork (self links; with Cloud NAT) and the subnetwork's CIDR."
}

variable "monitoring_cidrs" {
  type        = list(string)
  default     = []
  description = "CIDRs of your Prometheus, allowed to scrape every role's metrics port."
}

variable "metrics_port" {
  type        = number
  default     = 9400
  description = "Every role's Prometheus metrics port (--metrics-port)."
}

variable "aurora_version" {
  type        = string
  description = "The AuroraRL release every host installs (pip, exact version)."
}

variable "pip_index_url" {
  type        = string
  default     = null
  description = "A package index to install from instead of PyPI, or null."
}

variable "verify_key_pem" {
  type        = string
  description = "The trainer's Ed25519 PUBLIC key (PEM, from `aurora keygen`): stored as AURORA_VERIFY_KEY for relays and actors. The private key never passes through Terraform: put it into the signing-key secret yourself (see README)."

  validation {
    condition     = can(regex("^-----BEGIN PUBLIC KEY-----", trimspace(var.verify_key_pem))) && !can(regex("PRIVATE KEY", var.verify_key_pem))
    error_message = "verify_key_pem must be a PEM public key (-----BEGIN PUBLIC KEY-----), never the private key."
  }
}

variable "ami_ids" {
  type        = map(string)
  description = "Per AWS region: the image for its pools (Ubuntu with cloud-init; the NVIDIA driver for GPU pools, e.g. a Deep Learning Base AMI). AMIs are regional."
}

variable "trainer" {
  type = object({
    nodes          = optional(number, 2)
    instance_types = optional(list(string), ["p5.48xlarge"])
    gpus_per_node  = optional(number, 8)
  })
  default     = {}
  description = "The trainer pool (home region, on-demand, one subnet, cluster placement): node count, instance types and GPUs per node."
}

variable "relay_instance_type" {
  type        = string
  default     = "m7i.xlarge"
  description = "The relays' instance type on AWS (CPU only: relays copy bytes)."
}

variable "gcp_relay_machine_type" {
  type        = string
  default     = "n2-standard-4"
  description = "The GCP relay's machine type (CPU only)."
}

variable "aws_actors" {
  type = object({
    instance_types          = optional(list(string), ["g6e.12xlarge", "g6e.24xlarge", "g5.12xlarge"])
    size                    = optional(number, 4)
    max_size                = optional(number, 16)
    on_demand_base_capacity = optional(number, 0)
    extras                  = optional(list(string), ["vllm", "s3"])
  })
  default     = {}
  description = "The AWS actor pools (the same in both AWS rollout regions): instance types, size, on-demand base (the rest is spot), pip extras."
}

variable "gcp_actors" {
  type = object({
    machine_type = optional(string, "g2-standard-48")
    size         = optional(number, 4)
    spot         = optional(bool, true)
    zones        = optional(list(string))
    extras       = optional(list(string), ["vllm", "gcs"])
  })
  default     = {}
  description = "The GCP actor pool: machine type (with GPUs built in, e.g. g2 or a3), size, Spot VMs, zones, pip extras."
}

variable "run" {
  type = object({
    steps             = optional(number, 1000)
    model             = optional(string, "/opt/models/Qwen3-8B")
    data              = optional(string, "/opt/data/train.jsonl")
    data_format       = optional(string, "gsm8k")
    reward            = optional(string, "math")
    prompts           = optional(number, 256)
    full_every        = optional(number, 10)
    lease_s           = optional(number, 60)
    actor_engine      = optional(string, "vllm")
    relay_concurrency = optional(number, 16)
  })
  default     = {}
  description = "The run's settings rendered into aurora.toml ([trainer] steps, [model], [data], [reward], [rollout] prompts, [publish] full_every, [schedule] lease_s, [actor] engine, [relay] concurrency). model and data are paths on the hosts (bake them into the image) or hub ids."
}

variable "actor_batch" {
  type        = map(number)
  default     = {}
  description = "Region => [regions.REGION.actor] batch override (e.g. a region with smaller GPUs)."
}

variable "force_destroy_buckets" {
  type        = bool
  default     = false
  description = "Let terraform destroy delete buckets that still hold versions (throwaway test deployments only)."
}

variable "tags" {
  type        = map(string)
  default     = {}
  description = "Tags (AWS) for every resource, through the providers' default_tags."
}
