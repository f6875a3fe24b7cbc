resource "terraform_data" "old_data_volume" {
  input = "v1"
}
resource "terraform_data" "settings" {
  input = "plain"
}
