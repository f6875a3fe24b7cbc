# An update whose JSON is far over the detail bound: a 100 KB string in the input changes.
resource "terraform_data" "blob" {
  input = { blob = format("%0100000d", 2), tag = "v2" }
}
