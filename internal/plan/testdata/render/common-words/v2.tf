# Secrets equal to common words: the keys of a sensitive map (class, stack), and values that
# are words of the render itself (data, port, import, prod, delete, code, details).
variable "conf" {
  type      = map(string)
  sensitive = true
  default   = { class = "data", stack = "port" }
}
variable "words" {
  type      = list(string)
  sensitive = true
  default   = ["import", "prod", "delete", "code", "details"]
}
resource "terraform_data" "production_cache" {
  input = var.conf
}
resource "terraform_data" "settings" {
  input = var.words
}
output "class" {
  value = "destructive"
}
