stack {
  name        = "dev-network"
  description = "dev network"
  id          = "dev-network"
}
