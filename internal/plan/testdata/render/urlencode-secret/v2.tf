variable "pw" {
  type      = string
  sensitive = true
  default   = "p@ss/w0rd#1"
}
resource "terraform_data" "login" {
  input = nonsensitive("https://svc/login?pw=${urlencode(var.pw)}")
}
resource "terraform_data" "pw" {
  input = var.pw
}
