# Applied after v1 and fails: the replacement is created, then its provisioner fails, so it
# stays (tainted) and the old object is left deposed.
resource "terraform_data" "a" {
  input            = "two"
  triggers_replace = "two"
  lifecycle {
    create_before_destroy = true
  }
  provisioner "local-exec" {
    command = "exit 1"
  }
}
