output "autoscaling_group" {
  description = "Name of the pool's autoscaling group (scale actor pools by its desired capacity)."
  value       = aws_autoscaling_group.pool.name
}

output "launch_template_id" {
  description = "ID of the pool's launch template."
  value       = aws_launch_template.pool.id
}

output "security_group_id" {
  description = "ID of the pool's security group (add it to the coordinator's allowed sources, or allow its subnets' CIDRs)."
  value       = aws_security_group.pool.id
}

output "cloud_init" {
  description = "The rendered cloud-config the hosts boot with (no secret in it: secrets are fetched at start), for review."
  value       = local.cloud_init
}

output "exec_start" {
  description = "The command line the role's systemd unit runs."
  value       = local.exec_start[var.role]
}
