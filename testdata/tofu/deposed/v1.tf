resource "terraform_data" "a" {
  input = "one"
  lifecycle {
    create_before_destroy = true
  }
}
