resource "terraform_data" "a" {
  triggers_replace = ["v2"]
  lifecycle {
    destroy = false
  }
}
resource "terraform_data" "b" {
  triggers_replace = ["v2"]
  lifecycle {
    destroy               = false
    create_before_destroy = true
  }
}
