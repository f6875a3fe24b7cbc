resource "terraform_data" "cfg" {
  input = "none"
}
