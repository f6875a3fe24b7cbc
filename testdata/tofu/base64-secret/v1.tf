resource "terraform_data" "b" {
  input = "plain"
}
