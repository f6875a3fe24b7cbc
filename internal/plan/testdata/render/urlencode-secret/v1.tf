resource "terraform_data" "login" {
  input = "https://svc/login"
}
