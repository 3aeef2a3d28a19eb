# The run's config file, rendered once: every pool boots with it, and it is an output for
# `aurora config check`. String values are jsonencode'd (a JSON string is a valid TOML basic
# string), so a quote or backslash in a path cannot break the file.

locals {
  uris = {
    (var.home_region)  = "s3://${module.bucket_home.bucket}/${local.run_prefix}"
    (var.aws_region_a) = "s3://${module.bucket_a.bucket}/${local.run_prefix}"
    (var.aws_region_b) = "s3://${module.bucket_b.bucket}/${local.run_prefix}"
    (var.gcp_region)   = "gs://${module.bucket_gcp.bucket}/${local.run_prefix}"
  }
  s3_regions = [var.home_region, var.aws_region_a, var.aws_region_b]

  # One entry per region, in a fixed order; the optional keys are lists of zero or one value,
  # so the template needs nothing but `for` over them.
  config_regions = [
    for r in local.all_regions : {
      name        = r
      uri         = jsonencode(local.uris[r])
      source      = r == var.home_region ? [] : [jsonencode(local.sources[r])]
      s3_region   = contains(local.s3_regions, r) ? [jsonencode(r)] : []
      actor_batch = contains(keys(var.actor_batch), r) ? [var.actor_batch[r]] : []
    }
  ]

  aurora_toml = templatefile("${path.module}/aurora.toml.tftpl", {
    run_id            = jsonencode(var.run_id)
    home              = jsonencode(var.home_region)
    regions           = local.config_regions
    steps             = var.run.steps
    model             = jsonencode(var.run.model)
    data              = jsonencode(var.run.data)
    data_format       = jsonencode(var.run.data_format)
    reward            = jsonencode(var.run.reward)
    prompts           = var.run.prompts
    full_every        = var.run.full_every
    lease_s           = floor(var.run.lease_s) == var.run.lease_s ? format("%.1f", var.run.lease_s) : tostring(var.run.lease_s)
    actor_engine      = jsonencode(var.run.actor_engine)
    relay_concurrency = var.run.relay_concurrency
  })
}

check "region_names_are_toml_bare_keys" {
  assert {
    condition     = alltrue([for r in local.all_regions : can(regex("^[A-Za-z0-9_-]+$", r))])
    error_message = "region names must be TOML bare keys (letters, digits, '-' and '_')."
  }
}
