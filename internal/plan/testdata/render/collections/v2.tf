resource "terraform_data" "emptied" {
  input = []
}
resource "terraform_data" "filled" {
  input = ["x", "y"]
}
resource "terraform_data" "set" {
  input = toset(["a", "c", "d", "e"])
}
resource "terraform_data" "list" {
  input = ["one", "three", "four"]
}
resource "terraform_data" "map" {
  input = { a = "1", b = "22", c = "3" }
}
