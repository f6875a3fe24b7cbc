# The check fails, and its message carries a secret let out with nonsensitive().
variable "token" {
  type      = string
  sensitive = true
  default   = "tok-9f8e7d6c5b"
}
resource "terraform_data" "a" {
  input = "a2"
}
resource "terraform_data" "b" {
  input = "b1"
}
check "health" {
  assert {
    condition     = terraform_data.a.input == "a1"
    error_message = "a is ${terraform_data.a.input}, token ${nonsensitive(var.token)}"
  }
}
