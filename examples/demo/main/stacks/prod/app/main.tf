resource "terraform_data" "web" {
  input = { image = "web:1.4.0", replicas = 3 }
}

resource "terraform_data" "worker" {
  input            = { image = "worker:1.4.0" }
  triggers_replace = ["queue-v1"]
}

resource "terraform_data" "legacy_cron" {
  input = { schedule = "0 * * * *", command = "cleanup" }
}
