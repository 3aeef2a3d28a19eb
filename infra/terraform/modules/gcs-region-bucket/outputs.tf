output "bucket" {
  description = "The bucket's name: a run in it is gs://BUCKET/runs/RUN_ID."
  value       = google_storage_bucket.this.name
}

output "url" {
  description = "The bucket's gs:// URL."
  value       = google_storage_bucket.this.url
}

output "location" {
  description = "The bucket's location (region), as Cloud Storage reports it."
  value       = google_storage_bucket.this.location
}
