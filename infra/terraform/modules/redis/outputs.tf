output "secret_arn" {
  description = "ARN of the Secrets Manager secret holding the full rediss:// URL (AURORA_REDIS): give it to every pool and grant it to every role."
  value       = aws_secretsmanager_secret.redis_url.arn
}

output "kms_key_arn" {
  description = "The KMS key encrypting Redis at rest and the URL secret (readers of the secret need kms:Decrypt on it)."
  value       = local.kms_key_arn
}

output "primary_endpoint" {
  description = "The primary endpoint's DNS name (it follows failover). Resolvable inside the VPC, or through DNS forwarding from the other regions."
  value       = aws_elasticache_replication_group.this.primary_endpoint_address
}

output "port" {
  description = "The Redis port."
  value       = var.port
}

output "security_group_id" {
  description = "The security group in front of Redis."
  value       = aws_security_group.redis.id
}

output "redis_url" {
  description = "The full rediss:// URL with the AUTH token, for copying into another cloud's secret store (e.g. GCP Secret Manager for pools there). Sensitive: never pass it to user data."
  value       = local.redis_url
  sensitive   = true
}
