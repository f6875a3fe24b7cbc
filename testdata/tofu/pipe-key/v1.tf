resource "terraform_data" "p" {
  for_each = toset(["a|b", "c"])
  input    = each.key
}
