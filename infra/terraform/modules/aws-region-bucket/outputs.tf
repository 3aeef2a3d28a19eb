output "bucket" {
  description = "The bucket's name: a run in it is s3://BUCKET/runs/RUN_ID."
  value       = aws_s3_bucket.this.bucket
}

output "bucket_arn" {
  description = "The bucket's ARN, for IAM policies (the iam-roles module scopes them to the run's prefix)."
  value       = aws_s3_bucket.this.arn
}

output "kms_key_arn" {
  description = "ARN of the KMS key the bucket encrypts with: writers need kms:GenerateDataKey and kms:Decrypt on it, readers kms:Decrypt."
  value       = local.kms_key_arn
}

output "region" {
  description = "The AWS region the bucket is in (the provider's)."
  value       = data.aws_region.current.region
}
