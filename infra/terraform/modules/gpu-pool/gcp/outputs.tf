output "instance_group_manager" {
  description = "Name of the pool's regional managed instance group (scale actor pools by its target size)."
  value       = google_compute_region_instance_group_manager.pool.name
}

output "instance_template" {
  description = "Self link of the pool's current instance template."
  value       = google_compute_instance_template.pool.self_link_unique
}

output "network_tag" {
  description = "The network tag on every instance (for extra firewall rules)."
  value       = local.network_tag
}

output "cloud_init" {
  description = "The rendered cloud-config the hosts boot with (no secret in it: secrets are fetched at start), for review."
  value       = local.cloud_init
}

output "exec_start" {
  description = "The command line the role's systemd unit runs."
  value       = local.exec_start[var.role]
}
