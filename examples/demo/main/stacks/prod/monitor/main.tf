resource "terraform_data" "dashboard" {
  input = { panels = ["latency", "errors", "saturation"] }
}
