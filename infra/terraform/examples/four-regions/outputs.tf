output "aurora_toml" {
  description = "The run's config file, as every host has it at /etc/aurora/aurora.toml: `terraform output -raw aurora_toml > aurora.toml && aurora config check aurora.toml`."
  value       = local.aurora_toml
}

output "buckets" {
  description = "Each region's bucket URI for the run (region => s3:// or gs:// URI)."
  value       = local.uris
}

output "signing_key_secret_arn" {
  description = "The Secrets Manager secret to put the trainer's private key into (aws secretsmanager put-secret-value --secret-id ARN --secret-string file://trainer.key)."
  value       = aws_secretsmanager_secret.signing_key.arn
}

output "redis_secret_arn" {
  description = "The Secrets Manager secret holding AURORA_REDIS (the rediss:// URL with AUTH)."
  value       = module.redis.secret_arn
}

output "redis_endpoint" {
  description = "The coordinator's primary endpoint (private DNS in the home VPC)."
  value       = module.redis.primary_endpoint
}

output "pools" {
  description = "Each pool's autoscaling group (AWS) or managed instance group (GCP) name."
  value = {
    trainer                      = module.trainer.autoscaling_group
    "relay-${var.aws_region_a}"  = module.relay_a.autoscaling_group
    "relay-${var.aws_region_b}"  = module.relay_b.autoscaling_group
    "relay-${var.gcp_region}"    = module.relay_gcp.instance_group_manager
    "actors-${var.aws_region_a}" = module.actors_a.autoscaling_group
    "actors-${var.aws_region_b}" = module.actors_b.autoscaling_group
    "actors-${var.gcp_region}"   = module.actors_gcp.instance_group_manager
  }
}

output "gc_role_arn" {
  description = "The AWS role for aurora gc (the only identity that deletes); on GCP, gc_service_account."
  value       = module.iam_aws.gc_role_arn
}

output "gc_service_account" {
  description = "The GCP service account for aurora gc on the GCP bucket."
  value       = module.iam_gcp.gc_email
}

output "iam_policies" {
  description = "Every AWS role's policy document (JSON), for review before apply."
  value       = module.iam_aws.policies
}
