terraform {
  required_providers {
    simple = {
      source = "tfstackplan.test/test/simple"
    }
  }
}
resource "simple_resource" "deleted" {
  value = "deleted-outside"
}
resource "simple_resource" "changed" {
  value = "changed-outside"
}
resource "simple_resource" "same" {
  value = "left-alone"
}
