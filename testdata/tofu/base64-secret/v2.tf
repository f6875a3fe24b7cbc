variable "pw" {
  type      = string
  sensitive = true
  default   = "correct-horse-battery"
}
resource "terraform_data" "s" {
  input = var.pw
}
# The base64 of the secret at each of the three byte alignments: the secret starts 0, 1 and 2
# bytes into the encoded text.
resource "terraform_data" "b" {
  input = nonsensitive(base64encode(var.pw))
}
output "basic_auth" {
  value = nonsensitive(base64encode(":${var.pw}"))
}
output "user_auth" {
  value = nonsensitive(base64encode("u:${var.pw}"))
}
