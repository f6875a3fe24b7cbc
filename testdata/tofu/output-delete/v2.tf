resource "terraform_data" "a" {
  input = "one"
}
output "b" {
  value = "bee"
}
