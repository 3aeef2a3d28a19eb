output "trainer_instance_profile" {
  description = "Name of the trainer's instance profile (null when home_region is null)."
  value       = one(aws_iam_instance_profile.trainer[*].name)
}

output "trainer_role_arn" {
  description = "ARN of the trainer's role (null when home_region is null)."
  value       = one(aws_iam_role.trainer[*].arn)
}

output "relay_instance_profiles" {
  description = "Instance profile name of each AWS-hosted relay, keyed by the region it writes."
  value       = { for k, p in aws_iam_instance_profile.relay : k => p.name }
}

output "actor_instance_profiles" {
  description = "Instance profile name of each region's AWS actor pool, keyed by region."
  value       = { for k, p in aws_iam_instance_profile.actor : k => p.name }
}

output "gcp_relay_role_arns" {
  description = "ARN of the role each Google Cloud relay assumes with its identity token to read its S3 source, keyed by the region it writes."
  value       = { for k, r in aws_iam_role.gcp_relay : k => r.arn }
}

output "gcp_trainer_role_arn" {
  description = "ARN of the role a trainer on Google Cloud assumes with its identity token to read the S3 regions' results/ (null without gcp_trainer)."
  value       = one(aws_iam_role.gcp_trainer[*].arn)
}

output "trainer_role_name" {
  description = "Name of the trainer's role (null when home_region is null): iam-roles/gcp's aws_trainer lets it read Cloud Storage regions' results/."
  value       = one(aws_iam_role.trainer[*].name)
}

output "gc_role_arn" {
  description = "ARN of the retention role (aurora gc), the only one that may delete."
  value       = aws_iam_role.gc.arn
}

output "gc_instance_profile" {
  description = "Name of the retention role's instance profile, for a host that runs aurora gc on a schedule."
  value       = aws_iam_instance_profile.gc.name
}

output "policies" {
  description = "Every role's policy document (JSON), keyed trainer, relay-REGION, actor-REGION, gcp-relay-REGION, gcp-trainer and gc-REGION: what each role may do, for review."
  value = merge(
    { for d in data.aws_iam_policy_document.trainer : "trainer" => d.json },
    { for k, d in data.aws_iam_policy_document.relay : "relay-${k}" => d.json },
    { for k, d in data.aws_iam_policy_document.actor : "actor-${k}" => d.json },
    { for k, d in data.aws_iam_policy_document.gcp_relay : "gcp-relay-${k}" => d.json },
    { for d in data.aws_iam_policy_document.gcp_trainer : "gcp-trainer" => d.json },
    { for k, d in data.aws_iam_policy_document.gc : "gc-${k}" => d.json },
  )
}
