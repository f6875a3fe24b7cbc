resource "terraform_data" "b" {
  input = "bee"
}
