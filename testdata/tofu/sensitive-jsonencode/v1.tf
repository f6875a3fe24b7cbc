variable "secret" {
  type      = string
  sensitive = true
  default   = "hunter<2>&v1"
}
resource "terraform_data" "s" {
  input = var.secret
}
output "doc" {
  value = nonsensitive(jsonencode({ pw = var.secret }))
}
