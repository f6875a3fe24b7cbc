resource "terraform_data" "a" {
  input            = "two"
  triggers_replace = "two"
  lifecycle {
    create_before_destroy = true
  }
}
