resource "terraform_data" "a" {
  input = "one"
}
output "a" {
  value = terraform_data.a.output
}
output "b" {
  value = "bee"
}
