resource "terraform_data" "b" {
  input = "bee"
}
import {
  to = terraform_data.a
  id = "imported-a"
}
resource "terraform_data" "a" {
  input = "one"
}
import {
  to = terraform_data.c
  id = "imported-c"
}
resource "terraform_data" "c" {
}
