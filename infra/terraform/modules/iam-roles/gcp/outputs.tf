output "trainer_email" {
  description = "The trainer's service account email (null without a home region on Cloud Storage)."
  value       = one(google_service_account.trainer[*].email)
}

output "relay_emails" {
  description = "Each Google Cloud relay's service account email, keyed by the region it writes."
  value       = { for k, sa in google_service_account.relay : k => sa.email }
}

output "relay_unique_ids" {
  description = "Each relay service account's numeric unique id, keyed by region: iam-roles/aws trusts it (gcp_relays) when the relay's source is on S3."
  value       = { for k, sa in google_service_account.relay : k => sa.unique_id }
}

output "actor_emails" {
  description = "Each region's actor service account email, keyed by region."
  value       = { for k, sa in google_service_account.actor : k => sa.email }
}

output "gc_email" {
  description = "The retention (aurora gc) service account email, the only one that may delete."
  value       = google_service_account.gc.email
}
