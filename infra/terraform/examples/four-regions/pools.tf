# The hosts: the trainer (home), a relay and an actor pool per rollout region. Every pool boots
# with the same rendered aurora.toml (config.tf) and fetches its secrets at each start.

locals {
  aws_secrets_reader = {
    AURORA_REDIS      = module.redis.secret_arn
    AURORA_VERIFY_KEY = aws_secretsmanager_secret.verify_key.arn
  }
  gcp_secrets_reader = {
    AURORA_REDIS      = google_secret_manager_secret.redis_url.id
    AURORA_VERIFY_KEY = google_secret_manager_secret.verify_key.id
  }
  # Redis lives in the home VPC; every pool may connect to it there.
  redis_cidrs = [var.aws_networks[var.home_region].vpc_cidr]
}

module "trainer" {
  source    = "../../modules/gpu-pool/aws"
  providers = { aws = aws.home }

  name        = "${var.name_prefix}-${var.run_id}-trainer"
  role        = "trainer"
  region_name = var.home_region
  run_id      = var.run_id
  aurora_toml = local.aurora_toml
  secrets = {
    AURORA_REDIS       = module.redis.secret_arn
    AURORA_SIGNING_KEY = aws_secretsmanager_secret.signing_key.arn
  }
  aurora_version   = var.aurora_version
  pip_index_url    = var.pip_index_url
  ami_id           = var.ami_ids[var.home_region]
  instance_types   = var.trainer.instance_types
  instance_profile = module.iam_aws.trainer_instance_profile
  vpc_id           = var.aws_networks[var.home_region].vpc_id
  subnet_ids       = [var.aws_networks[var.home_region].subnet_ids[0]]
  min_size         = var.trainer.nodes
  max_size         = var.trainer.nodes
  desired_capacity = var.trainer.nodes
  gpus_per_node    = var.trainer.gpus_per_node
  # on-demand only, in one placement group: a fixed torchrun world
  on_demand_base_capacity                  = var.trainer.nodes
  on_demand_percentage_above_base_capacity = 100
  cluster_placement                        = true
  metrics_port                             = var.metrics_port
  monitoring_cidrs                         = var.monitoring_cidrs
  redis_cidrs                              = local.redis_cidrs
  # reads the GCP region's results/ with the instance profile's identity (no Google key)
  gcp_credential_config = module.iam_gcp.aws_trainer_credential_config
}

module "relay_a" {
  source    = "../../modules/gpu-pool/aws"
  providers = { aws = aws.rollout_a }

  name                                     = "${var.name_prefix}-${var.run_id}-relay"
  role                                     = "relay"
  region_name                              = var.aws_region_a
  run_id                                   = var.run_id
  aurora_toml                              = local.aurora_toml
  secrets                                  = local.aws_secrets_reader
  aurora_version                           = var.aurora_version
  pip_index_url                            = var.pip_index_url
  ami_id                                   = var.ami_ids[var.aws_region_a]
  instance_types                           = [var.relay_instance_type]
  instance_profile                         = module.iam_aws.relay_instance_profiles[var.aws_region_a]
  vpc_id                                   = var.aws_networks[var.aws_region_a].vpc_id
  subnet_ids                               = var.aws_networks[var.aws_region_a].subnet_ids
  on_demand_percentage_above_base_capacity = 100
  metrics_port                             = var.metrics_port
  monitoring_cidrs                         = var.monitoring_cidrs
  redis_cidrs                              = local.redis_cidrs
}

module "relay_b" {
  source    = "../../modules/gpu-pool/aws"
  providers = { aws = aws.rollout_b }

  name                                     = "${var.name_prefix}-${var.run_id}-relay"
  role                                     = "relay"
  region_name                              = var.aws_region_b
  run_id                                   = var.run_id
  aurora_toml                              = local.aurora_toml
  secrets                                  = local.aws_secrets_reader
  aurora_version                           = var.aurora_version
  pip_index_url                            = var.pip_index_url
  ami_id                                   = var.ami_ids[var.aws_region_b]
  instance_types                           = [var.relay_instance_type]
  instance_profile                         = module.iam_aws.relay_instance_profiles[var.aws_region_b]
  vpc_id                                   = var.aws_networks[var.aws_region_b].vpc_id
  subnet_ids                               = var.aws_networks[var.aws_region_b].subnet_ids
  on_demand_percentage_above_base_capacity = 100
  metrics_port                             = var.metrics_port
  monitoring_cidrs                         = var.monitoring_cidrs
  redis_cidrs                              = local.redis_cidrs
}

