resource "terraform_data" "primary" {
  input = { engine = "postgres", version = "16", tier = "db-small" }
}

resource "terraform_data" "backups" {
  input = { retention_days = 14 }
}
