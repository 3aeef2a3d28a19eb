output "trainer_email" {
  description = "The trainer's service account email (null without a home region on Cloud Storage)."
  value       = one(google_service_account.trainer[*].email)
}

output "trainer_unique_id" {
  description = "The trainer's service account numeric unique id (null without a home region on Cloud Storage): iam-roles/aws trusts it (gcp_trainer) to read the S3 regions' results/."
  value       = one(google_service_account.trainer[*].unique_id)
}

output "aws_trainer_credential_config" {
  description = "For a trainer on AWS (aws_trainer): the Google external-account credential configuration (JSON, no secret in it) with which its hosts read the Cloud Storage regions' results/ using their instance profile (GOOGLE_APPLICATION_CREDENTIALS; gpu-pool/aws's gcp_credential_config). Null without aws_trainer."
  value = var.aws_trainer == null ? null : jsonencode({
    type               = "external_account"
    audience           = "//iam.googleapis.com/${google_iam_workload_identity_pool_provider.aws_trainer[0].name}"
    subject_token_type = "urn:ietf:params:aws:token-type:aws4_request"
    token_url          = "https://sts.googleapis.com/v1/token"
    credential_source = {
      environment_id                 = "aws1"
      region_url                     = "http://169.254.169.254/latest/meta-data/placement/availability-zone"
      url                            = "http://169.254.169.254/latest/meta-data/iam/security-credentials"
      regional_cred_verification_url = "https://sts.{region}.amazonaws.com?Action=GetCallerIdentity&Version=2011-06-15"
      imdsv2_session_token_url       = "http://169.254.169.254/latest/api/token"
    }
  })
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
