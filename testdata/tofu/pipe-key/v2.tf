resource "terraform_data" "p" {
  for_each = toset(["c"])
  input    = each.key
}
