resource "terraform_data" "blob" {
  input = { blob = format("%0100000d", 1), tag = "v1" }
}
