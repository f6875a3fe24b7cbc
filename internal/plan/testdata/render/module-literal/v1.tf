resource "terraform_data" "root" {
  input = "v1"
}
