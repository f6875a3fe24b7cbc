resource "terraform_data" "a" {
  input = "a1"
}
resource "terraform_data" "b" {
  input = "b1"
}
