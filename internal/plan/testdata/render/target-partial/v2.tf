# Planned with -target=terraform_data.a (plan.args): b's change is not planned.
resource "terraform_data" "a" {
  input = "a2"
}
resource "terraform_data" "b" {
  input = "b2"
}
