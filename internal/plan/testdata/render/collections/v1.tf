resource "terraform_data" "emptied" {
  input = ["a", "b"]
}
resource "terraform_data" "filled" {
  input = []
}
resource "terraform_data" "set" {
  input = toset(["a", "b", "c", "d"])
}
resource "terraform_data" "list" {
  input = ["one", "two", "three"]
}
resource "terraform_data" "map" {
  input = { a = "1", b = "2", d = "4" }
}
