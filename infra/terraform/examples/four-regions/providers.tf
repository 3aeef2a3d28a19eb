# One AWS provider per AWS region, named by the region's part in the run (home, rollout_a,
# rollout_b) rather than its name, so the regions are variables; one Google provider.

provider "aws" {
  alias  = "home"
  region = var.home_region

  default_tags {
    tags = merge(var.tags, { "aurora:run" = var.run_id })
  }
}

provider "aws" {
  alias  = "rollout_a"
  region = var.aws_region_a

  default_tags {
    tags = merge(var.tags, { "aurora:run" = var.run_id })
  }
}

provider "aws" {
  alias  = "rollout_b"
  region = var.aws_region_b

  default_tags {
    tags = merge(var.tags, { "aurora:run" = var.run_id })
  }
}

provider "google" {
  project = var.gcp_project
  region  = var.gcp_region
}
