stack {
  name        = "prod-network"
  description = "prod network"
  id          = "prod-network"
}
