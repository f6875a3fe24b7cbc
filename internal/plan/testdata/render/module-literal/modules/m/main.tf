variable "api_key" {
  type      = string
  sensitive = true
}
resource "terraform_data" "client" {
  input = nonsensitive("key=${var.api_key}")
}
