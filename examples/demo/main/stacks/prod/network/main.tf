# terraform_data stands in for real resources: it belongs to OpenTofu's built-in provider, so
# the demo downloads no provider. State is local (terraform.tfstate, git-ignored).
resource "terraform_data" "vpc" {
  input = { cidr = "10.0.0.0/16" }
}

resource "terraform_data" "subnet_a" {
  input = { cidr = "10.0.1.0/24", zone = "a", vpc = terraform_data.vpc.id }
}
