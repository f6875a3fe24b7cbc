variable "key" {
  type      = string
  sensitive = true
  default   = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj\nMsW4d1k2vT9pQ0aXc3Lr5eNf8yZ6hJ1u\n-----END PRIVATE KEY-----\n"
}
resource "terraform_data" "cfg" {
  input = nonsensitive(yamlencode({ name = "web", tls = { key = var.key } }))
}