module "actors_a" {
  source    = "../../modules/gpu-pool/aws"
  providers = { aws = aws.rollout_a }

  name                    = "${var.name_prefix}-${var.run_id}-actors"
  role                    = "actor"
  region_name             = var.aws_region_a
  run_id                  = var.run_id
  aurora_toml             = local.aurora_toml
  secrets                 = local.aws_secrets_reader
  aurora_version          = var.aurora_version
  extras                  = var.aws_actors.extras
  pip_index_url           = var.pip_index_url
  ami_id                  = var.ami_ids[var.aws_region_a]
  instance_types          = var.aws_actors.instance_types
  instance_profile        = module.iam_aws.actor_instance_profiles[var.aws_region_a]
  vpc_id                  = var.aws_networks[var.aws_region_a].vpc_id
  subnet_ids              = var.aws_networks[var.aws_region_a].subnet_ids
  min_size                = 0
  max_size                = var.aws_actors.max_size
  desired_capacity        = var.aws_actors.size
  on_demand_base_capacity = var.aws_actors.on_demand_base_capacity
  metrics_port            = var.metrics_port
  monitoring_cidrs        = var.monitoring_cidrs
  redis_cidrs             = local.redis_cidrs
}

module "actors_b" {
  source    = "../../modules/gpu-pool/aws"
  providers = { aws = aws.rollout_b }

  name                    = "${var.name_prefix}-${var.run_id}-actors"
  role                    = "actor"
  region_name             = var.aws_region_b
  run_id                  = var.run_id
  aurora_toml             = local.aurora_toml
  secrets                 = local.aws_secrets_reader
  aurora_version          = var.aurora_version
  extras                  = var.aws_actors.extras
  pip_index_url           = var.pip_index_url
  ami_id                  = var.ami_ids[var.aws_region_b]
  instance_types          = var.aws_actors.instance_types
  instance_profile        = module.iam_aws.actor_instance_profiles[var.aws_region_b]
  vpc_id                  = var.aws_networks[var.aws_region_b].vpc_id
  subnet_ids              = var.aws_networks[var.aws_region_b].subnet_ids
  min_size                = 0
  max_size                = var.aws_actors.max_size
  desired_capacity        = var.aws_actors.size
  on_demand_base_capacity = var.aws_actors.on_demand_base_capacity
  metrics_port            = var.metrics_port
  monitoring_cidrs        = var.monitoring_cidrs
  redis_cidrs             = local.redis_cidrs
}

module "relay_gcp" {
  source = "../../modules/gpu-pool/gcp"

  name                  = "${var.name_prefix}-${var.run_id}-relay"
  role                  = "relay"
  region_name           = var.gcp_region
  run_id                = var.run_id
  aurora_toml           = local.aurora_toml
  secrets               = local.gcp_secrets_reader
  aurora_version        = var.aurora_version
  pip_index_url         = var.pip_index_url
  project_id            = var.gcp_project
  region                = var.gcp_region
  machine_type          = var.gcp_relay_machine_type
  image                 = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"
  boot_disk_gb          = 30
  network               = var.gcp_network.network
  subnetwork            = var.gcp_network.subnetwork
  service_account_email = module.iam_gcp.relay_emails[var.gcp_region]
  # its source bucket is on S3: read it as the AWS role that trusts this service account
  aws_web_identity = {
    role_arn = module.iam_aws.gcp_relay_role_arns[var.gcp_region]
    region   = local.sources[var.gcp_region]
  }
  metrics_port     = var.metrics_port
  monitoring_cidrs = var.monitoring_cidrs
}

module "actors_gcp" {
  source = "../../modules/gpu-pool/gcp"

  name                  = "${var.name_prefix}-${var.run_id}-actors"
  role                  = "actor"
  region_name           = var.gcp_region
  run_id                = var.run_id
  aurora_toml           = local.aurora_toml
  secrets               = local.gcp_secrets_reader
  aurora_version        = var.aurora_version
  extras                = var.gcp_actors.extras
  pip_index_url         = var.pip_index_url
  project_id            = var.gcp_project
  region                = var.gcp_region
  zones                 = var.gcp_actors.zones
  machine_type          = var.gcp_actors.machine_type
  network               = var.gcp_network.network
  subnetwork            = var.gcp_network.subnetwork
  service_account_email = module.iam_gcp.actor_emails[var.gcp_region]
  target_size           = var.gcp_actors.size
  spot                  = var.gcp_actors.spot
  metrics_port          = var.metrics_port
  monitoring_cidrs      = var.monitoring_cidrs
}
