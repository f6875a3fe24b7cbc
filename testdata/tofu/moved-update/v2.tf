resource "terraform_data" "x" {
  input = "one"
}
resource "terraform_data" "c" {
  input = "sea"
}
moved {
  from = terraform_data.a
  to   = terraform_data.x
}
moved {
  from = terraform_data.b
  to   = terraform_data.c
}
