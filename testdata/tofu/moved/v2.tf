resource "terraform_data" "x" {
  input = "one"
}
resource "terraform_data" "b" {
  input = "bee"
}
moved {
  from = terraform_data.a
  to   = terraform_data.x
}
