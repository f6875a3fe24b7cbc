locals {
  config = jsondecode(file("${path.module}/../../../config/dev.json"))
}

resource "terraform_data" "web" {
  input = { image = "web:1.5.0", replicas = local.config.app_replicas, log_level = local.config.log_level }
}
