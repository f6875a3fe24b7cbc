resource "terraform_data" "a" {
  input = "one"
}
resource "terraform_data" "b" {
  input = "bee"
}
