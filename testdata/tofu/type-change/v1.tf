resource "terraform_data" "list_to_null" {
  input = ["a", "b"]
}
resource "terraform_data" "object_to_string" {
  input = { k = "v", n = 1 }
}
resource "terraform_data" "string_to_object" {
  input = "s"
}
