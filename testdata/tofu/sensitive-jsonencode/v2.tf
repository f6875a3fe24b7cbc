variable "secret" {
  type      = string
  sensitive = true
  default   = "hunter<2>&v2"
}
resource "terraform_data" "s" {
  input = var.secret
}
output "doc" {
  value = nonsensitive(jsonencode({ pw = var.secret }))
}
output "twice" {
  value = nonsensitive(jsonencode(jsonencode(var.secret)))
}
