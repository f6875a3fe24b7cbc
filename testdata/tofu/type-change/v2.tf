resource "terraform_data" "list_to_null" {
  input = null
}
resource "terraform_data" "object_to_string" {
  input = "v1"
}
resource "terraform_data" "string_to_object" {
  input = { k = "v", l = ["x"] }
}
